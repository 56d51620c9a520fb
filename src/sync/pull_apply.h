// Applying a pull's route in its stage (pull.cc plans and commits): the stage directory,
// the feed that downloads a full pull's objects while they are decoded, the hops that
// rebuild each shard's file (full) or row sidecar (partial), the check of the results, and
// the journal that commits them to DIR. Internal to src/sync.
#ifndef ARC_V3_SRC_SYNC_PULL_APPLY_H_
#define ARC_V3_SRC_SYNC_PULL_APPLY_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/common/clock.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"
#include "src/sync/dir_state.h"
#include "src/sync/route.h"
#include "src/sync/sync.h"

namespace arc_v3 {
namespace sync {

using Clock = std::chrono::steady_clock;

// Checks a downloaded object against its record: SHA-256 (trusting) and XXH3, then its layout.
Status VerifyObject(const Fetched& f, Store* store, const Trust& trust);

// A full pull's objects, downloaded and verified on `connections` threads in the order
// the route applies them (hop by hop, shard by shard), while the caller decodes each one
// as soon as it is ready (Wait): a step costs about the larger of download and decode,
// not their sum. Every object is downloaded whatever the decoder meets, so that Finish
// reports what fetching all before applying would: the first failed download in route
// order, else the first failed verification. The destructor waits for the threads.
class ObjectFeed {
 public:
  ObjectFeed(Store* store, const PullOptions& o, const Trust& trust, std::vector<Fetched>* fetched,
             PullReport* report)
      : store_(store),
        transfer_(o.transfer_options()),
        trust_(trust),
        fetched_(*fetched),
        report_(report),
        state_(fetched->size()) {}
  ~ObjectFeed() { Join(); }

  // Fails only if no thread could be started (any one thread downloads every object).
  // Objects of several parts download one after the other, each on all connections, so
  // that the first arrives first; objects of one part download `connections` at a time.
  Status Start() {
    start_ = Clock::now();
    uint64_t bytes = 0;
    for (const Fetched& f : fetched_) bytes += f.ref.size;
    const uint64_t part = std::max<uint64_t>(1, transfer_.part_bytes);
    const uint64_t parts =
        fetched_.empty() ? 1 : std::max<uint64_t>(1, (bytes / fetched_.size() + part - 1) / part);
    const int connections = std::max(1, transfer_.connections);
    const size_t workers =
        WorkerCount(static_cast<int>(std::max<uint64_t>(1, connections / parts)), fetched_.size());
    const Status s = StatusOrCaught([&] {
      for (size_t w = 0; w < workers; ++w) threads_.emplace_back([this] { Work(); });
      return Status::Ok();
    });
    return threads_.empty() && !fetched_.empty() ? s : Status::Ok();
  }

  // Object i's download and verification; the time spent waiting counts in wait_seconds.
  Status Wait(size_t i) {
    const auto start = Clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return state_[i].done; });
    report_->wait_seconds += SecondsSince(start);
    return state_[i].fetch.ok() ? state_[i].verify : state_[i].fetch;
  }

  // Waits for every object; the error fetching all before applying would have met.
  Status Finish() {
    Join();
    for (const Object& object : state_) {
      if (!object.fetch.ok()) return object.fetch;
    }
    for (const Object& object : state_) {
      if (!object.verify.ok()) return object.verify;
    }
    report_->fetched_objects += fetched_.size();
    return Status::Ok();
  }

 private:
  struct Object {
    bool done = false;
    Status fetch, verify;
  };

  void Work() {
    for (size_t i = next_++; i < fetched_.size(); i = next_++) {
      const Fetched& f = fetched_[i];
      Status fetch = StatusOrCaught(
          [&] { return store_->GetToFile(f.ref.key, f.path, f.ref.size, transfer_); });
      const auto verify_start = Clock::now();
      Status verify = fetch.ok() ? StatusOrCaught([&] { return VerifyObject(f, store_, trust_); })
                                 : Status::Ok();
      std::lock_guard<std::mutex> lock(mutex_);
      report_->requests +=
          std::max<uint64_t>(1, (f.ref.size + transfer_.part_bytes - 1) / transfer_.part_bytes);
      if (fetch.ok()) {
        report_->fetched_bytes += f.ref.size;
        report_->verify_seconds += SecondsSince(verify_start);
      }
      state_[i] = Object{true, std::move(fetch), std::move(verify)};
      if (++finished_ == fetched_.size()) report_->fetch_seconds += SecondsSince(start_);
      ready_.notify_all();
    }
  }

  void Join() {
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  Store* store_;
  const StoreOptions transfer_;
  const Trust& trust_;
  const std::vector<Fetched>& fetched_;
  PullReport* report_;
  std::vector<Object> state_;  // guarded by mutex_
  std::atomic<size_t> next_{0};
  size_t finished_ = 0;  // guarded by mutex_
  Clock::time_point start_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<std::thread> threads_;
};

// Removes the stage directory (and whatever a killed pull left in it) when done.
class Stage {
 public:
  ~Stage() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  Status Create(const std::string& dir) {
    path_ = (std::filesystem::path(dir) / kStateDir / "stage").string();
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    std::filesystem::create_directories(std::filesystem::path(path_) / "objects", ec);
    if (!ec) std::filesystem::create_directories(std::filesystem::path(path_) / "rows", ec);
    if (!ec)
      std::filesystem::create_directories(std::filesystem::path(dir) / kStateDir / "rows", ec);
    if (ec) return Status(ErrorCode::kInvalidArgument, path_ + ": cannot create: " + ec.message());
    return Status::Ok();
  }
  std::string Path(const std::string& name) const {
    return (std::filesystem::path(path_) / name).string();
  }
  // From now on the commit journal owns the stage (recovery renames out of it): the stage
  // is left for RunJournal to remove.
  void HandOver() { path_.clear(); }
  // Relative to DIR, for the journal.
  static std::string Relative(const std::string& name) {
    return std::string(kStateDir) + "/stage/" + name;
  }

 private:
  std::string path_;
};

// One route in the making, in the stage: what ApplyRoute builds and BuildJournal commits.
struct StagedRoute {
  const Route* route = nullptr;
  const Select* select = nullptr;
  const Stage* stage = nullptr;
  std::vector<Fetched> fetched;                // one per (hop, shard), downloaded into the stage
  std::vector<std::vector<size_t>> object_of;  // [hop][shard] -> index in `fetched`
  std::vector<std::string> current;            // each shard's file: DIR's own (a route from DIR)
                                               // or none, then each hop's result
};

// Computes the last hop's result checksums into each record's `results` (ungrouped
// tensors: the containers' target_xxh3, which apply verified; grouped ones hashed from the
// rebuilt `files`) and checks their tensor-list checksum against the record's
// tensors_xxh3 (kCorruptHeader).
Status VerifyResults(Hop* hop, const std::vector<Fetched>& fetched,
                     const std::vector<size_t>& objects, const std::vector<std::string>& files);

// Builds every shard's file (full) or sidecar (partial) hop by hop in the stage; `current`
// starts as DIR's own files (a route from DIR) or empty, and ends as the last hop's.
// A full pull's objects come from `feed`; a partial pull's pieces are all fetched before.
Status ApplyRoute(StagedRoute* plan, ObjectFeed* feed, const PullOptions& o, PullReport* report);

// The commit of a pull: the staged files' moves into DIR, the files to remove, the state
// (with the keys it was pulled trusting).
Status BuildJournal(Store* store, const std::string& dir, const DirState* old,
                    const StagedRoute& plan, const Trust& trust, Journal* journal,
                    PullReport* report);

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_PULL_APPLY_H_
