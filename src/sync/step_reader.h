// Reading a committed step from a store (src/sync/PROTOCOL.md, "Reading a step"): the
// `latest` pointer, a step's root, and its group indexes, layouts and shard records, each
// document read by the hashes that name it. The documents themselves are protocol.h's.
// Internal to src/sync.
#ifndef ARC_V3_SRC_SYNC_STEP_READER_H_
#define ARC_V3_SRC_SYNC_STEP_READER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "src/sync/protocol.h"
#include "src/sync/store.h"

namespace arc_v3 {
namespace sync {

// A document read by the hashes that name it (PROTOCOL.md, "Named document"; `sha256` "":
// named without one): absent is kNotFound, other bytes kCorruptChunk, or kUntrusted where
// only the SHA-256 differs (or, `trusting`, it differs at all, or none names it). Errors
// say it is named by `named_by`.
Status GetNamed(Store* store, const std::string& key, uint64_t xxh3, uint64_t size,
                const std::string& sha256, bool trusting, std::vector<uint8_t>* bytes,
                const std::string& named_by);

// Reads a step's root (kNotFound: the step is not committed) and checks it is the step
// asked for; `bytes` gets its bytes (their XXH3 names the step in a region's state).
Status ReadRoot(Store* store, uint64_t step, StepManifest* root, std::vector<uint8_t>* bytes);

// Layouts by XXH3, read once: a follower keeps one across steps.
using LayoutCache = std::map<uint64_t, Layout>;

// What reading a step's documents cost.
struct ReadCost {
  uint64_t requests = 0, bytes = 0;
};

// Fills root->shards: with `want` null, every shard's record (group indexes, then records,
// each checked against the hash that names it); else the records of the shards `want`
// marks only, and, given `layouts`, every other shard's file and tensor names from the
// layouts of all groups (read where not cached); without it the others stay empty.
// `trusting`: a reader with trusted keys, for whom a document whose SHA-256 differs from
// the one naming it is kUntrusted before its XXH3 is looked at (else XXH3 first: damage
// is kCorruptChunk, which another route may avoid).
Status LoadShards(Store* store, StepManifest* root, const std::vector<bool>* want,
                  LayoutCache* layouts, ReadCost* cost, bool trusting = false);

// ReadRoot and LoadShards of every shard.
Status ReadManifest(Store* store, uint64_t step, StepManifest* manifest,
                    std::vector<uint8_t>* bytes);
// Reads the `latest` pointer: kNotFound if nothing was committed yet; a store of another
// protocol version is kUnsupportedVersion.
Status ReadLatest(Store* store, uint64_t* step, std::string* etag);
// The newest committed step from `from` on: `from` itself, or a later step whose root
// exists (the pointer is a hint that a racing commit may leave one step behind; at most
// `probes` roots are looked for).
uint64_t ProbeLater(Store* store, uint64_t from, int probes = 16);

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_STEP_READER_H_
