// The sync protocol end to end on every store (a directory, and radosgw where the test
// environment has it): trainer shards publishing a run, regions pulling it every way, and
// each fault a region or trainer meets, with a check that nothing was half-applied.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "src/sync/dir_state.h"
#include "src/sync/sync.h"
#include "tests/sync/sync_test_util.h"

namespace arc_v3 {
namespace sync {
namespace {

using test::Backend;
using test::CheckHolds;
using test::Snapshot;
using test::TempDir;
using test::TrainerRun;
namespace fs = std::filesystem;

// Shard 0: a 2-piece tensor and small ones a group may take; shard 1: a 3-piece tensor, a
// one-piece tensor of exactly 2^20 elements, and a small one.
std::vector<std::vector<test::TensorSpec>> TwoShards() {
  return {{{"embed", {10000, 256}},
           {"layers.0.norm", {256}},
           {"layers.0.bias", {256}},
           {"layers.0.w", {1024, 256}}},
          {{"lm_head", {20000, 256}}, {"layers.1.norm", {256}}, {"layers.1.w", {4096, 256}}}};
}

PublishOptions Shard(const TrainerRun& run, uint64_t step, size_t k, bool with_prev) {
  PublishOptions o;
  o.step = step;
  o.next = run.Path(step, k);
  if (with_prev) o.prev = run.Path(step - 1, k);
  o.shard = static_cast<uint32_t>(k);
  o.count = static_cast<uint32_t>(run.shards());
  o.anchor_every = 3;
  return o;
}

// Publishes `step` of every shard at once, one thread per shard, as trainer ranks do;
// one of them commits it (unless other committers race them).
void PublishStep(Store* store, const TrainerRun& run, uint64_t step, bool raced = false) {
  std::vector<Status> results(run.shards());
  std::vector<PublishReport> reports(run.shards());
  std::vector<std::thread> threads;
  for (size_t k = 0; k < run.shards(); ++k) {
    threads.emplace_back(
        [&, k] { results[k] = Publish(store, Shard(run, step, k, step > 0), &reports[k]); });
  }
  for (auto& t : threads) t.join();
  bool committed = false;
  for (size_t k = 0; k < run.shards(); ++k) {
    INFO("step ", step, " shard ", k, ": ", results[k].ToString());
    REQUIRE(results[k].ok());
    committed = committed || reports[k].committed;
  }
  CHECK((committed || raced));
}

Status PullStep(Store* store, const std::string& dir, uint64_t step, PullReport* report,
                const PullOptions& base = PullOptions()) {
  PullOptions o = base;
  o.step = step;
  o.transfers = test::FastRetries();
  return Pull(store, dir, o, report);
}

// Rows [begin, end) of a BF16 tensor of a safetensors file.
std::vector<uint8_t> Rows(const std::string& path, const std::string& name, uint64_t begin,
                          uint64_t end) {
  safetensors::File file;
  REQUIRE(safetensors::File::Open(path, &file).ok());
  const safetensors::TensorInfo* info = file.Find(name);
  REQUIRE(info != nullptr);
  const uint64_t rows = info->shape.empty() ? 1 : info->shape[0];
  const uint64_t row = rows == 0 ? 0 : info->size() / rows;
  end = std::min(end, rows);
  begin = std::min(begin, end);
  const uint8_t* data = file.data(*info);
  return std::vector<uint8_t>(data + begin * row, data + end * row);
}

TEST_CASE(
    "sync: two trainer shards publish a run; regions take every step, miss steps, start fresh, or "
    "take a slice") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "run")) {
    INFO("store ", b.name, " ", b.url);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), TwoShards(), 0.005, 11);
    const std::string every = tmp / ("every-" + b.name), missed = tmp / ("missed-" + b.name);
    const std::string slice = tmp / ("slice-" + b.name);
    PullOptions slice_options;
    slice_options.tensors = "lm_head|layers\\.1\\.norm|embed";
    slice_options.row_begin = 9000;
    slice_options.row_end = 9100;
    uint64_t slice_fetched = 0, slice_objects_bytes = 0;
    for (uint64_t step = 0; step <= 6; ++step) {
      if (step > 0) run.Advance();
      run.Write(step);
      PublishStep(store, run, step);
      // A region that takes every step: one delta each (the first from the anchor).
      PullReport r;
      REQUIRE(Pull(store, every, PullOptions(), &r).ok());
      CHECK(r.to_step == step);
      CHECK(r.route == (step == 0
                            ? "anchor 0 -> 0"
                            : "chain " + std::to_string(step - 1) + " -> " + std::to_string(step)));
      CheckHolds(every, run, step);
      if (step == 1) {
        REQUIRE(PullStep(store, missed, 1, &r).ok());
        CheckHolds(missed, run, 1);
      }
      if (step == 2 || step == 6) {
        // A tensor-parallel rank's slice: rows 9000:9100 of lm_head and embed.
        PullOptions o = slice_options;
        o.step = step;
        REQUIRE(Pull(store, slice, o, &r).ok());
        CHECK(r.route == (step == 2 ? "anchor 0 -> 2" : "chain 2 -> 6"));
        const std::string got = slice + "/" + TrainerRun::FileName(1, 2);
        CHECK(Rows(got, "lm_head", 0, 100) == Rows(run.Path(step, 1), "lm_head", 9000, 9100));
        CHECK(Rows(got, "layers.1.norm", 0, 100) ==
              Rows(run.Path(step, 1), "layers.1.norm", 9000, 9100));
        CHECK(Rows(slice + "/" + TrainerRun::FileName(0, 2), "embed", 0, 100) ==
              Rows(run.Path(step, 0), "embed", 9000, 9100));
        safetensors::File file;
        REQUIRE(safetensors::File::Open(got, &file).ok());
        CHECK(file.tensors().size() == 2);  // lm_head and layers.1.norm, not layers.1.w
        if (step == 6) {
          slice_fetched = r.fetched_bytes;
          for (uint64_t s = 3; s <= 6; ++s) {
            StepManifest m;
            REQUIRE(ReadManifest(store, s, &m, nullptr).ok());
            for (const ShardRecord& rec : m.shards) slice_objects_bytes += rec.delta.size;
          }
        }
      }
    }
    // The slice fetched its pieces: one of lm_head's three, one of embed's two, and the
    // small tensors of shard 1 (a group may code them), and what lies in the gaps (under
    // 256 KiB) between them, not whole objects. (Publishers store pieces by row fraction,
    // so rows 9000:9100 sit among other tensors' middle pieces.)
    MESSAGE(b.name, ": slice pull 2 -> 6 fetched ", slice_fetched, " B of the deltas' ",
            slice_objects_bytes, " B");
    CHECK(slice_fetched * 4 < slice_objects_bytes * 3);

    // A region that missed steps 2..5 takes the chain from its step 1: cheaper than anchor 6.
    PullReport r;
    REQUIRE(Pull(store, missed, PullOptions(), &r).ok());
    CHECK(r.route == "chain 1 -> 6");
    CHECK(r.steps == std::vector<uint64_t>({2, 3, 4, 5, 6}));
    CheckHolds(missed, run, 6);
    // A fresh region starts from the nearest anchor.
    const std::string fresh = tmp / ("fresh-" + b.name);
    REQUIRE(PullStep(store, fresh, 5, &r).ok());
    CHECK(r.route == "anchor 3 -> 5");
    CheckHolds(fresh, run, 5);
    REQUIRE(Pull(store, fresh, PullOptions(), &r).ok());
    CHECK(r.route == "chain 5 -> 6");
    REQUIRE(Pull(store, fresh, PullOptions(), &r).ok());
    CHECK(r.up_to_date);
    CheckHolds(fresh, run, 6);
    // Back to an older step: from its anchor (the chain runs forward only).
    REQUIRE(PullStep(store, fresh, 4, &r).ok());
    CHECK(r.route == "anchor 3 -> 4");
    CheckHolds(fresh, run, 4);

    // log: every step, anchors every 3.
    std::vector<StepListing> steps;
    REQUIRE(ListSteps(store, &steps).ok());
    REQUIRE(steps.size() == 7);
    for (const StepListing& l : steps) {
      CHECK(l.committed);
      CHECK(l.manifest.anchor() == (l.step % 3 == 0));
      CHECK(l.manifest.anchor_step == l.step / 3 * 3);
      CHECK(l.manifest.base_step == (l.step == 0 ? kNoStep : l.step - 1));
    }

    // prune: keeping one anchor keeps the one before it too (steps 3..6); a region at a
    // pruned step comes back through an anchor.
    PruneResult pruned;
    // Every step was committed within the hour: with --min-age 1h, the chain of each back
    // to its anchor stays (step 0 on).
    REQUIRE(Prune(store, 1, false, &pruned, 3600).ok());
    CHECK(pruned.keep_from == 0);
    CHECK(pruned.deleted_steps.empty());
    REQUIRE(Prune(store, 1, false, &pruned).ok());
    CHECK(pruned.keep_from == 3);
    CHECK(pruned.deleted_steps == std::vector<uint64_t>({0, 1, 2}));
    REQUIRE(ListSteps(store, &steps).ok());
    CHECK(steps.size() == 4);
    const std::string old = tmp / ("old-" + b.name);
    REQUIRE(PullStep(store, old, 1, &r).code() == ErrorCode::kNotFound);
    run.Advance();
    run.Write(7);
    PublishStep(store, run, 7);
    REQUIRE(Pull(store, every, PullOptions(), &r).ok());
    CHECK(r.route == "chain 6 -> 7");
    CheckHolds(every, run, 7);
  }
}

TEST_CASE("sync: a region whose chain was pruned recovers through an anchor") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "pruned")) {
    INFO("store ", b.name);
    TrainerRun run(tmp / ("trainer-" + b.name), {{{"w", {512, 64}}, {"n", {64}}}}, 0.01, 5);
    const std::string dir = tmp / ("region-" + b.name);
    for (uint64_t step = 0; step <= 7; ++step) {
      if (step > 0) run.Advance();
      run.Write(step);
      PublishStep(b.store.get(), run, step);
      if (step == 1) {
        PullReport r;
        REQUIRE(PullStep(b.store.get(), dir, 1, &r).ok());
      }
    }
    PruneResult pruned;
    REQUIRE(Prune(b.store.get(), 2, false, &pruned).ok());  // anchors 6 and 3 stay
    CHECK(pruned.keep_from == 3);
    PullReport r;
    REQUIRE(Pull(b.store.get(), dir, PullOptions(), &r).ok());
    CHECK(r.from_step == 1);
    CHECK(r.route == "anchor 6 -> 7");
    CheckHolds(dir, run, 7);
  }
}

TEST_CASE(
    "sync: prune racing a slow pull: the pull replans through an anchor; with --min-age the chain "
    "stays") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "prune-race")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), {{{"w", {512, 64}}, {"n", {64}}}}, 0.01, 7);
    const std::string slow = tmp / ("slow-" + b.name), kept = tmp / ("kept-" + b.name);
    for (uint64_t step = 0; step <= 10; ++step) {  // anchors 0, 3, 6, 9
      if (step > 0) run.Advance();
      run.Write(step);
      PublishStep(store, run, step);
      if (step == 4) {
        PullReport r;
        REQUIRE(PullStep(store, slow, 4, &r).ok());
        REQUIRE(PullStep(store, kept, 4, &r).ok());
      }
    }
    // Both regions plan the chain 4 -> 10; a prune runs while they fetch.
    PullOptions o;
    double min_age = 0;
    std::vector<uint64_t> deleted;  // by the prune during the first plan
    int plans = 0;
    o.hook = [&](const char* stage) {
      if (std::string(stage) == "planned" && plans++ == 0) {
        PruneResult pruned;
        REQUIRE(Prune(store, 1, false, &pruned, min_age).ok());
        deleted = pruned.deleted_steps;
      }
      return Status::Ok();
    };
    min_age = 3600;
    PullReport r;
    REQUIRE(Pull(store, kept, o, &r).ok());
    CHECK(r.route == "chain 4 -> 10");
    CHECK(deleted.empty());
    CheckHolds(kept, run, 10);
    min_age = 0;
    plans = 0;
    REQUIRE(Pull(store, slow, o, &r).ok());
    CHECK(deleted == std::vector<uint64_t>({0, 1, 2, 3, 4, 5}));
    CHECK(r.route == "anchor 9 -> 10");  // the chain's steps 5.. were gone: replanned
    CheckHolds(slow, run, 10);
  }
}

TEST_CASE("sync: publishing checks its base and is idempotent") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "publish")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), {{{"w", {512, 64}}}}, 0.01, 3);
    run.Write(0);
    run.Advance();
    run.Write(1);
    run.Advance();
    run.Write(2);
    PublishReport r;
    // No base step published yet.
    Status s = Publish(store, Shard(run, 1, 0, true), &r);
    CHECK(s.code() == ErrorCode::kNotFound);
    CHECK(s.message().find("step 0 is not committed") != std::string::npos);
    CHECK(s.message().find("never published it") != std::string::npos);
    REQUIRE(Publish(store, Shard(run, 0, 0, false), &r).ok());
    CHECK(r.committed);
    CHECK(r.record.anchor.present());
    CHECK(!r.record.delta.present());
    // A --prev that is not what was published for the base step.
    PublishOptions wrong = Shard(run, 1, 0, true);
    wrong.prev = run.Path(2, 0);
    s = Publish(store, wrong, &r);
    CHECK(s.code() == ErrorCode::kChecksumMismatch);
    CHECK(s.message().find("its tensors (names, order or contents) differ") != std::string::npos);
    StepManifest m;
    CHECK(ReadManifest(store, 1, &m, nullptr).code() == ErrorCode::kNotFound);
    // The right one, twice: the second is a no-op.
    REQUIRE(Publish(store, Shard(run, 1, 0, true), &r).ok());
    CHECK(r.committed);
    CHECK(r.record.delta.present());
    CHECK(!r.record.anchor.present());
    REQUIRE(Publish(store, Shard(run, 1, 0, true), &r).ok());
    // Other contents for a published step: refused before anything is uploaded.
    std::vector<ObjectInfo> before, after;
    REQUIRE(store->List("", &before).ok());
    PublishOptions other = Shard(run, 1, 0, true);
    other.next = run.Path(2, 0);
    s = Publish(store, other, &r);
    CHECK(s.code() == ErrorCode::kAlreadyExists);
    CHECK(s.message().find("its tensors (names, order or contents) differ: tensors_xxh3") !=
          std::string::npos);
    other = Shard(run, 1, 0, true);
    other.base_step = 0;
    other.step = 1;
    other.prev.clear();  // an anchor alone where a delta was published
    s = Publish(store, other, &r);
    CHECK(s.code() == ErrorCode::kAlreadyExists);
    CHECK(s.message().find("the base was step 0, now none") != std::string::npos);
    // The same file coded otherwise (effort, an anchor asked for now): a no-op that keeps
    // the first publish's objects and says so.
    other = Shard(run, 1, 0, true);
    other.checkpoint.effort = 3;
    REQUIRE(Publish(store, other, &r).ok());
    CHECK(r.already_published);
    CHECK(r.uploaded_bytes == 0);
    other.anchor_every = 1;
    REQUIRE(Publish(store, other, &r).ok());
    CHECK(r.already_published);
    CHECK(!r.record.anchor.present());
    CHECK(r.note == "published first without an anchor, kept");
    REQUIRE(store->List("", &after).ok());
    CHECK(after.size() == before.size());
    // A file name a region could not hold.
    const std::string hidden = tmp / (".hidden-" + b.name + ".safetensors");
    fs::copy_file(run.Path(2, 0), hidden);
    other = Shard(run, 2, 0, true);
    other.next = hidden;
    CHECK(Publish(store, other, &r).code() == ErrorCode::kInvalidArgument);
    // Bad arguments.
    PublishOptions bad = Shard(run, 0, 0, true);
    CHECK(Publish(store, bad, &r).code() == ErrorCode::kInvalidArgument);
    bad = Shard(run, 2, 0, true);
    bad.shard = 1;
    CHECK(Publish(store, bad, &r).code() == ErrorCode::kInvalidArgument);
    uint64_t latest = 0;
    REQUIRE(ReadLatest(store, &latest, nullptr).ok());
    CHECK(latest == 1);
  }
}

// Writes the run's model.safetensors.index.json of `step` beside its shard files.
std::string WriteIndex(const TrainerRun& run, uint64_t step, const std::string& extra) {
  std::string json =
      "{\"metadata\": {\"step\": " + std::to_string(step) + extra + "}, \"weight_map\": {";
  for (size_t k = 0; k < run.shards(); ++k) {
    json += (k ? ", " : "") + std::string("\"w") + std::to_string(k) + "\": \"" +
            TrainerRun::FileName(k, run.shards()) + "\"";
  }
  json += "}}\n";
  const std::string path = (fs::path(run.Path(step, 0)).parent_path() / kIndexFileName).string();
  std::ofstream(path) << json;
  return path;
}

TEST_CASE("sync: a sharded checkpoint's index travels with full pulls, verbatim") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "index")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("run-" + b.name), {{{"w0", {256, 64}}}, {{"w1", {128, 64}}}}, 0.02, 7);
    const std::string dir = tmp / ("region-" + b.name), part = tmp / ("part-" + b.name);
    PullReport r;
    PullOptions slice;
    slice.tensors = "w1";
    for (uint64_t step = 0; step <= 2; ++step) {
      if (step > 0) run.Advance();
      run.Write(step);
      // Found beside each shard's file (step 2 has none: the region's copy goes too).
      const std::string index =
          step < 2 ? WriteIndex(run, step, step == 1 ? ", \"x\": 1" : "") : "";
      PublishStep(store, run, step);
      REQUIRE(PullStep(store, dir, step, &r).ok());
      REQUIRE(PullStep(store, part, step, &r, slice).ok());
      if (step < 2) {
        CHECK(test::ReadBytes(dir + "/" + kIndexFileName) == test::ReadBytes(index));
      } else {
        CHECK(!fs::exists(dir + "/" + kIndexFileName));
      }
      CHECK(!fs::exists(part + "/" + kIndexFileName));  // a slice: no index of every tensor
      uint64_t held = kNoStep;
      REQUIRE(DirectoryStep(dir, &held).ok());
      CHECK(held == step);
    }
    // An index that is not one is refused before anything is uploaded.
    PublishOptions bad = Shard(run, 2, 0, true);
    bad.index = tmp / ("bad-index-" + b.name);
    std::ofstream(bad.index) << "{\"weights\": {}}";
    PublishReport report;
    CHECK(Publish(store, bad, &report).code() == ErrorCode::kInvalidArgument);
  }
}

TEST_CASE(
    "sync: a first pull that fails leaves nothing; a folder of other files is taken only when "
    "forced") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "first")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("run-" + b.name), {{{"w", {256, 64}}}}, 0.02, 9);
    run.Write(0);
    PublishStep(store, run, 0);
    PullReport r;
    // A step that does not exist: neither the new directory nor its lock stays.
    const std::string fresh = tmp / ("fresh-" + b.name);
    CHECK(PullStep(store, fresh, 5, &r).code() == ErrorCode::kNotFound);
    CHECK(!fs::exists(fresh));
    // A second pull into the same new directory while the first holds its lock is refused,
    // and its failure never removes the first one's directory.
    const std::string racing = tmp / ("racing-" + b.name);
    PullOptions first;
    first.hook = [&](const char* stage) {
      if (std::string(stage) != "planned") return Status::Ok();
      PullReport second;
      const Status refused = PullStep(store, racing, 0, &second);
      CHECK(refused.code() == ErrorCode::kInvalidArgument);
      CHECK(fs::is_directory(racing + "/.arc_v3"));
      return Status::Ok();
    };
    REQUIRE(PullStep(store, racing, 0, &r, first).ok());
    CheckHolds(racing, run, 0);
    const std::string empty = tmp / ("empty-" + b.name);
    fs::create_directories(empty);
    CHECK(PullStep(store, empty, 5, &r).code() == ErrorCode::kNotFound);
    CHECK(fs::is_empty(empty));
    // A folder holding the user's own files.
    const std::string mine = tmp / ("mine-" + b.name);
    fs::create_directories(mine);
    std::ofstream(mine + "/notes.txt") << "mine";
    std::ofstream(mine + "/" + TrainerRun::FileName(0, 1)) << "mine too";
    const auto before = Snapshot(mine);
    const Status s = PullStep(store, mine, 0, &r);
    CHECK(s.code() == ErrorCode::kAlreadyExists);
    CHECK(s.message().find("never pulled into") != std::string::npos);
    CHECK(Snapshot(mine) == before);
    PullOptions force;
    force.force = true;
    REQUIRE(PullStep(store, mine, 0, &r, force).ok());
    CHECK(test::ReadBytes(mine + "/notes.txt") == std::vector<uint8_t>{'m', 'i', 'n', 'e'});
    CHECK(test::ReadBytes(mine + "/" + TrainerRun::FileName(0, 1)) ==
          test::ReadBytes(run.Path(0, 0)));
    // Once pulled into, it is a region's directory: no force needed.
    REQUIRE(PullStep(store, mine, 0, &r).ok());
    CHECK(r.up_to_date);
  }
}

TEST_CASE("sync: a region moves to another store's run: its step there is another step") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "move")) {
    INFO("store ", b.name);
    // Two stores (two prefixes) of runs with the same step numbers but other weights.
    std::unique_ptr<Store> other;
    if (b.name == "local") fs::create_directories(b.url + "-other");
    REQUIRE(OpenStore(b.url + "-other", test::FastRetries(), &other).ok());
    TrainerRun first(tmp / ("first-" + b.name), {{{"w", {512, 64}}}}, 0.01, 1);
    TrainerRun second(tmp / ("second-" + b.name), {{{"w", {512, 64}}}}, 0.01, 2);
    for (uint64_t step = 0; step <= 4; ++step) {
      if (step > 0) {
        first.Advance();
        second.Advance();
      }
      first.Write(step);
      second.Write(step);
      PublishStep(b.store.get(), first, step);
      PublishStep(other.get(), second, step);
    }
    const std::string dir = tmp / ("region-" + b.name);
    PullReport r;
    REQUIRE(PullStep(b.store.get(), dir, 2, &r).ok());
    REQUIRE(PullStep(other.get(), dir, 2, &r).ok());
    CHECK(r.route == "anchor 0 -> 2");
    CheckHolds(dir, second, 2);
    REQUIRE(PullStep(other.get(), dir, 4, &r).ok());
    CHECK(r.route == "chain 2 -> 4");
    CheckHolds(dir, second, 4);
  }
}

TEST_CASE("sync: racing committers of one step write one root") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "commit-race")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), {{{"a", {256, 64}}}, {{"b", {256, 64}}}}, 0.01, 9);
    for (uint64_t step = 0; step < 4; ++step) {
      if (step > 0) run.Advance();
      run.Write(step);
      // Both shards publish at once while six more processes' worth of committers race.
      std::atomic<bool> done{false};
      std::vector<Status> commits(6);
      std::vector<std::thread> committers;
      for (size_t i = 0; i < commits.size(); ++i) {
        committers.emplace_back([&, i] {
          CommitResult c;
          while (!done && (commits[i] = CommitStep(store, step, 2, kDefaultIncarnation, &c)).ok() &&
                 !c.committed) {}
        });
      }
      PublishStep(store, run, step, /*raced=*/true);
      done = true;
      for (auto& t : committers) t.join();
      for (const Status& s : commits) CHECK(s.ok());
      // One root, over one group index, each written by the one racer that claimed it.
      std::vector<ObjectInfo> objects;
      REQUIRE(store->List(GroupIndexPrefix(step, 2, kDefaultIncarnation), &objects).ok());
      std::set<std::string> keys;
      for (const ObjectInfo& o : objects) keys.insert(o.key);
      const std::string group = GroupIndexKey(step, 2, kDefaultIncarnation, 0);
      CHECK(keys ==
            std::set<std::string>{group, group + ".claim",
                                  GroupIndexPrefix(step, 2, kDefaultIncarnation) + "root.claim"});
      StepManifest m;
      REQUIRE(ReadManifest(store, step, &m, nullptr).ok());
      CHECK(m.count == 2);
    }
    PullReport r;
    REQUIRE(Pull(store, tmp / ("region-" + b.name), PullOptions(), &r).ok());
    CheckHolds(tmp / ("region-" + b.name), run, 3);
  }
}

// Steps 0 and 1 of a two-shard run published, `region` holding step 1, and step 2 written
// but published by shard 0 only (its report).
PublishReport HalfAStep(Store* store, TrainerRun* run, const std::string& region) {
  for (uint64_t step = 0; step < 2; ++step) {
    if (step > 0) run->Advance();
    run->Write(step);
    PublishStep(store, *run, step);
  }
  PullReport pulled;
  REQUIRE(PullStep(store, region, 1, &pulled).ok());
  run->Advance();
  run->Write(2);
  PublishReport r;
  REQUIRE(Publish(store, Shard(*run, 2, 0, true), &r).ok());
  CHECK(r.pending == "waiting for shard 1 of 2");
  return r;
}

TEST_CASE(
    "sync: a trainer restarted mid-step publishes under a new incarnation; a step commits one "
    "incarnation's records, never a mix; the shard count changes with an anchor step") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "incarnations")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), {{{"a", {256, 64}}}, {{"b", {512, 64}}}}, 0.02, 17);
    const std::string region = tmp / ("region-" + b.name);
    // The first start writes step 2 of shard 0, then dies; its step 2 of shard 1 survives
    // on a slow node (a zombie that publishes later).
    PublishReport r = HalfAStep(store, &run, region);
    PullReport pulled;
    const std::string zombie = tmp / ("zombie-" + b.name);
    fs::create_directories(zombie);
    for (size_t k = 0; k < 2; ++k)
      fs::copy_file(run.Path(2, k), zombie + "/" + TrainerRun::FileName(k, 2));
    // The restarted trainer computes another step 2. Under the old incarnation it is
    // refused, naming the way out; under a new one its records supersede the stale one.
    run.Advance();
    run.Write(2);
    Status s = Publish(store, Shard(run, 2, 0, true), &r);
    CHECK(s.code() == ErrorCode::kAlreadyExists);
    CHECK(s.message().find("a new incarnation") != std::string::npos);
    CHECK(s.message().find("--") == std::string::npos);  // the library names no flag
    for (size_t k = 0; k < 2; ++k) {
      PublishOptions o = Shard(run, 2, k, true);
      o.incarnation = "restart-1";
      REQUIRE(Publish(store, o, &r).ok());
      CHECK(r.committed == (k == 1));
    }
    StepManifest root;
    REQUIRE(ReadManifest(store, 2, &root, nullptr).ok());
    CHECK(root.incarnation == "restart-1");
    for (const ShardRecord& record : root.shards) CHECK(record.incarnation == "restart-1");
    // The zombie's shard 1 of the first start: the committed step never changes.
    PublishOptions late = Shard(run, 2, 1, true);
    late.next = zombie + "/" + TrainerRun::FileName(1, 2);
    s = Publish(store, late, &r);
    INFO("zombie: ", s.ToString());
    CHECK(s.code() == ErrorCode::kAlreadyExists);
    CHECK(s.message().find("a committed step never changes") != std::string::npos);
    // The zombie goes on to step 3 from its own step 2: deltas against a base that is not
    // the committed one never commit.
    for (size_t k = 0; k < 2; ++k) {
      PublishOptions on = Shard(run, 3, k, true);
      on.prev = on.next = zombie + "/" + TrainerRun::FileName(k, 2);
      s = Publish(store, on, &r);
    }
    INFO("zombie step 3: ", s.ToString());
    CHECK(s.code() == ErrorCode::kChecksumMismatch);
    CHECK(s.message().find("publish step 3 as an anchor") != std::string::npos);
    // Step 3 goes on from the restarted trainer's step 2; the region gets both, bit for bit.
    run.Advance();
    run.Write(3);
    for (size_t k = 0; k < 2; ++k) {
      PublishOptions o = Shard(run, 3, k, true);
      o.incarnation = "restart-1";
      REQUIRE(Publish(store, o, &r).ok());
    }
    REQUIRE(PullStep(store, region, 3, &pulled).ok());
    CHECK(pulled.route == "chain 1 -> 3");
    CheckHolds(region, run, 3);

    // Three shards from step 4 on: an anchor step needs nothing more.
    TrainerRun three(tmp / ("three-" + b.name),
                     {{{"a", {256, 64}}}, {{"b", {128, 64}}}, {{"c", {64, 64}}}}, 0.02, 5);
    three.Write(4);
    for (size_t k = 0; k < 3; ++k) REQUIRE(Publish(store, Shard(three, 4, k, false), &r).ok());
    CHECK(r.committed);
    REQUIRE(Pull(store, region, PullOptions(), &pulled).ok());
    CHECK(pulled.route == "anchor 4 -> 4");
    CheckHolds(region, three, 4);
  }
}

TEST_CASE(
    "sync: a shard that dies before its record leaves its step uncommitted; the next step, "
    "published "
    "against the last committed one, commits and regions skip the dead step") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "dead-shard")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), {{{"a", {256, 64}}}, {{"b", {128, 64}}}}, 0.02, 31);
    const std::string region = tmp / ("region-" + b.name);
    // Step 2: shard 1 dies before its record. The step stays uncommitted; pullers never see it.
    PublishReport r = HalfAStep(store, &run, region);
    PullReport pulled;
    // Step 3 goes on against step 1, the last committed one.
    run.Advance();
    run.Write(3);
    for (size_t k = 0; k < 2; ++k) {
      PublishOptions o = Shard(run, 3, k, true);
      o.prev = run.Path(1, k);
      o.base_step = 1;
      REQUIRE(Publish(store, o, &r).ok());
    }
    CHECK(r.committed);
    StepManifest root;
    REQUIRE(ReadRoot(store, 3, &root, nullptr).ok());
    CHECK(root.base_step == 1);
    CHECK(ReadRoot(store, 2, &root, nullptr).code() == ErrorCode::kNotFound);
    REQUIRE(Pull(store, region, PullOptions(), &pulled).ok());
    CHECK(pulled.route == "chain 1 -> 3");
    CHECK(pulled.steps == std::vector<uint64_t>({3}));
    CheckHolds(region, run, 3);
    std::vector<StepListing> steps;
    REQUIRE(ListSteps(store, &steps).ok());
    REQUIRE(steps.size() == 4);
    CHECK(!steps[2].committed);
  }
}

TEST_CASE("sync: a store arc_v3 1.x published to is refused, naming the versions") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "version-1")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    const std::string v1 =
        "{\"format\":\"arc_v3-sync\",\"version\":1,\"kind\":\"latest\",\"step\":3}\n";
    REQUIRE(store
                ->Put(kLatestKey, reinterpret_cast<const uint8_t*>(v1.data()), v1.size(),
                      PutMode::kOverwrite)
                .ok());
    PullReport pulled;
    Status s = Pull(store, tmp / ("region-" + b.name), PullOptions(), &pulled);
    CHECK(s.code() == ErrorCode::kUnsupportedVersion);
    CHECK(s.message().find("sync protocol version 1; this build reads version 2") !=
          std::string::npos);
    CHECK(s.message().find("CHANGELOG") != std::string::npos);
    CHECK(!fs::exists(tmp / ("region-" + b.name)));
    TrainerRun run(tmp / ("trainer-" + b.name), {{{"a", {64, 64}}}}, 0.02, 3);
    run.Write(4);
    PublishReport r;
    s = Publish(store, Shard(run, 4, 0, false), &r);
    CHECK(s.code() == ErrorCode::kUnsupportedVersion);
    StepManifest root;
    CHECK(ReadRoot(store, 4, &root, nullptr).code() == ErrorCode::kNotFound);  // nothing committed
  }
}

TEST_CASE(
    "sync: a completer that dies leaves a claim; once it is stale, the next step's shards finish "
    "the step") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "claims")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), {{{"a", {256, 64}}}, {{"b", {128, 64}}}}, 0.02, 23);
    run.Write(0);
    PublishStep(store, run, 0);
    run.Advance();
    run.Write(1);
    // A shard of step 1 claimed its group and died before writing the group index.
    const auto claim = [&](double at) {
      const std::string json = "{\"claimed_at\": " + std::to_string(at) + "}\n";
      REQUIRE(store
                  ->Put(GroupIndexKey(1, 2, kDefaultIncarnation, 0) + ".claim",
                        reinterpret_cast<const uint8_t*>(json.data()), json.size(),
                        PutMode::kOverwrite)
                  .ok());
    };
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    claim(now);
    PublishReport r;
    for (size_t k = 0; k < 2; ++k) REQUIRE(Publish(store, Shard(run, 1, k, true), &r).ok());
    CHECK(!r.committed);
    CHECK(r.pending == "another shard of group 0 is completing it");
    // A minute later the claim is stale: step 2's last shard completes step 1 too.
    claim(now - 60);
    run.Advance();
    run.Write(2);
    for (size_t k = 0; k < 2; ++k) REQUIRE(Publish(store, Shard(run, 2, k, true), &r).ok());
    CHECK(r.committed);
    const std::string region = tmp / ("region-" + b.name);
    PullReport pulled;
    REQUIRE(PullStep(store, region, 1, &pulled).ok());
    CheckHolds(region, run, 1);
    REQUIRE(Pull(store, region, PullOptions(), &pulled).ok());
    CHECK(pulled.route == "chain 1 -> 2");
    CheckHolds(region, run, 2);
    // Step 4 completes while step 3's root is claimed by a committer that then dies: step
    // 4's committer stops at its base and lets go of its own claim, so that step 3's
    // committer (here, once that claim is stale) goes on to commit step 4 at once.
    run.Advance();
    run.Write(3);
    run.Advance();
    run.Write(4);
    const auto claim_root = [&](double at) {
      const std::string json = "{\"claimed_at\": " + std::to_string(at) + "}\n";
      REQUIRE(store
                  ->Put(GroupIndexPrefix(3, 2, kDefaultIncarnation) + "root.claim",
                        reinterpret_cast<const uint8_t*>(json.data()), json.size(),
                        PutMode::kOverwrite)
                  .ok());
    };
    claim_root(now);
    for (size_t k = 0; k < 2; ++k) REQUIRE(Publish(store, Shard(run, 3, k, true), &r).ok());
    CHECK(r.pending == "another shard is committing the step");
    for (size_t k = 0; k < 2; ++k) REQUIRE(Publish(store, Shard(run, 4, k, true), &r).ok());
    CHECK(!r.committed);
    CHECK(r.pending == "its base step 3 is not committed: another shard is committing the step");
    claim_root(now - 60);
    CommitResult c;
    REQUIRE(CommitStep(store, 3, 2, kDefaultIncarnation, &c).ok());
    CHECK(c.committed);
    StepManifest root;
    CHECK(ReadRoot(store, 4, &root, nullptr).ok());
    REQUIRE(Pull(store, region, PullOptions(), &pulled).ok());
    CHECK(pulled.route == "chain 2 -> 4");
    CheckHolds(region, run, 4);
  }
}

// A store that forwards to another and counts the requests it is asked for, by kind.
class CountingStore : public Store {
 public:
  explicit CountingStore(Store* inner) : inner_(inner) {}
  const std::string& url() const override { return inner_->url(); }
  bool writable() const override { return inner_->writable(); }
  bool listable() const override { return inner_->listable(); }
  Status Head(const std::string& key, ObjectInfo* info) override {
    ++heads;
    return inner_->Head(key, info);
  }
  Status GetIfChanged(const std::string& key, const std::string& etag, uint64_t max_size,
                      std::vector<uint8_t>* data, ObjectInfo* info, bool* changed) override {
    ++gets;
    return inner_->GetIfChanged(key, etag, max_size, data, info, changed);
  }
  Status GetRange(const std::string& key, uint64_t offset, uint64_t size, uint8_t* out) override {
    ++gets;
    return inner_->GetRange(key, offset, size, out);
  }
  Status Put(const std::string& key, const uint8_t* data, uint64_t size, PutMode mode) override {
    ++puts;
    return inner_->Put(key, data, size, mode);
  }
  Status PutFile(const std::string& key, const std::string& path, PutMode mode) override {
    ++puts;
    return inner_->PutFile(key, path, mode);
  }
  Status List(const std::string& prefix, std::vector<ObjectInfo>* objects) override {
    ++lists;
    return inner_->List(prefix, objects);
  }
  Status Delete(const std::string& key) override { return inner_->Delete(key); }
  uint64_t total() const { return heads + gets + puts + lists; }
  std::atomic<uint64_t> heads{0}, gets{0}, puts{0}, lists{0};

 private:
  Store* inner_;
};

// A store that holds back the first download of an object other than the first one asked
// for until `watch` exists (at most 30 s), and with `damage` flips the first byte of every
// other object: with one connection, a pull that decodes objects as they arrive has
// finished the first shard's file in its stage by then; one that fetches everything
// before decoding waits out the 30 s.
class HeldStore : public CountingStore {
 public:
  HeldStore(Store* inner, std::string watch, bool damage)
      : CountingStore(inner), watch_(std::move(watch)), damage_(damage) {}
  Status GetRange(const std::string& key, uint64_t offset, uint64_t size, uint8_t* out) override {
    bool other = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (first_.empty()) first_ = key;
      other = key != first_;
      if (other && !held_) {
        held_ = true;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (!fs::exists(watch_) && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        released_by_decode = fs::exists(watch_);
      }
    }
    const Status s = CountingStore::GetRange(key, offset, size, out);
    if (s.ok() && other && damage_ && offset == 0 && size > 0) out[0] ^= 0xFF;
    return s;
  }
  bool released_by_decode = false;

 private:
  const std::string watch_;
  const bool damage_;
  std::mutex mutex_;
  std::string first_;
  bool held_ = false;
};

TEST_CASE(
    "sync: a full pull decodes each object as it arrives; one damaged after the first leaves DIR "
    "as it was") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "overlap")) {
    INFO("store ", b.name);
    TrainerRun run(tmp / ("trainer-" + b.name), TwoShards(), 0.02, 9);
    run.Write(0);
    PublishStep(b.store.get(), run, 0);
    const std::string region = tmp / ("region-" + b.name);
    const std::string first_file =
        region + "/" + kStateDir + "/stage/" + TrainerRun::FileName(0, 2);
    PullOptions one_connection;
    one_connection.transfers = test::FastRetries();
    one_connection.transfers->connections = 1;

    // Shard 0's file is decoded while shard 1's object is still to come.
    HeldStore held(b.store.get(), first_file, /*damage=*/false);
    PullReport r;
    REQUIRE(Pull(&held, region, one_connection, &r).ok());
    CHECK(held.released_by_decode);
    CheckHolds(region, run, 0);
    CHECK(r.fetched_objects == 2);
    CHECK(r.wait_seconds >= 0);

    // Step 1's second object arrives damaged after shard 0 was decoded: both routes meet it,
    // the pull fails with what the chain met, and DIR keeps step 0.
    run.Advance();
    run.Write(1);
    PublishStep(b.store.get(), run, 1);
    HeldStore damaged(b.store.get(), first_file, /*damage=*/true);
    const Status s = Pull(&damaged, region, one_connection, &r);
    INFO(s.ToString());
    CHECK(damaged.released_by_decode);
    CHECK(s.code() == ErrorCode::kCorruptChunk);
    CHECK(s.message().find("does not match its record") != std::string::npos);
    CheckHolds(region, run, 0);
    CHECK_FALSE(fs::exists(region + "/" + kStateDir + "/stage"));
    REQUIRE(Pull(b.store.get(), region, PullOptions(), &r).ok());
    CheckHolds(region, run, 1);
  }
}

TEST_CASE(
    "sync: N shards commit a step in O(N) requests; a pull of one shard's tensor reads only its "
    "objects") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "commit-cost")) {
    INFO("store ", b.name);
    CountingStore store(b.store.get());
    constexpr size_t kShards = 48;
    std::vector<std::vector<test::TensorSpec>> shards(kShards);
    for (size_t k = 0; k < kShards; ++k) shards[k] = {{"w" + std::to_string(k), {16, 64}}};
    TrainerRun run(tmp / ("trainer-" + b.name), shards, 0.02, 5);
    for (uint64_t step = 0; step < 2; ++step) {
      if (step > 0) run.Advance();
      run.Write(step);
      const uint64_t before = store.total();
      // One shard after the other: every shard but the last finds the step incomplete.
      for (size_t k = 0; k < kShards; ++k) {
        PublishReport r;
        REQUIRE(Publish(&store, Shard(run, step, k, step > 0), &r).ok());
        CHECK(r.committed == (k == kShards - 1));
      }
      const uint64_t requests = store.total() - before;
      INFO("step ", step, ": ", requests, " requests for ", kShards, " shards");
      // Each shard: its base record, its own record's absence, its objects, its record,
      // the manifest's absence and a listing; the committer reads every record once.
      CHECK(requests <= 9 * kShards);
    }
    PullReport r;
    uint64_t before = store.total();
    REQUIRE(Pull(&store, tmp / ("region-" + b.name), PullOptions(), &r).ok());
    CheckHolds(tmp / ("region-" + b.name), run, 1);
    const uint64_t full_requests = store.total() - before, full_bytes = r.fetched_bytes;
    // Per step applied (here the anchor of step 0, then step 1's deltas): a record and an
    // object per shard, a group index per 32 shards, the root.
    INFO("full pull of ", r.steps.size(), " steps: ", full_requests, " requests");
    CHECK(r.steps.size() == 2);
    CHECK(full_requests <= r.steps.size() * (2 * kShards + 50));
    // The tensor of one shard: only that shard's objects are read (a head and its pieces
    // per step), besides `latest` and the two manifests.
    PullOptions one;
    one.tensors = "w7";
    const std::string slice = tmp / ("slice-" + b.name);
    before = store.total();
    REQUIRE(Pull(&store, slice, one, &r).ok());
    INFO("partial pull: ", store.total() - before, " requests, ", r.fetched_bytes, " of ",
         full_bytes, " bytes");
    CHECK(store.total() - before <= 4 + 30);
    CHECK(r.fetched_objects == 2);
    for (size_t k = 0; k < kShards; ++k) {
      safetensors::File file;
      REQUIRE(safetensors::File::Open(slice + "/" + TrainerRun::FileName(k, kShards), &file).ok());
      CHECK(file.tensors().size() == (k == 7 ? 1u : 0u));
      if (k == 7) {
        CHECK(Rows(slice + "/" + TrainerRun::FileName(k, kShards), "w7", 0, 16) ==
              Rows(run.Path(1, 7), "w7", 0, 16));
      }
    }
    // The step's two layouts (one per group of 32 shards) stay with the region: the next
    // step costs `latest`, its root, one group index, and the shard's record, head and piece.
    size_t cached = 0;
    for (const auto& e : fs::directory_iterator(slice + "/.arc_v3/layouts"))
      cached += e.is_regular_file();
    CHECK(cached == 2);
    run.Advance();
    run.Write(2);
    PublishReport published;
    for (size_t k = 0; k < kShards; ++k)
      REQUIRE(Publish(&store, Shard(run, 2, k, true), &published).ok());
    before = store.total();
    REQUIRE(Pull(&store, slice, one, &r).ok());
    INFO("next step: ", store.total() - before, " requests");
    CHECK(r.route == "chain 1 -> 2");
    CHECK(store.total() - before <= 7);  // and a HEAD for a later root
    CHECK(Rows(slice + "/" + TrainerRun::FileName(7, kShards), "w7", 0, 16) ==
          Rows(run.Path(2, 7), "w7", 0, 16));
  }
}

TEST_CASE(
    "sync: a row slice reads each shard object in a few ranges: publishers store pieces by row "
    "fraction") {
  TempDir tmp;
  for (Backend& b : test::Backends(tmp, "row-ranges")) {
    INFO("store ", b.name);
    CountingStore store(b.store.get());
    // A shard of 100 tensors: 12 of two 2^21-element pieces each (an anchor's pieces are
    // megabytes, so in manifest order rows [0, 1/8) of every tensor would be 12 ranges
    // apart), 86 of one piece and two small ones.
    std::vector<test::TensorSpec> tensors;
    for (int i = 0; i < 98; ++i) {
      tensors.push_back(
          {"layers." + std::to_string(i) + ".w",
           i % 8 == 0 ? std::vector<uint64_t>{16384, 256} : std::vector<uint64_t>{256, 512}});
    }
    tensors.push_back({"norm.a", {256}});
    tensors.push_back({"norm.b", {256}});
    REQUIRE(tensors.size() == 100);
    TrainerRun run(tmp / ("trainer-" + b.name), {tensors}, 0.02, 29);
    run.Write(0);
    PublishReport published;
    REQUIRE(Publish(&store, Shard(run, 0, 0, false), &published).ok());
    PullOptions slice;
    slice.row_begin = 0;
    slice.row_end = 16384 / 8;
    const std::string dir = tmp / ("slice-" + b.name);
    const uint64_t before = store.gets;
    PullReport r;
    REQUIRE(Pull(&store, dir, slice, &r).ok());
    // latest, the root, its layout, group index and record, the object's head, and its ranges.
    const uint64_t ranges = store.gets - before - 6;
    INFO("ranges: ", ranges, ", bytes ", r.fetched_bytes, " of ", published.record.anchor.size);
    CHECK(ranges <= 4);
    // The first of each two pieces and the one-piece tensors: 59% of the tensors' bytes.
    CHECK(r.fetched_bytes < published.record.anchor.size * 2 / 3);
    for (const test::TensorSpec& t : tensors) {
      const uint64_t rows = std::min<uint64_t>(t.shape[0], 2048);
      CHECK(Rows(dir + "/" + TrainerRun::FileName(0, 1), t.name, 0, rows) ==
            Rows(run.Path(0, 0), t.name, 0, rows));
    }
  }
}

// A TCP relay in front of the S3 server that can be cut: the store "going away".
class Relay {
 public:
  explicit Relay(int target_port) : target_port_(target_port) {
    listener_ = test::ListenOnLoopback(64, &port_);
    accept_ = std::thread([this] { Accept(); });
  }
  ~Relay() {
    Cut();
    accept_.join();
    for (auto& t : pumps_) t.join();
  }
  int port() const { return port_; }
  // Closes the listener and every connection: later connections are refused.
  void Cut() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cut_) return;
    cut_ = true;
    shutdown(listener_, SHUT_RDWR);
    close(listener_);
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
  }
  // Cuts once this many bytes have come back from the server.
  void CutAfter(uint64_t bytes) { budget_ = bytes; }

 private:
  void Accept() {
    for (;;) {
      const int client = accept(listener_, nullptr, nullptr);
      if (client < 0) return;
      const int server = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(target_port_));
      if (connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        close(client);
        close(server);
        continue;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (cut_) {
        close(client);
        close(server);
        return;
      }
      fds_.push_back(client);
      fds_.push_back(server);
      pumps_.emplace_back([this, client, server] { Pump(client, server, false); });
      pumps_.emplace_back([this, client, server] { Pump(server, client, true); });
    }
  }
  void Pump(int from, int to, bool counted) {
    char buffer[16384];
    for (;;) {
      const ssize_t n = read(from, buffer, sizeof(buffer));
      if (n <= 0) break;
      if (counted && (relayed_ += static_cast<uint64_t>(n)) > budget_) {
        Cut();
        break;
      }
      // MSG_NOSIGNAL: once Cut() has closed the peer, a write must fail, not raise SIGPIPE
      // (which ended the whole test binary with status 141).
      if (send(to, buffer, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
    }
    shutdown(to, SHUT_WR);
  }

  int target_port_, port_ = 0, listener_ = -1;
  std::thread accept_;
  std::vector<std::thread> pumps_;
  std::vector<int> fds_;
  std::mutex mutex_;
  bool cut_ = false;
  std::atomic<uint64_t> relayed_{0}, budget_{UINT64_MAX};
};

// A run of 5 steps of two shards and a region at step 2; each fault below then meets a
// pull of step 3 (or the latest) and must leave the region exactly as it was.
struct FaultScene {
  TempDir tmp;
  std::vector<Backend> backends = test::Backends(tmp, "faults");
  std::vector<std::unique_ptr<TrainerRun>> runs;
  FaultScene() {
    for (Backend& b : backends) {
      runs.push_back(
          std::make_unique<TrainerRun>(tmp / ("trainer-" + b.name), TwoShards(), 0.005, 21));
      TrainerRun& run = *runs.back();
      for (uint64_t step = 0; step <= 4; ++step) {
        if (step > 0) run.Advance();
        run.Write(step);
        PublishStep(b.store.get(), run, step);
      }
    }
  }
  // A new region at step 2.
  std::string Region(size_t i, const std::string& name) {
    const std::string dir = tmp / (name + "-" + backends[i].name);
    PullReport r;
    REQUIRE(PullStep(backends[i].store.get(), dir, 2, &r).ok());
    return dir;
  }
  std::string PieceKeyOf(size_t i, uint64_t step, size_t shard, bool anchor = false) {
    StepManifest m;
    REQUIRE(ReadManifest(backends[i].store.get(), step, &m, nullptr).ok());
    return anchor ? m.shards[shard].anchor.key : m.shards[shard].delta.key;
  }
  std::vector<uint8_t> Get(size_t i, const std::string& key) {
    std::vector<uint8_t> bytes;
    REQUIRE(backends[i].store->Get(key, 1u << 30, &bytes, nullptr).ok());
    return bytes;
  }
  void Put(size_t i, const std::string& key, const std::vector<uint8_t>& bytes) {
    REQUIRE(backends[i].store->Put(key, bytes.data(), bytes.size(), PutMode::kOverwrite).ok());
  }
};

// Pulls with `o` and checks that it fails with `code` and leaves `dir` as it was.
void ExpectRefused(Store* store, const std::string& dir, PullOptions o, ErrorCode code,
                   const char* says = "") {
  const auto before = Snapshot(dir);
  PullReport r;
  o.transfers = test::FastRetries();
  const Status s = Pull(store, dir, o, &r);
  INFO("pull: ", s.ToString());
  CHECK(s.code() == code);
  CHECK(s.message().find(says) != std::string::npos);
  CHECK(Snapshot(dir) == before);
}

PullOptions At(uint64_t step) {
  PullOptions o;
  o.step = step;
  return o;
}

TEST_CASE(
    "sync faults: truncated and damaged pieces; damaged roots, group indexes and records; a "
    "missing root") {
  FaultScene scene;
  for (size_t i = 0; i < scene.backends.size(); ++i) {
    INFO("store ", scene.backends[i].name);
    Store* store = scene.backends[i].store.get();
    const std::string dir = scene.Region(i, "region");
    const std::string key = scene.PieceKeyOf(i, 3, 1);
    const std::vector<uint8_t> good = scene.Get(i, key);

    PullOptions partial = At(2);
    partial.tensors = "lm_head";
    partial.row_begin = 100;
    partial.row_end = 200;
    const std::string slice = scene.tmp / ("slice-" + scene.backends[i].name);
    PullReport r;
    REQUIRE(Pull(store, slice, partial, &r).ok());
    partial.step = 3;

    // Step 3 is an anchor step: its anchors are the other route. Each damage below first
    // meets both routes (refused, nothing changed), then the delta alone: a region at step
    // 2 takes the anchor route instead, and says so.
    const std::string anchor_key = scene.PieceKeyOf(i, 3, 1, true);
    const std::vector<uint8_t> anchor = scene.Get(i, anchor_key);
    int fresh = 0;
    const auto rerouted = [&](const PullOptions& o) {
      std::string other;
      PullReport got;
      if (o.tensors.empty()) {
        other = scene.Region(i, "rerouted-" + std::to_string(fresh++));
      } else {  // a slice at step 2
        other = scene.tmp / ("rerouted-slice-" + std::to_string(fresh++) + scene.backends[i].name);
        PullOptions two = o;
        two.step = 2;
        REQUIRE(Pull(store, other, two, &got).ok());
      }
      REQUIRE(Pull(store, other, o, &got).ok());
      INFO("rerouted: ", got.rerouted);
      CHECK(got.route == "anchor 3 -> 3");
      CHECK((got.rerouted.find(key) != std::string::npos ||
             got.rerouted.find("step 3, shard 1") != std::string::npos));
      CHECK(got.rerouted.find("took anchor 3 -> 3 instead of chain 2 -> 3") != std::string::npos);
      if (o.tensors.empty()) CheckHolds(other, *scene.runs[i], 3);
    };
    // A truncated object.
    scene.Put(i, key, std::vector<uint8_t>(good.begin(), good.end() - 100));
    scene.Put(i, anchor_key, std::vector<uint8_t>(anchor.begin(), anchor.end() - 100));
    ExpectRefused(store, dir, At(3), ErrorCode::kTruncated, key.c_str());
    scene.Put(i, anchor_key, anchor);
    rerouted(At(3));
    // A byte flipped in the container's header, then in lm_head's first piece: a full
    // pull checks the whole object, a partial one the head and each piece it reads.
    checkpoint::Reader reader;
    REQUIRE(
        checkpoint::Reader::Open(std::make_unique<checkpoint::MemorySource>(good), &reader).ok());
    const checkpoint::TensorEntry* lm_head = nullptr;
    for (const auto& t : reader.manifest().files[0].tensors) {
      if (t.name == "lm_head") lm_head = &t;
    }
    REQUIRE(lm_head != nullptr);
    const size_t piece_at =
        reader.data_start() + lm_head->pieces[0].offset + lm_head->pieces[0].size / 2;
    for (size_t at : {size_t{20}, piece_at}) {
      std::vector<uint8_t> bad = good;
      bad[at] ^= 0x10;
      scene.Put(i, key, bad);
      std::vector<uint8_t> bad_anchor = anchor;
      bad_anchor[20] ^= 0x10;
      scene.Put(i, anchor_key, bad_anchor);
      ExpectRefused(store, dir, At(3), ErrorCode::kCorruptChunk, "does not match its record");
      ExpectRefused(store, slice, partial, ErrorCode::kCorruptChunk);
      scene.Put(i, anchor_key, anchor);
      rerouted(At(3));
      rerouted(partial);
    }
    scene.Put(i, key, good);

    // A root with a byte flipped: in its JSON, and in the hash naming a group index.
    const std::vector<uint8_t> root = scene.Get(i, RootKey(3));
    std::vector<uint8_t> bad = root;
    bad[0] = '[';
    scene.Put(i, RootKey(3), bad);
    ExpectRefused(store, dir, At(3), ErrorCode::kCorruptHeader, RootKey(3).c_str());
    bad = root;
    const std::string text(root.begin(), root.end());
    const size_t at = text.find("\"groups\": [") + 10;
    const size_t hex = text.find('"', at) + 1;
    bad[hex] = bad[hex] == '0' ? '1' : '0';
    scene.Put(i, RootKey(3), bad);
    ExpectRefused(store, dir, At(3), ErrorCode::kCorruptChunk, "is not the object");
    scene.Put(i, RootKey(3), root);
    // A group index and a record with a byte flipped: their hashes no longer match.
    StepManifest m;
    REQUIRE(ReadRoot(store, 3, &m, nullptr).ok());
    for (const std::string& doc :
         {GroupIndexKey(3, 2, m.incarnation, 0), ShardRecordKey(3, 1, 2, m.incarnation)}) {
      const std::vector<uint8_t> good_doc = scene.Get(i, doc);
      bad = good_doc;
      bad[bad.size() / 2] ^= 0x01;
      scene.Put(i, doc, bad);
      ExpectRefused(store, dir, At(3), ErrorCode::kCorruptChunk, doc.c_str());
      ExpectRefused(store, slice, partial, ErrorCode::kCorruptChunk, doc.c_str());
      scene.Put(i, doc, good_doc);
    }
    // A missing root: the step is not committed.
    REQUIRE(store->Delete(RootKey(3)).ok());
    ExpectRefused(store, dir, At(3), ErrorCode::kNotFound, "step 3 is not committed");
    scene.Put(i, RootKey(3), root);

    // After all that, the regions still pull step 4 through the chain, bit for bit.
    partial.step = 4;
    REQUIRE(Pull(store, slice, partial, &r).ok());
    CHECK(r.route == "chain 2 -> 4");
    CHECK(Rows(slice + "/" + TrainerRun::FileName(1, 2), "lm_head", 0, 100) ==
          Rows(scene.runs[i]->Path(4, 1), "lm_head", 100, 200));
    REQUIRE(PullStep(store, dir, 4, &r).ok());
    CHECK(r.route == "chain 2 -> 4");
    CheckHolds(dir, *scene.runs[i], 4);
  }
}

TEST_CASE(
    "sync faults: a pointer naming an unfinished step, the store going away, wrong credentials") {
  FaultScene scene;
  for (size_t i = 0; i < scene.backends.size(); ++i) {
    INFO("store ", scene.backends[i].name);
    Backend& b = scene.backends[i];
    Store* store = b.store.get();
    const std::string dir = scene.Region(i, "region");
    TrainerRun& run = *scene.runs[i];

    // Shard 0 of step 5 is published, shard 1 not: the step is not committed; a pointer
    // that names it anyway is not followed.
    run.Advance();
    run.Write(5);
    PublishReport published;
    REQUIRE(Publish(store, Shard(run, 5, 0, true), &published).ok());
    CHECK(!published.committed);
    CHECK(published.pending == "waiting for shard 1 of 2");
    uint64_t latest = 0;
    REQUIRE(ReadLatest(store, &latest, nullptr).ok());
    CHECK(latest == 4);
    const std::string pointer = LatestJson(5);
    REQUIRE(store
                ->Put(kLatestKey, reinterpret_cast<const uint8_t*>(pointer.data()), pointer.size(),
                      PutMode::kOverwrite)
                .ok());
    ExpectRefused(store, dir, PullOptions(), ErrorCode::kNotFound,
                  "names step 5, which is not committed");
    ExpectRefused(store, dir, At(5), ErrorCode::kNotFound, "step 5 is not committed");
    // Shard 1 arrives: it commits the step and the region takes it.
    REQUIRE(Publish(store, Shard(run, 5, 1, true), &published).ok());
    CHECK(published.committed);

    // The store goes away after the route is planned: retries, then a clear error.
    std::unique_ptr<Relay> relay;
    std::unique_ptr<Store> flaky;
    std::string moved;
    if (b.name == "s3") {
      const std::string endpoint = test::Env("AWS_ENDPOINT_URL");
      relay = std::make_unique<Relay>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
      const std::string saved = endpoint;
      setenv("AWS_ENDPOINT_URL", ("http://127.0.0.1:" + std::to_string(relay->port())).c_str(), 1);
      REQUIRE(OpenStore(b.url, test::FastRetries(), &flaky).ok());
      setenv("AWS_ENDPOINT_URL", saved.c_str(), 1);
    } else {
      REQUIRE(OpenStore(b.url, test::FastRetries(), &flaky).ok());
    }
    PullOptions o = At(5);
    o.hook = [&](const char* stage) {
      if (std::string(stage) == "planned") {
        if (relay)
          relay->Cut();
        else
          fs::rename(b.directory, b.directory + ".away");
      }
      return Status::Ok();
    };
    ExpectRefused(flaky.get(), dir, o, ErrorCode::kUnavailable);
    if (!relay) fs::rename(b.directory + ".away", b.directory);
    if (relay) {
      // ... and in the middle of an object: the first bytes arrive, then nothing.
      relay = std::make_unique<Relay>(
          relay ? std::stoi(test::Env("AWS_ENDPOINT_URL")
                                .substr(test::Env("AWS_ENDPOINT_URL").rfind(':') + 1))
                : 0);
      const std::string saved = test::Env("AWS_ENDPOINT_URL");
      setenv("AWS_ENDPOINT_URL", ("http://127.0.0.1:" + std::to_string(relay->port())).c_str(), 1);
      REQUIRE(OpenStore(b.url, test::FastRetries(), &flaky).ok());
      setenv("AWS_ENDPOINT_URL", saved.c_str(), 1);
      o.hook = [&](const char* stage) {
        if (std::string(stage) == "planned") relay->CutAfter(2000);
        return Status::Ok();
      };
      PullOptions fresh = o;
      fresh.step = 4;  // an anchor route: tens of MB, cut 2 KB in
      ExpectRefused(flaky.get(), scene.tmp / "fresh-s3", fresh, ErrorCode::kUnavailable);

      // Wrong credentials: permission denied, nothing changed.
      const std::string secret = test::Env("AWS_SECRET_ACCESS_KEY");
      setenv("AWS_SECRET_ACCESS_KEY", "wrong", 1);
      std::unique_ptr<Store> denied;
      REQUIRE(OpenStore(b.url, test::FastRetries(), &denied).ok());
      setenv("AWS_SECRET_ACCESS_KEY", secret.c_str(), 1);
      ExpectRefused(denied.get(), dir, At(5), ErrorCode::kPermissionDenied, "access denied");
      PublishReport r;
      CHECK(Publish(denied.get(), Shard(run, 5, 0, true), &r).code() ==
            ErrorCode::kPermissionDenied);
    }
    PullReport r;
    REQUIRE(PullStep(store, dir, 5, &r).ok());
    CHECK(r.route == "chain 2 -> 5");
    CheckHolds(dir, run, 5);
  }
}

TEST_CASE("sync faults: a region whose files are not the step it records is refused") {
  FaultScene scene;
  for (size_t i = 0; i < scene.backends.size(); ++i) {
    INFO("store ", scene.backends[i].name);
    Store* store = scene.backends[i].store.get();
    const std::string dir = scene.Region(i, "region");
    const std::string file = dir + "/" + TrainerRun::FileName(1, 2);
    // Touched (its time changed, not its bytes): checked by contents and accepted.
    const auto bytes = test::ReadBytes(file);
    test::WriteBytes(file, bytes);
    PullReport r;
    REQUIRE(PullStep(store, dir, 3, &r).ok());
    CheckHolds(dir, *scene.runs[i], 3);
    // One byte of a tensor changed: refused, and left as it was.
    std::vector<uint8_t> changed = test::ReadBytes(file);
    changed[changed.size() - 1000] ^= 1;
    test::WriteBytes(file, changed);
    ExpectRefused(store, dir, At(4), ErrorCode::kChecksumMismatch,
                  "refusing to apply onto an unknown base");
    // A shard file gone: refused too.
    const std::string other = dir + "/" + TrainerRun::FileName(0, 2);
    fs::rename(other, other + ".moved");
    ExpectRefused(store, dir, At(4), ErrorCode::kChecksumMismatch, "it is gone");
    fs::rename(other + ".moved", other);
    // A damaged state file: refused, naming the way out.
    const std::string state = dir + "/.arc_v3/state.json";
    const auto saved = test::ReadBytes(state);
    test::WriteBytes(state, std::vector<uint8_t>(saved.begin(), saved.begin() + saved.size() / 2));
    ExpectRefused(store, dir, At(4), ErrorCode::kCorruptHeader, "state.json is damaged");
    test::WriteBytes(state, saved);
    // --reset rebuilds from the anchor whatever the files hold.
    PullOptions reset = At(4);
    reset.reset = true;
    REQUIRE(Pull(store, dir, reset, &r).ok());
    CHECK(r.route == "anchor 3 -> 4");
    CheckHolds(dir, *scene.runs[i], 4);
  }
}

TEST_CASE(
    "sync faults: a pull that fails or dies while committing leaves all old files, or after "
    "recovery all new") {
  FaultScene scene;
  for (size_t i = 0; i < scene.backends.size(); ++i) {
    INFO("store ", scene.backends[i].name);
    Store* store = scene.backends[i].store.get();
    const std::string dir = scene.Region(i, "region");
    // An error at the last moment before the renames: nothing changes.
    PullOptions o = At(4);
    o.hook = [](const char* stage) {
      return std::string(stage) == "commit" ? Status(ErrorCode::kInternal, "injected")
                                            : Status::Ok();
    };
    ExpectRefused(store, dir, o, ErrorCode::kInternal, "injected");
    // A process that dies after the first of the two renames: the region has one new
    // shard and one old, and its journal; the next pull finishes the commit first.
    std::fflush(nullptr);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      PullOptions dying = At(4);
      dying.transfers = test::FastRetries();
      dying.after_move = [](size_t moved) {
        if (moved == 1) _exit(42);
      };
      PullReport r;
      (void)Pull(store, dir, dying, &r);  // exits in after_move first
      _exit(0);
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 42);
    CHECK(fs::exists(dir + "/.arc_v3/commit.json"));
    const TrainerRun& run = *scene.runs[i];
    const bool first_new =
        test::ReadBytes(dir + "/" + TrainerRun::FileName(0, 2)) == test::ReadBytes(run.Path(4, 0));
    const bool second_new =
        test::ReadBytes(dir + "/" + TrainerRun::FileName(1, 2)) == test::ReadBytes(run.Path(4, 1));
    CHECK(first_new != second_new);  // caught half-way
    PullReport r;
    REQUIRE(PullStep(store, dir, 4, &r).ok());
    CHECK(r.up_to_date);  // the journal's commit was finished first
    CHECK(!fs::exists(dir + "/.arc_v3/commit.json"));
    CheckHolds(dir, run, 4);
  }
}

TEST_CASE(
    "sync: a region's state or journal with a number of another kind is damage, never converted") {
  // Found by fuzz_region_state: a size of 2.2e53 went through an unchecked float-to-integer
  // conversion (undefined behaviour).
  DirState state;
  state.store = "s3://b/run";
  state.step = 3;
  state.manifest_xxh3 = 0x1234;
  ShardState shard;
  shard.name = "model.safetensors";
  shard.file.path = "model.safetensors";
  shard.file.size = 10;
  state.shards.push_back(shard);
  const std::string good = StateJson(state);
  DirState parsed;
  REQUIRE(ParseState(good, "state.json", &parsed).ok());
  CHECK(StateJson(parsed) == good);
  for (const auto& bad : std::vector<std::pair<std::string, std::string>>{
           {"\"size\": 10", "\"size\": 2.22222e+53"},
           {"\"size\": 10", "\"size\": -10"},
           {"\"step\": 3", "\"step\": 3.5"},
           {"\"mtime_ns\": 0", "\"mtime_ns\": 1e30"}}) {
    std::string text = good;
    const size_t at = text.find(bad.first);
    REQUIRE(at != std::string::npos);
    text.replace(at, bad.first.size(), bad.second);
    INFO(bad.second);
    CHECK(ParseState(text, "state.json", &parsed).code() == ErrorCode::kCorruptHeader);
    Journal journal;
    journal.state = state;
    std::string j = JournalJson(journal);
    const size_t jat = j.find(bad.first);
    REQUIRE(jat != std::string::npos);
    j.replace(jat, bad.first.size(), bad.second);
    CHECK(ParseJournal(j, "commit.json", &journal).code() == ErrorCode::kCorruptHeader);
  }
}

}  // namespace
}  // namespace sync
}  // namespace arc_v3
