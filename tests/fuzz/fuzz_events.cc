// Fuzz target: the bodies a follower's events endpoint reads (src/sync/events.h): S3 event
// records as radosgw pushes them, SNS envelopes, subscription confirmations. Input: the
// body. Promises checked: no crash or out-of-bounds access; an event that wakes a follower
// of s3://bucket/run7 wakes one that watches every store too (filtering only removes); a
// confirmation carries its URL, and a URL judged fetchable is https.
#include <cstdint>
#include <string>
#include <vector>

#include "src/sync/events.h"
#include "tests/fuzz/fuzz_common.h"

namespace arc_v3 {
namespace fuzz {

int FuzzEvents(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  static const std::vector<sync::EventSource> watched = sync::EventSourcesOf("s3://bucket/run7");
  const sync::EventVerdict filtered = sync::ReadEvent(body, &watched);
  const sync::EventVerdict any = sync::ReadEvent(body, nullptr);
  using Kind = sync::EventVerdict::Kind;
  FUZZ_CHECK(filtered.kind != Kind::kWake || any.kind == Kind::kWake,
             "a filtered event woke where an unfiltered one did not");
  FUZZ_CHECK((filtered.kind == Kind::kMalformed) == (any.kind == Kind::kMalformed),
             "whether a body is malformed depended on the store watched");
  if (any.kind == Kind::kSubscribe) {
    FUZZ_CHECK(sync::SnsConfirmable(any.subscribe_url) == false ||
                   any.subscribe_url.compare(0, 8, "https://") == 0,
               "a confirmation URL other than https:// would be fetched");
  }
  return 0;
}

ARC_V3_FUZZ_ENTRY(FuzzEvents)

}  // namespace fuzz
}  // namespace arc_v3
