// The hop engine (see apply_hop.h).
#include "src/sync/apply_hop.h"

#include <chrono>
#include <future>
#include <string>
#include <system_error>
#include <utility>

#include "src/common/clock.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"

namespace arc_v3 {
namespace sync {
namespace {

using Clock = std::chrono::steady_clock;

// Fetches the batches' pieces: batch 0 when it is asked for, each next one in the
// background while the one before is decoded.
class Prefetch {
 public:
  Prefetch(const HopRun& run, PullReport* report, HopTimes* times)
      : run_(run), report_(report), times_(times) {}
  ~Prefetch() {
    if (ahead_.valid()) ahead_.wait();
  }
  // Waits for the pieces of batch `j`, then starts fetching batch j + 1's.
  Status Get(size_t j) {
    if (!run_.fetch) return Status::Ok();
    if (j == 0) {
      ARC_V3_RETURN_IF_ERROR(Fetch(0, report_));
    } else {
      const Status s = ahead_.get();
      report_->requests += ahead_report_.requests;  // what a failed batch read counts too
      report_->fetched_bytes += ahead_report_.fetched_bytes;
      times_->fetch_seconds += ahead_report_.fetch_seconds;
      ARC_V3_RETURN_IF_ERROR(s);
    }
    if (j + 1 < run_.batches.size()) {
      ahead_report_ = PullReport();
      const auto next = [this, j] { return Fetch(j + 1, &ahead_report_); };
      try {
        ahead_ = std::async(std::launch::async, next);
      } catch (const std::system_error&) {
        ahead_ = std::async(std::launch::deferred, next);
      }
    }
    return Status::Ok();
  }

 private:
  Status Fetch(size_t j, PullReport* counted) const {
    return StatusOrCaught([&] { return run_.fetch(j, counted); });
  }

  const HopRun& run_;
  PullReport* report_;
  HopTimes* times_;
  std::future<Status> ahead_;
  PullReport ahead_report_;
};

// An error of shard `k`, naming the step, the shard and its file.
Status InShard(const Hop& hop, size_t k, const Status& s) {
  if (s.ok()) return s;
  return InContext("step " + std::to_string(hop.m.step) + ", shard " + std::to_string(k) + " (" +
                       hop.m.shards[k].file + ")",
                   s);
}

// Plans and decodes shard `k` into `apply` (nothing for a skipped shard).
Status DecodeShard(const HopRun& run, size_t k, HopSink* sink, checkpoint::TensorApply* apply) {
  const Fetched& f = (*run.fetched)[(*run.object)[k]];
  const Select& select = *run.select;
  const bool keep_small = k < select.keep_small.size() && select.keep_small[k];
  const auto wanted = [&](const checkpoint::TensorEntry& t) {
    const Need need = Needed(t, select, keep_small);
    return std::make_pair(need.begin, need.end);
  };
  const auto allocate = [&](const checkpoint::TensorEntry& t, uint64_t begin, uint64_t end,
                            checkpoint::HeldTensor* held) {
    return sink->Allocate(k, t, begin, end, held);
  };
  const checkpoint::HeldTensors* base = nullptr;
  Status s = sink->Open(k, f, &base);
  if (s.ok() && !f.skipped)
    s = apply->Plan(&f.reader, 0, *base, wanted, allocate, sink->in_place());
  if (s.ok() && !f.skipped) s = apply->Decode(run.threads);
  if (!s.ok()) return InShard(*run.hop, k, s);
  if (f.source != nullptr)
    f.source->Release();  // its pieces are written: only the undo record stays
  return s;
}

// Decodes the batches in order, the i-th shard of them into applies[i]; `*applied`: how
// many were decoded, to commit or roll back.
Status DecodeBatches(const HopRun& run, HopSink* sink,
                     std::vector<checkpoint::TensorApply>* applies, size_t* applied,
                     PullReport* report, HopTimes* times) {
  Prefetch prefetch(run, report, times);
  Status s;
  for (size_t j = 0; j < run.batches.size() && s.ok(); ++j) {
    s = prefetch.Get(j);
    if (!s.ok()) break;
    const auto decode = Clock::now();
    for (size_t k : run.batches[j]) {
      s = DecodeShard(run, k, sink, &(*applies)[*applied]);
      if (!s.ok()) break;
      ++*applied;
    }
    times->decode_seconds += SecondsSince(decode);
  }
  return s;
}

}  // namespace

Status ApplyHop(const HopRun& run, HopSink* sink, PullReport* report, HopTimes* times) {
  std::vector<size_t> shards;
  for (const std::vector<size_t>& batch : run.batches)
    shards.insert(shards.end(), batch.begin(), batch.end());
  std::vector<checkpoint::TensorApply> applies(shards.size());
  size_t applied = 0;
  const Status s = DecodeBatches(run, sink, &applies, &applied, report, times);
  if (!s.ok()) {
    for (size_t i = 0; i < applied; ++i) applies[i].Rollback();
    return s;
  }
  const auto commit = Clock::now();
  for (size_t i = 0; i < shards.size(); ++i) {
    const Status committed = sink->Commit(shards[i], &applies[i]);
    if (!committed.ok()) return InShard(*run.hop, shards[i], committed);
  }
  times->commit_seconds += SecondsSince(commit);
  return Status::Ok();
}

}  // namespace sync
}  // namespace arc_v3
