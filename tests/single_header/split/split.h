// The split build's own interface (see sender.cc).
#ifndef ARC_V3_TESTS_SINGLE_HEADER_SPLIT_H_
#define ARC_V3_TESTS_SINGLE_HEADER_SPLIT_H_

#include <cstdint>
#include <vector>

#include "../third_party/arc_v3/arc_v3.hpp"

arc_v3::Status Send(const std::vector<uint16_t>& prev, const std::vector<uint16_t>& next,
                    arc_v3::Session* session, arc_v3::Delta* stateless, arc_v3::Delta* step);
arc_v3::Status Receive(const std::vector<uint16_t>& prev, const arc_v3::Delta& stateless,
                       const arc_v3::Delta& step, arc_v3::Session* session,
                       std::vector<uint16_t>* from_stateless, std::vector<uint16_t>* from_step);

#endif  // ARC_V3_TESTS_SINGLE_HEADER_SPLIT_H_
