// The one engine that applies a hop of a route (one step's containers, a shard each) onto
// what a region holds, piece by piece: the partial directory pull (pull.cc, into sidecar
// files) and the in-memory Follower (roles.cc, into tensors) differ only in their HopSink
// and in when pieces are fetched. A full pull streams each file through checkpoint::Apply
// instead: a file written aside and renamed needs no in-memory rollback, and decoding into
// a mapped file kept every page of it and of its base resident (bench/results/
// sync_engine_ab.txt). Internal to src/sync.
#ifndef ARC_V3_SRC_SYNC_APPLY_HOP_H_
#define ARC_V3_SRC_SYNC_APPLY_HOP_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "src/checkpoint/tensor_apply.h"
#include "src/sync/route.h"

namespace arc_v3 {
namespace sync {

// What a hop's shards are decoded from and into.
class HopSink {
 public:
  virtual ~HopSink() = default;
  // Prepares shard `k` (whose container is `f`, skipped or not) and gives the tensors it
  // holds before the hop, the base of its deltas (empty for an anchor). `*base` stays
  // valid until Commit.
  virtual Status Open(size_t k, const Fetched& f, const checkpoint::HeldTensors** base) = 0;
  // Memory for rows [begin, end) of tensor `t` of shard `k` where they are not updated in
  // place.
  virtual Status Allocate(size_t k, const checkpoint::TensorEntry& t, uint64_t begin, uint64_t end,
                          checkpoint::HeldTensor* held) = 0;
  // Whether the held rows are updated in place (an undo record kept until the hop is done);
  // otherwise the base is only read.
  virtual bool in_place() const = 0;
  // Every shard of the run decoded: shard `k`'s result is kept (called in shard order).
  virtual Status Commit(size_t k, checkpoint::TensorApply* apply) = 0;
};

// One hop to apply.
struct HopRun {
  const Hop* hop = nullptr;
  const Select* select = nullptr;
  const std::vector<Fetched>* fetched = nullptr;
  const std::vector<size_t>* object = nullptr;  // per shard: its container's index in *fetched
  // The shards to apply, in batches, in shard order: batch j + 1's pieces are fetched (by
  // `fetch`) while batch j is decoded. A skipped shard is opened and committed empty.
  std::vector<std::vector<size_t>> batches;
  // Fetches the pieces of batches[j], counting in the report it is given; null: all the
  // pieces were fetched before.
  std::function<Status(size_t j, PullReport* report)> fetch;
  int threads = 0;
};

struct HopTimes {
  double fetch_seconds = 0;   // of the batches fetched ahead (batch 0's counts in the report)
  double decode_seconds = 0;  // opening, reading, decoding and writing the shards
  double commit_seconds = 0;  // the sink's commits
};

// Applies the shards of `run.batches`, all or nothing: every piece is decoded and verified
// before it is written, and on any error the shards decoded so far are rolled back before
// it returns (an error names the step, shard and file). Then commits each shard to `sink`.
Status ApplyHop(const HopRun& run, HopSink* sink, PullReport* report, HopTimes* times);

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_APPLY_HOP_H_
