// What a delta holds, tensor by tensor and group by group (InspectDelta,
// InspectDeltaFile, `arc_v3 inspect`): sizes, the coders its pieces chose, and, given the
// checkpoint it applies to, the changes each delta tensor carries (counted on the decoded
// values where the payload alone cannot say).
#ifndef ARC_V3_SRC_CHECKPOINT_INSPECT_H_
#define ARC_V3_SRC_CHECKPOINT_INSPECT_H_

#include "arc_v3.hpp"
#include "arc_v3_checkpoint.hpp"
#include "src/checkpoint/checkpoint_delta.h"
#include "src/checkpoint/container.h"

namespace arc_v3 {
namespace checkpoint {

// Inspects the container `reader` opened: its manifest, with `payloads` also the arc_v3
// payloads' statistics, and with `base` (may be null; implies payloads) what must be
// decoded to count every change. Errors: a piece's or group's (naming its tensor),
// kChecksumMismatch for a base whose rows differ from the ones the delta was made from.
Status Inspect(const Reader& reader, bool payloads, const Checkpoint* base, int threads,
               DeltaInfo* info);

}  // namespace checkpoint
}  // namespace arc_v3

#endif  // ARC_V3_SRC_CHECKPOINT_INSPECT_H_
