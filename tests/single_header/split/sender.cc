// The split build (tests/single_header/run.sh): the implementation is compiled once, in
// arc_v3.cc beside the header; this file and the others only see the declarations. The
// header lies in third_party/arc_v3/ and nothing passes -I.
#include "../third_party/arc_v3/arc_v3.hpp"

#include "split.h"

arc_v3::Status Send(const std::vector<uint16_t>& prev, const std::vector<uint16_t>& next,
                    arc_v3::Session* session, arc_v3::Delta* stateless, arc_v3::Delta* step) {
  arc_v3::Status s = arc_v3::delta_compress(prev, next, stateless);
  if (!s.ok()) return s;
  return session->Compress(prev.data(), next.data(), prev.size(), step);
}
