// What a delta file holds, tensor by tensor and group by group (`arc_v3 inspect`): sizes,
// the coders its pieces chose, and, given the checkpoint it applies to, the changes each
// delta tensor carries (counted on the decoded values where the payload alone cannot say).
#ifndef ARC_V3_SRC_CHECKPOINT_INSPECT_H_
#define ARC_V3_SRC_CHECKPOINT_INSPECT_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "src/checkpoint/container.h"

namespace arc_v3 {
namespace checkpoint {

struct TensorInspection {
  const TensorEntry* entry = nullptr;  // in the inspection's reader's manifest
  uint64_t elements = 0, bytes = 0;
  uint64_t stored = 0;   // bytes of its pieces (a grouped tensor's are its group's)
  uint64_t changed = 0;  // elements that change (a whole tensor: 0)
  uint64_t high = 0;     // of them, changes of the sign or exponent field (has_high)
  bool has_high = false;      // arc_v3-coded: `high` and `chunk_modes` are known
  bool counts_known = true;   // false: modelled chunks that only the base can count
  uint64_t chunk_modes[5] = {0, 0, 0, 0, 0};  // arc_v3 chunks by ChunkMode
  std::set<std::string> coders;  // CoderName of each piece
  int64_t group = -1;            // index in Inspection::groups, or -1
};

struct GroupInspection {
  const FileEntry* file = nullptr;
  const Group* group = nullptr;
  PayloadStats payload;
  bool counted = false;  // the members' changes were counted (a base was given)
  uint64_t changed = 0;  // over its members, when counted
};

struct Inspection {
  Reader reader;
  std::vector<TensorInspection> tensors;  // in manifest order
  std::vector<GroupInspection> groups;    // in manifest order
};

// Reads the delta file at `path`; with `base_path` (the checkpoint it applies to; "":
// none) decodes what must be decoded to count changes. Errors: the container's (naming
// the file), a piece's or group's (naming its tensor), kChecksumMismatch for a base whose
// rows differ from the ones the delta was made from.
Status Inspect(const std::string& path, const std::string& base_path, int threads, Inspection* out);

// Which chunk coders an arc_v3 payload chose, e.g. "arc_v3:rans+modelled".
std::string ArcV3CoderNames(const uint64_t chunk_modes[5]);

}  // namespace checkpoint
}  // namespace arc_v3

#endif  // ARC_V3_SRC_CHECKPOINT_INSPECT_H_
