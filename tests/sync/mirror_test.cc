// The regional mirror (src/sync/MIRRORING.md, "Mirroring") on real stores: steps copied
// from a trainer's store into a region's (a directory, radosgw, from an http:// source)
// and pulled from there bit-exactly; a copy that fails at every write in turn leaves a
// valid store that a rerun completes; signed steps mirrored and pulled trusting; damage
// and other runs refused.
#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <set>

#include "arc_v3_sync.hpp"
#include "src/checkpoint/container.h"
#include "src/sync/protocol.h"
#include "src/sync/sync.h"
#include "tests/sync/signed_test_util.h"
#include "tests/sync/sync_test_util.h"

namespace arc_v3 {
namespace sync {
namespace {

using test::Backend;
using test::CheckHolds;
using test::ForgeDelta;
using test::Keys;
using test::PublishStep;
using test::PublishSteps;
using test::PullTrusting;
using test::TempDir;
using test::TrainerRun;
using test::TwoShards;
namespace fs = std::filesystem;

std::vector<std::vector<test::TensorSpec>> SmallShards() {
  return {{{"embed", {256, 64}}, {"norm", {64}}}, {{"head", {192, 64}}}};
}

MirrorResult MirrorOk(Store* src, Store* dst, uint64_t step = kLatestStep,
                      const std::vector<std::string>& trust = {}, bool anchor_route = false) {
  MirrorOptions o;
  o.step = step;
  o.trusted_keys = trust;
  MirrorResult report;
  const Status s = Mirror(src, dst, o, anchor_route, &report);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return report;
}

// Pulls `step` (kLatestStep: the latest) of `store` into a fresh directory and checks it
// holds the run's step bit for bit.
void CheckPull(Store* store, const TempDir& tmp, const TrainerRun& run, uint64_t step,
               const std::vector<std::string>& trust = {}) {
  const std::string dir = tmp / test::UniqueName("region");
  PullReport report;
  const Status s = PullTrusting(store, dir, step, trust, &report);
  INFO(store->url(), " step ", step, ": ", s.ToString());
  REQUIRE(s.ok());
  CheckHolds(dir, run, report.to_step);
  fs::remove_all(dir);
}

// Whether every root `store` holds names only what it holds (documents read and checked,
// objects there at their sizes), and `latest` names a step whose root is there.
void CheckValid(Store* store) {
  std::vector<ObjectInfo> roots;
  REQUIRE(store->List("steps/", &roots).ok());
  for (const ObjectInfo& o : roots) {
    StepManifest m;
    const uint64_t step = StepOfKey(o.key);
    const Status s = ReadManifest(store, step, &m, nullptr);
    INFO(o.key, ": ", s.ToString());
    REQUIRE(s.ok());
    for (const ShardRecord& r : m.shards) {
      for (const ObjectRef* ref : {&r.delta, &r.anchor, &r.index}) {
        if (!ref->present()) continue;
        ObjectInfo info;
        REQUIRE(store->Head(ref->key, &info).ok());
        CHECK(info.size == ref->size);
        if (!ref->sums_sha256.empty()) CHECK(store->Head(SumsKey(ref->key), &info).ok());
      }
    }
  }
  uint64_t latest = kNoStep;
  const Status s = ReadLatest(store, &latest, nullptr);
  if (s.code() == ErrorCode::kNotFound) return;
  REQUIRE(s.ok());
  ObjectInfo info;
  CHECK(store->Head(RootKey(latest), &info).ok());
}

// Every (source, copy) pair of backends (local, and S3 where there is one), each a fresh
// store: f(src, dst).
template <class F>
void EachPair(const TempDir& tmp, const std::string& test, const F& f) {
  const size_t kinds = test::Backends(tmp, test + "-probe").size();
  for (size_t i = 0; i < kinds; ++i) {
    for (size_t j = 0; j < kinds; ++j) {
      std::vector<Backend> srcs = test::Backends(tmp, test + "-src"),
                           dsts = test::Backends(tmp, test + "-dst");
      INFO(srcs[i].name, " -> ", dsts[j].name);
      f(srcs[i], dsts[j]);
    }
  }
}

TEST_CASE(
    "mirror: anchors and deltas of 2 shards copied step by step, pulled from the copy "
    "bit-exactly") {
  TempDir tmp;
  EachPair(tmp, "mirror", [&](Backend& src, Backend& dst) {
    TrainerRun run(tmp / test::UniqueName("run"), TwoShards(), 0.02, 7);
    PublishSteps(src.store.get(), &run, 2, "");
    MirrorResult first = MirrorOk(src.store.get(), dst.store.get());
    CHECK(first.from_step == kNoStep);
    CHECK(first.to_step == 2);
    CHECK(first.steps == std::vector<uint64_t>{0, 1, 2});
    CHECK(first.copied_objects > 0);
    CHECK(first.skipped_objects == 0);  // layouts are copied once per run
    CHECK(first.fetched_bytes >= first.copied_bytes);
    CheckPull(dst.store.get(), tmp, run, 2);
    for (uint64_t step = 3; step <= 9; ++step) {  // 4 and 8 carry anchors too
      run.Advance();
      run.Write(step);
      PublishStep(src.store.get(), run, step, "", true);
    }
    // DST holds 2, SRC's newest is 9 (anchor step 8): the walk goes below the anchor
    // to DST's step, so that regions at 2 follow by deltas.
    MirrorResult second = MirrorOk(src.store.get(), dst.store.get());
    CHECK(second.from_step == 2);
    CHECK(second.steps == std::vector<uint64_t>{3, 4, 5, 6, 7, 8, 9});
    CHECK(second.skipped_objects == 3);  // in DST already: the group layout, 2 shard layouts
    CheckPull(dst.store.get(), tmp, run, 9);
    CheckPull(dst.store.get(), tmp, run, 5);
    // Nothing new: nothing fetched but roots, nothing written.
    MirrorResult third = MirrorOk(src.store.get(), dst.store.get());
    CHECK(third.up_to_date);
    CHECK(third.steps.empty());
    CHECK(third.copied_objects == 0);
    // DST is pruned on its own: SRC keeps everything.
    PruneResult pruned;
    REQUIRE(Prune(dst.store.get(), 1, false, &pruned).ok());
    CHECK(!pruned.deleted_steps.empty());
    CheckValid(dst.store.get());
    CheckPull(dst.store.get(), tmp, run, 9);
    ObjectInfo info;
    CHECK(src.store->Head(RootKey(0), &info).ok());
  });
}

TEST_CASE(
    "mirror: a copy that starts late begins at the anchor step; the anchor route never walks below "
    "it") {
  TempDir tmp;
  for (Backend& src : test::Backends(tmp, "mirror-late")) {
    TrainerRun run(tmp / test::UniqueName("run"), TwoShards(), 0.02, 9);
    PublishSteps(src.store.get(), &run, 6, "");
    const std::string dst_dir = tmp / test::UniqueName("dst");
    std::unique_ptr<Store> dst;
    StoreOptions create = test::FastRetries();
    create.create = true;
    REQUIRE(OpenStore(dst_dir, create, &dst).ok());
    MirrorResult r = MirrorOk(src.store.get(), dst.get(), 2);
    CHECK(r.steps == std::vector<uint64_t>{0, 1, 2});
    // Held 2, target 6 of anchor step 4: the anchor route copies 4 to 6 only.
    r = MirrorOk(src.store.get(), dst.get(), 6, {}, /*anchor_route=*/true);
    CHECK(r.steps == std::vector<uint64_t>{4, 5, 6});
    CheckPull(dst.get(), tmp, run, 6);
    CheckValid(dst.get());
    // A fresh copy of 6 starts at 4, whatever the SRC holds below it.
    const std::string fresh_dir = tmp / test::UniqueName("fresh");
    std::unique_ptr<Store> fresh;
    REQUIRE(OpenStore(fresh_dir, create, &fresh).ok());
    r = MirrorOk(src.store.get(), fresh.get());
    CHECK(r.steps == std::vector<uint64_t>{4, 5, 6});
    CheckPull(fresh.get(), tmp, run, 6);
  }
}

TEST_CASE("mirror: an object over the part size is uploaded in parts into S3, and read out of it") {
  TempDir tmp;
  if (test::S3Bucket().empty()) return;
  // One shard whose anchor is over S3's 5 MiB part (FastRetries' part_bytes): a
  // multipart upload into an S3 DST; out of an S3 SRC, a download of the whole object.
  const std::vector<std::vector<test::TensorSpec>> big = {{{"w", {4096, 1024}}}};
  for (const bool s3_src : {false, true}) {
    std::vector<Backend> srcs = test::Backends(tmp, "mirror-big-src");
    std::vector<Backend> dsts = test::Backends(tmp, "mirror-big-dst");
    Backend& src = srcs[s3_src ? 1 : 0];
    Backend& dst = dsts[s3_src ? 0 : 1];
    INFO(src.name, " -> ", dst.name);
    TrainerRun run(tmp / test::UniqueName("run"), big, 0.02, 31);
    PublishSteps(src.store.get(), &run, 1, "");
    StepManifest m;
    REQUIRE(ReadManifest(src.store.get(), 0, &m, nullptr).ok());
    REQUIRE(m.shards[0].anchor.size > (uint64_t{5} << 20));
    MirrorOptions o;
    o.store.connections = 4;
    MirrorResult report;
    const Status s = Mirror(src.store.get(), dst.store.get(), o, false, &report);
    INFO(s.ToString());
    REQUIRE(s.ok());
    CHECK(report.steps == std::vector<uint64_t>{0, 1});
    CheckPull(dst.store.get(), tmp, run, 1);
  }
}

TEST_CASE(
    "mirror: following with trust, a step that does not verify is refused and the next anchor "
    "taken") {
  TempDir tmp;
  Keys keys(tmp);
  const std::string pub = keys.trainer + ".pub";
  std::unique_ptr<Store> src, dst;
  StoreOptions create = test::FastRetries();
  create.create = true;
  const std::string src_dir = tmp / "src", dst_dir = tmp / "dst";
  REQUIRE(OpenStore(src_dir, create, &src).ok());
  REQUIRE(OpenStore(dst_dir, create, &dst).ok());
  TrainerRun run(tmp / "run", SmallShards(), 0.05, 37);
  PublishSteps(src.get(), &run, 4, keys.trainer);  // step 4 carries anchors
  MirrorOk(src.get(), dst.get(), 2, {pub});
  // Step 3's delta of shard 0 damaged in SRC: its SHA-256 no longer matches.
  StepManifest m;
  REQUIRE(ReadManifest(src.get(), 3, &m, nullptr).ok());
  const std::string damaged = m.shards[0].delta.key;
  std::vector<uint8_t> bytes = test::ReadBytes(src_dir + "/" + damaged);
  bytes[bytes.size() - 3] ^= 0x10;
  fs::remove(src_dir + "/" + damaged);
  test::WriteBytes(src_dir + "/" + damaged, bytes);
  // DST holds 2: the chain 3, 4 runs through the damage; refused, then step 4 by its
  // anchors alone.
  FollowOptions follow;
  follow.interval_seconds = 0.05;
  follow.until = 4;
  MirrorOptions o;
  o.trusted_keys = {pub};
  std::vector<std::string> refused;
  std::vector<uint64_t> copied;
  const Status s = arc_v3::FollowMirror(
      src_dir, dst_dir, o, follow, [&](const FollowEvent& e, const MirrorResult* r) {
        if (e.kind == FollowEvent::Kind::kRefused) {
          refused.push_back(e.message);
        }
        if (r != nullptr) {
          copied.insert(copied.end(), r->steps.begin(), r->steps.end());
        }
        return true;
      });
  INFO(s.ToString());
  REQUIRE(s.ok());
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].find(damaged) != std::string::npos);
  CHECK(copied == std::vector<uint64_t>{4});
  ObjectInfo info;
  CHECK(dst->Head(RootKey(3), &info).code() == ErrorCode::kNotFound);
  CHECK(dst->Head(damaged, &info).code() == ErrorCode::kNotFound);
  CheckValid(dst.get());
  CheckPull(dst.get(), tmp, run, 4, {pub});
}

// A directory store whose writes fail once `budget` of them were made: before the write
// lands, or (`after`) once it landed, as when the answer to a write is lost.
class FaultStore : public Store {
 public:
  FaultStore(std::unique_ptr<Store> inner, int64_t budget, bool after)
      : inner_(std::move(inner)), budget_(budget), after_(after) {}
  const std::string& url() const override { return inner_->url(); }
  bool writable() const override { return true; }
  bool listable() const override { return true; }
  Status Head(const std::string& key, ObjectInfo* info) override { return inner_->Head(key, info); }
  Status GetIfChanged(const std::string& key, const std::string& etag, uint64_t max_size,
                      std::vector<uint8_t>* data, ObjectInfo* info, bool* changed) override {
    return inner_->GetIfChanged(key, etag, max_size, data, info, changed);
  }
  Status GetRange(const std::string& key, uint64_t offset, uint64_t size, uint8_t* out) override {
    return inner_->GetRange(key, offset, size, out);
  }
  Status Put(const std::string& key, const uint8_t* data, uint64_t size, PutMode mode) override {
    return Write(key, [&] { return inner_->Put(key, data, size, mode); });
  }
  Status PutFile(const std::string& key, const std::string& path, PutMode mode) override {
    return Write(key, [&] { return inner_->PutFile(key, path, mode); });
  }
  Status List(const std::string& prefix, std::vector<ObjectInfo>* objects) override {
    return inner_->List(prefix, objects);
  }
  Status Delete(const std::string& key) override { return inner_->Delete(key); }
  int64_t writes() const { return writes_; }

 private:
  template <class Do>
  Status Write(const std::string& key, const Do& write) {
    const bool fail = writes_++ >= budget_;
    if (fail && !after_)
      return Status(ErrorCode::kUnavailable, key + ": injected failure before the write");
    const Status s = write();
    if (fail && s.ok())
      return Status(ErrorCode::kUnavailable, key + ": injected failure after the write");
    return s;
  }
  std::unique_ptr<Store> inner_;
  const int64_t budget_;
  const bool after_;
  std::atomic<int64_t> writes_{0};
};

TEST_CASE(
    "mirror: DST failing after every number of writes stays a valid store, and a rerun completes "
    "it") {
  TempDir tmp;
  std::unique_ptr<Store> src;
  StoreOptions create = test::FastRetries();
  create.create = true;
  REQUIRE(OpenStore(tmp / "src", create, &src).ok());
  TrainerRun run(tmp / "run", SmallShards(), 0.05, 11);
  PublishSteps(src.get(), &run, 5, "");
  // The writes of a whole copy, counted on a store that never fails.
  int64_t total = 0;
  {
    std::unique_ptr<Store> inner;
    REQUIRE(OpenStore(tmp / "count", create, &inner).ok());
    FaultStore counting(std::move(inner), INT64_MAX, false);
    MirrorOk(src.get(), &counting);
    total = counting.writes();
  }
  CHECK(total > 15);
  int failed = 0;
  uint64_t skipped = 0;  // by the reruns: what the failed runs had written
  for (const bool after : {false, true}) {
    for (int64_t n = 0; n <= total; ++n) {
      INFO("failing after ", n, " of ", total, " writes", after ? " (the last one landed)" : "");
      const std::string dir = tmp / test::UniqueName("dst");
      std::unique_ptr<Store> inner, dst;
      REQUIRE(OpenStore(dir, create, &inner).ok());
      FaultStore faulty(std::move(inner), n, after);
      MirrorResult report;
      const Status s = Mirror(src.get(), &faulty, MirrorOptions(), false, &report);
      CHECK(s.ok() == (n >= total));
      failed += !s.ok();
      REQUIRE(OpenStore(dir, test::FastRetries(), &dst).ok());
      CheckValid(dst.get());
      uint64_t latest = kNoStep;
      if (ReadLatest(dst.get(), &latest, nullptr).ok()) CheckPull(dst.get(), tmp, run, latest);
      MirrorResult rerun = MirrorOk(src.get(), dst.get());
      CHECK(rerun.to_step == 5);
      skipped += rerun.skipped_objects;
      CheckValid(dst.get());
      CheckPull(dst.get(), tmp, run, 5);
      fs::remove_all(dir);
    }
  }
  CHECK(failed == 2 * total);
  CHECK(skipped > 0);
}

TEST_CASE(
    "mirror: signed steps are copied as signed and pulled from the copy trusting; others are "
    "refused") {
  TempDir tmp;
  Keys keys(tmp);
  const std::string pub = keys.trainer + ".pub", evil_pub = keys.attacker + ".pub";
  EachPair(tmp, "mirror-signed", [&](Backend& src, Backend& dst) {
    TrainerRun run(tmp / test::UniqueName("run"), TwoShards(), 0.02, 13);
    PublishSteps(src.store.get(), &run, 3, keys.trainer);
    // Not the trainer's key: nothing is written.
    MirrorOptions o;
    o.trusted_keys = {evil_pub};
    MirrorResult report;
    CHECK(Mirror(src.store.get(), dst.store.get(), o, false, &report).code() ==
          ErrorCode::kUntrusted);
    for (const char* prefix : {"o/", "r/", "steps/"}) {
      std::vector<ObjectInfo> written;
      REQUIRE(dst.store->List(prefix, &written).ok());
      CHECK(written.empty());
    }
    report = MirrorOk(src.store.get(), dst.store.get(), kLatestStep, {pub});
    CHECK(report.steps == std::vector<uint64_t>{0, 1, 2, 3});
    CheckPull(dst.store.get(), tmp, run, 3, {pub});
    std::vector<StepVerdict> verdicts;
    REQUIRE(VerifySteps(dst.store.get(), {pub}, &verdicts).ok());
    CHECK(verdicts.size() == 4);
    for (const StepVerdict& v : verdicts) CHECK(v.status.ok());
    // An attacker who can write SRC re-signs a damaged step 4 with its own key: a
    // trusting mirror refuses it and DST keeps step 3.
    run.Advance();
    run.Write(4);
    PublishStep(src.store.get(), run, 4, keys.trainer, true);
    ForgeDelta(src.store.get(), 4, keys.attacker, /*root=*/true);
    o.trusted_keys = {pub};
    const Status s = Mirror(src.store.get(), dst.store.get(), o, false, &report);
    INFO(s.ToString());
    CHECK(s.code() == ErrorCode::kUntrusted);
    ObjectInfo info;
    CHECK(dst.store->Head(RootKey(4), &info).code() == ErrorCode::kNotFound);
    uint64_t latest = kNoStep;
    REQUIRE(ReadLatest(dst.store.get(), &latest, nullptr).ok());
    CHECK(latest == 3);
    CheckPull(dst.store.get(), tmp, run, 3, {pub});
  });
}

TEST_CASE(
    "mirror: a damaged object in SRC is refused and not copied; another run's DST is never "
    "overwritten") {
  TempDir tmp;
  std::unique_ptr<Store> src, dst, other;
  StoreOptions create = test::FastRetries();
  create.create = true;
  const std::string src_dir = tmp / "src";
  REQUIRE(OpenStore(src_dir, create, &src).ok());
  REQUIRE(OpenStore(tmp / "dst", create, &dst).ok());
  TrainerRun run(tmp / "run", TwoShards(), 0.02, 17);
  PublishSteps(src.get(), &run, 3, "");
  StepManifest m;
  REQUIRE(ReadManifest(src.get(), 3, &m, nullptr).ok());
  const std::string damaged = m.shards[1].delta.key;
  {
    std::vector<uint8_t> bytes = test::ReadBytes(src_dir + "/" + damaged);
    bytes[bytes.size() / 2] ^= 0x01;
    fs::remove(src_dir + "/" + damaged);
    test::WriteBytes(src_dir + "/" + damaged, bytes);
  }
  MirrorResult report;
  const Status s = Mirror(src.get(), dst.get(), MirrorOptions(), false, &report);
  INFO(s.ToString());
  CHECK(s.code() == ErrorCode::kCorruptChunk);
  CHECK(s.message().find(damaged) != std::string::npos);
  CHECK(report.steps == std::vector<uint64_t>{0, 1, 2});
  ObjectInfo info;
  CHECK(dst->Head(damaged, &info).code() == ErrorCode::kNotFound);
  CHECK(dst->Head(RootKey(3), &info).code() == ErrorCode::kNotFound);
  CheckValid(dst.get());
  CheckPull(dst.get(), tmp, run, kLatestStep);  // step 2
  // Another run's steps of the same numbers: DST's roots are never replaced.
  REQUIRE(OpenStore(tmp / "other", create, &other).ok());
  TrainerRun run2(tmp / "run2", TwoShards(), 0.02, 19);
  PublishSteps(other.get(), &run2, 1, "");
  const Status again = Mirror(other.get(), dst.get(), MirrorOptions(), false, &report);
  INFO(again.ToString());
  CHECK(again.code() == ErrorCode::kAlreadyExists);
  CheckPull(dst.get(), tmp, run, 2);
}

TEST_CASE(
    "mirror: the follow form copies each new step and stops at --until; an http:// source works") {
  TempDir tmp;
  for (Backend& src : test::Backends(tmp, "mirror-follow")) {
    TrainerRun run(tmp / test::UniqueName("run"), SmallShards(), 0.05, 23);
    PublishSteps(src.store.get(), &run, 2, "");
    const std::string dst_dir = tmp / test::UniqueName("dst");
    FollowOptions follow;
    follow.interval_seconds = 0.05;
    follow.until = 2;
    std::vector<uint64_t> mirrored;
    MirrorOptions o;
    o.store.retries = 2;
    const auto note = [&](const FollowEvent& e, const MirrorResult* r) {
      if (e.kind == FollowEvent::Kind::kPulled) {
        REQUIRE(r != nullptr);
        mirrored.insert(mirrored.end(), r->steps.begin(), r->steps.end());
      }
      return true;
    };
    Status s = arc_v3::FollowMirror(src.url, dst_dir, o, follow, note);
    INFO(s.ToString());
    REQUIRE(s.ok());
    CHECK(mirrored == std::vector<uint64_t>{0, 1, 2});
    for (uint64_t step = 3; step <= 5; ++step) {
      run.Advance();
      run.Write(step);
      PublishStep(src.store.get(), run, step, "", true);
    }
    follow.until = 5;
    s = arc_v3::FollowMirror(src.url, dst_dir, o, follow, note);
    REQUIRE(s.ok());
    CHECK(mirrored == std::vector<uint64_t>{0, 1, 2, 3, 4, 5});
    std::unique_ptr<Store> dst;
    REQUIRE(OpenStore(dst_dir, test::FastRetries(), &dst).ok());
    CheckPull(dst.get(), tmp, run, 5);
  }
  // A read-only http:// source (the public bucket radosgw serves without credentials).
  const std::string public_s3 = test::Env("ARC_V3_TEST_PUBLIC_S3"),
                    public_http = test::Env("ARC_V3_TEST_PUBLIC_HTTP");
  if (public_s3.empty() || public_http.empty()) return;
  const std::string prefix = test::UniqueName("mirror-http");
  std::unique_ptr<Store> writer, dst;
  REQUIRE(OpenStore(public_s3 + "/" + prefix, test::FastRetries(), &writer).ok());
  TrainerRun run(tmp / "http-run", SmallShards(), 0.05, 29);
  PublishSteps(writer.get(), &run, 3, "");
  MirrorOptions o;
  MirrorResult report;
  const std::string dst_dir = tmp / "http-dst";
  const Status s = MirrorSteps(public_http + "/" + prefix, dst_dir, o, &report);
  INFO(s.ToString());
  REQUIRE(s.ok());
  CHECK(report.steps == std::vector<uint64_t>{0, 1, 2, 3});
  REQUIRE(OpenStore(dst_dir, test::FastRetries(), &dst).ok());
  CheckPull(dst.get(), tmp, run, 3);
}

}  // namespace
}  // namespace sync
}  // namespace arc_v3
