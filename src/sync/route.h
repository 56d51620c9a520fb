// How a pull goes: the route from what a region holds to the step it wants, and the
// fetching of the containers' heads and of the pieces a selection needs. Shared by the
// directory pull (pull.cc) and the in-memory follower (roles.cc). Internal to src/sync.
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
#include "src/sync/sync.h"

namespace arc_v3 {
namespace sync {

// What a reader trusts (PROTOCOL.md, "Signed steps"): no key, and steps are taken
// unauthenticated; else every root on a route must be signed by one of `keys`, and every
// document and byte it names must have the SHA-256 the signed documents give.
struct Trust {
  std::vector<PublicKey> keys;
  bool on() const { return !keys.empty(); }
  std::vector<std::string> ids() const;  // the keys' ids, sorted, each once
};
// Loads every key of each PEM trust file (kInvalidArgument naming a file that is not one).
Status LoadTrust(const std::vector<std::string>& paths, Trust* trust);
// What a failed check of the store's bytes is under trust: kUntrusted, its message naming
// the cause, for a damaged document or object (corrupt, truncated, of an unknown version),
// which a trusting reader never routes around. Without trust, or any other error: `s`.
Status UnderTrust(const Trust& trust, Status s);
// Under trust: the root of `hop` signed by a trusted key (kUntrusted otherwise).
Status CheckTrusted(const Trust& trust, const StepManifest& root, const std::string& where);
// Under trust, a holder of `held_step` of run `held_run` (0: not recorded) takes no older
// step and no step of another run (kUntrusted naming `holder`).
Status CheckProgress(const Trust& trust, uint64_t held_step, uint64_t held_run, const StepManifest& target,
                     const std::string& holder);

// Ranges of a partial pull closer than this are fetched as one request.
constexpr uint64_t kMergeGap = uint64_t{256} << 10;

// One step of a route: its root (records loaded by LoadRoute), and per shard whether its anchor is applied (else
// its delta, onto the shard's file of the hop before).
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
  std::string name;  // "chain S -> T" or "anchor A -> T"
  std::string from_incarnation;  // a route from the region's step: that step's ("": unknown)
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
  return code == ErrorCode::kCorruptChunk || code == ErrorCode::kTruncated || code == ErrorCode::kCorruptHeader;
}

// What a pull or follower reports after routing around what it `met`: the note when the
// other route, `taken`, worked; the error when it did not (`again`: why).
inline std::string ReroutedNote(const Status& met, const std::string& taken, const std::string& instead) {
  return met.message() + ": took " + taken + " instead of " + instead;
}
inline Status NoOtherRoute(const Status& met, const std::string& route, const Status& again) {
  return Status(met.code(), met.message() + " (on the route " + route + "; no other route: " + again.message() + ")");
}

struct Select;
// Reads each hop's records the pull needs and sets per shard whether its anchor applies:
// every record (select null), or the layouts and then the records of the shards holding a
// tensor `select` matches at some hop; the others keep only their file and tensor names.
Status LoadRoute(Store* store, const Select* select, LayoutCache* layouts, Route* route, PullReport* report,
                 const Trust& trust = Trust());

// Reads the root of `step` (kLatestStep: the latest, probing past the pointer); a step
// above kMaxStep is kInvalidArgument.
Status ReadTarget(Store* store, uint64_t step, Hop* target, PullReport* report, const Trust& trust = Trust());

// A container of which some byte ranges were fetched ahead; other reads go to the store
// (counted in `report`), or fail (kInternal) without one.
class RangeSource : public checkpoint::ByteSource {
 public:
  RangeSource(uint64_t size, Store* store, std::string key, PullReport* report);
  uint64_t size() const override { return size_; }
  void Add(uint64_t offset, std::vector<uint8_t> bytes);
  // From now on every read of a data range must be one these name, of this SHA-256
  // (offset -> size, digest; kUntrusted otherwise).
  void SetDigests(std::map<uint64_t, std::pair<uint64_t, Digest>> digests) {
    digests_ = std::move(digests);
    checked_ = true;
  }
  // Drops every range fetched ahead: later reads fetch what they need.
  void Release();
  Status Read(uint64_t offset, uint64_t size, std::vector<uint8_t>* scratch, const uint8_t** data) const override;

 private:
  uint64_t size_;
  Store* store_;
  std::string key_;
  PullReport* report_;
  std::map<uint64_t, std::vector<uint8_t>> ranges_;
  std::map<uint64_t, std::pair<uint64_t, Digest>> digests_;
  bool checked_ = false;  // SetDigests was called: every read is checked, even with none listed
  Status Check(uint64_t offset, uint64_t size, const uint8_t* data) const;
};

// A pull's selection of tensors and rows, compiled.
struct Select {
  Selection sel;
  std::regex pattern;
  // Per shard: whether the selection holds a tensor of it that a group may code; then
  // every such tensor of the shard is kept whole, since decoding a group needs the base
  // of every member.
  std::vector<bool> keep_small;
};

// A BF16 tensor a group may code (grouped, or under kGroupBelowElements elements).
bool Groupable(const checkpoint::TensorEntry& t);

// Rows [begin, end) of a tensor that a pull keeps: the selected rows rounded out to whole
// pieces (a piece decodes only onto all its base rows), and, with keep_small, every
// tensor a group may hold whole.
struct Need {
  uint64_t begin = 0, end = 0;
  bool empty() const { return begin >= end; }
};
Need Needed(const checkpoint::TensorEntry& t, const Select& select, bool keep_small);

// The byte ranges (relative to the container) a pull reads of one container, merged.
std::vector<std::pair<uint64_t, uint64_t>> NeededRanges(const checkpoint::Reader& reader, const Select& select,
                                                        bool keep_small);

// What a pull fetched: one entry per (hop, shard) that needs an object.
struct Fetched {
  size_t hop = 0, shard = 0;
  ObjectRef ref;
  const ShardRecord* record = nullptr;  // the shard's record at that hop
  std::string path;  // full pulls: the downloaded object
  checkpoint::Reader reader;  // partial pulls: over the fetched ranges (a RangeSource)
  RangeSource* source = nullptr;  // the reader's
  // Partial pulls: its shard's records on the route name no selected tensor, so nothing of
  // it is read (no head, no reader): its sidecar and file hold no tensor.
  bool skipped = false;
  // Its file's tensors: the reader's, or none when skipped.
  const checkpoint::FileEntry& file() const;
};

// A shard's container holds one file (the "file" layout, PROTOCOL.md), the one its record
// names: of the record's `file` name and `file_size` (kCorruptHeader naming `name`).
Status CheckLayout(const checkpoint::Reader& reader, const ShardRecord& record, const std::string& name);


// Fetches each container's head (checked against its ObjectRef) and opens its reader;
// then marks the shards whose small tensors a selected group needs (Select::keep_small).
// Under trust, each container's head must have its record's SHA-256, and its pieces are
// read only against its sums object's digests (RangeSource::SetDigests).
Status FetchHeads(Store* store, const StoreOptions& options, Select* select, std::vector<Fetched>* fetched,
                  PullReport* report, const Trust& trust = Trust());
// The bytes of one opened container that `select` needs.
uint64_t NeededBytes(const Fetched& f, const Select& select);
// Fetches ahead the pieces `select` needs of the opened containers `objects` (neighbours
// merged), where an object needs at most `prefetch_limit` bytes and those fetched ahead so
// far at most `budget` in all; the others are read piece by piece when decoded
// (RangeSource): memory stays bounded by the budget and the pieces being decoded.
Status FetchRanges(Store* store, const StoreOptions& options, uint64_t prefetch_limit, uint64_t budget,
                   const Select& select, const std::vector<size_t>& objects, std::vector<Fetched>* fetched,
                   PullReport* report);
// FetchHeads, then FetchRanges of every object.
Status FetchPieces(Store* store, const StoreOptions& options, uint64_t prefetch_limit, Select* select,
                   std::vector<Fetched>* fetched, PullReport* report, uint64_t budget = UINT64_MAX,
                   const Trust& trust = Trust());

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_ROUTE_H_
