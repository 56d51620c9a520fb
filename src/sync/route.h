// How a pull goes: the route from what a region holds to the step it wants (the chain of
// deltas, or an anchor and the deltas after it), its roots and records read and linked,
// and the notes of a reroute around damage. Shared by the directory pull (pull.cc) and the
// in-memory follower (roles.cc); fetching is fetch.h's, trust trust.h's. Internal to src/sync.
#ifndef ARC_V3_SRC_SYNC_ROUTE_H_
#define ARC_V3_SRC_SYNC_ROUTE_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "src/checkpoint/container.h"
#include "src/sync/dir_state.h"
#include "src/sync/fetch.h"
#include "src/sync/sync.h"
#include "src/sync/trust.h"

namespace arc_v3 {
namespace sync {

// One step of a route: its root (records loaded by LoadRoute), and per shard whether its anchor is
// applied (else its delta, onto the shard's file of the hop before).
struct Hop {
  StepManifest m;
  uint64_t manifest_xxh3 = 0;
  std::string root_sha256;  // of the root's bytes, in hex
  std::vector<bool> anchor;
};
const ObjectRef& RefOf(const Hop& hop, size_t shard);

struct Route {
  bool from_dir = false;  // starts from what the region holds
  std::vector<Hop> hops;  // ascending
  uint64_t bytes = 0;
  uint64_t anchor_step = kNoStep;  // the target's
  std::string name;                // "chain S -> T" or "anchor A -> T"
  std::string from_incarnation;    // a route from the region's step: that step's ("": unknown)
  // Per shard, whether its records were read (LoadRoute): every shard for a full pull, else
  // those holding a selected tensor at some hop.
  std::vector<bool> touched;
};

// What a region holds: a step, the XXH3 of its manifest bytes (which store's step) and
// its shard count.
struct RouteFrom {
  uint64_t step = kNoStep;
  uint64_t manifest_xxh3 = 0;  // of its step's root
  // SHA-256 (hex) of its step's root: under trust the chain from it must link to that by
  // SHA-256 ("": not recorded, no chain under trust).
  std::string root_sha256;
  uint32_t count = 0;
  std::string incarnation;  // of its step's root ("": not recorded)
  bool only_chain = false;  // the chain from it or nothing (kNotFound), whatever the anchor costs
};

// Walks the chain back from `target` and picks the cheaper of: the deltas after `from`
// (null: none held), or the target's anchor and the deltas after it.
// Under trust every root read on the way must be signed and link to the next by SHA-256,
// and the chain joins `from` only where the link names its root's SHA-256.
Status PlanRoute(Store* store, const RouteFrom* from, Hop target, Route* route, PullReport* report,
                 const Trust& trust = Trust());

// An error that a damaged document or object of a route gives: the other route may do.
inline bool Damaged(ErrorCode code) {
  return code == ErrorCode::kCorruptChunk || code == ErrorCode::kTruncated ||
         code == ErrorCode::kCorruptHeader;
}

// What a pull or follower reports after routing around what it `met`: the note when the
// other route, `taken`, worked; the error when it did not (`again`: why).
inline std::string ReroutedNote(const Status& met, const std::string& taken,
                                const std::string& instead) {
  return met.message() + ": took " + taken + " instead of " + instead;
}
inline Status NoOtherRoute(const Status& met, const std::string& route, const Status& again) {
  return Status(met.code(), met.message() + " (on the route " + route +
                                "; no other route: " + again.message() + ")");
}

// Reads each hop's records the pull needs and sets per shard whether its anchor applies:
// every record (select null), or the layouts and then the records of the shards holding a
// tensor `select` matches at some hop; the others keep only their file and tensor names.
Status LoadRoute(Store* store, const Select* select, LayoutCache* layouts, Route* route,
                 PullReport* report, const Trust& trust = Trust());

// Reads the root of `step` (kLatestStep: the latest, probing past the pointer); a step
// above kMaxStep is kInvalidArgument.
Status ReadTarget(Store* store, uint64_t step, Hop* target, PullReport* report,
                  const Trust& trust = Trust());

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_ROUTE_H_