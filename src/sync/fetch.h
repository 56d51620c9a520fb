// Fetching what a pull needs of a route's containers: their heads, then the byte ranges of
// the pieces a selection of tensors and rows needs (merged, fetched ahead within a budget,
// the rest read as decoded), each checked against its record (and under trust its
// SHA-256 digests). Internal to src/sync.
#ifndef ARC_V3_SRC_SYNC_FETCH_H_
#define ARC_V3_SRC_SYNC_FETCH_H_

#include <cstdint>
#include <map>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "src/checkpoint/container.h"
#include "src/sync/dir_state.h"
#include "src/sync/sync.h"
#include "src/sync/trust.h"

namespace arc_v3 {
namespace sync {

// Ranges of a partial pull closer than this are fetched as one request.
constexpr uint64_t kMergeGap = uint64_t{256} << 10;

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
  Status Read(uint64_t offset, uint64_t size, std::vector<uint8_t>* scratch,
              const uint8_t** data) const override;

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
std::vector<std::pair<uint64_t, uint64_t>> NeededRanges(const checkpoint::Reader& reader,
                                                        const Select& select, bool keep_small);

// What a pull fetched: one entry per (hop, shard) that needs an object.
struct Fetched {
  size_t hop = 0, shard = 0;
  ObjectRef ref;
  const ShardRecord* record = nullptr;  // the shard's record at that hop
  std::string path;                     // full pulls: the downloaded object
  checkpoint::Reader reader;            // partial pulls: over the fetched ranges (a RangeSource)
  RangeSource* source = nullptr;        // the reader's
  // Partial pulls: its shard's records on the route name no selected tensor, so nothing of
  // it is read (no head, no reader): its sidecar and file hold no tensor.
  bool skipped = false;
  // Its file's tensors: the reader's, or none when skipped.
  const checkpoint::FileEntry& file() const;
};

// A shard's container holds one file (the "file" layout, PROTOCOL.md), the one its record
// names: of the record's `file` name and `file_size`, and, where the record's names are its
// layout's, those tensors in data-section order (kCorruptHeader naming `name`).
Status CheckLayout(const checkpoint::Reader& reader, const ShardRecord& record,
                   const std::string& name);

// Fetches each container's head (checked against its ObjectRef) and opens its reader;
// then marks the shards whose small tensors a selected group needs (Select::keep_small).
// Under trust, each container's head must have its record's SHA-256, and its pieces are
// read only against its sums object's digests (RangeSource::SetDigests).
Status FetchHeads(Store* store, const StoreOptions& options, Select* select,
                  std::vector<Fetched>* fetched, PullReport* report, const Trust& trust = Trust());
// The bytes of one opened container that `select` needs.
uint64_t NeededBytes(const Fetched& f, const Select& select);
// Fetches ahead the pieces `select` needs of the opened containers `objects` (neighbours
// merged), where an object needs at most `prefetch_limit` bytes and those fetched ahead so
// far at most `budget` in all; the others are read piece by piece when decoded
// (RangeSource): memory stays bounded by the budget and the pieces being decoded.
Status FetchRanges(Store* store, const StoreOptions& options, uint64_t prefetch_limit,
                   uint64_t budget, const Select& select, const std::vector<size_t>& objects,
                   std::vector<Fetched>* fetched, PullReport* report);
// FetchHeads, then FetchRanges of every object.
Status FetchPieces(Store* store, const StoreOptions& options, uint64_t prefetch_limit,
                   Select* select, std::vector<Fetched>* fetched, PullReport* report,
                   uint64_t budget = UINT64_MAX, const Trust& trust = Trust());

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_FETCH_H_
