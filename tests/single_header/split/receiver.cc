// The split build's receiving side (see sender.cc).
#include "../third_party/arc_v3/arc_v3.hpp"

#include "split.h"

arc_v3::Status Receive(const std::vector<uint16_t>& prev, const arc_v3::Delta& stateless,
                       const arc_v3::Delta& step, arc_v3::Session* session,
                       std::vector<uint16_t>* from_stateless, std::vector<uint16_t>* from_step) {
  arc_v3::Status s = arc_v3::delta_decompress(prev, stateless, from_stateless);
  if (!s.ok()) return s;
  from_step->resize(prev.size());
  return session->Decompress(prev.data(), prev.size(), step.bytes.data(), step.bytes.size(),
                             step.checksum, from_step->data());
}
