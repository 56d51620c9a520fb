// The file-level calls of arc_v3_sync.hpp (PublishFile, PullFiles, FollowFiles, ListSteps,
// VerifySteps, PruneSteps), as the CLI and users call them: stores by URL, a local store
// and radosgw.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "arc_v3_sync.hpp"
#include "tests/sync/sync_test_util.h"

namespace arc_v3 {
namespace {

using sync::test::Backend;
using sync::test::TempDir;
using sync::test::TrainerRun;

std::vector<std::vector<sync::test::TensorSpec>> TwoShards() {
  return {{{"embed", {256, 128}}, {"layers.0.w", {128, 128}}},
          {{"layers.1.w", {128, 128}}, {"norm", {1, 128}}}};
}

// Publishes both shards of `step` (`prev` from the step before; anchors without).
void PublishStep(const std::string& url, const TrainerRun& run, uint64_t step, bool with_prev,
                 const std::string& sign_key, std::vector<PublishFileResult>* reports) {
  reports->clear();
  for (uint32_t k = 0; k < run.shards(); ++k) {
    PublishFileOptions o;
    o.step = step;
    o.next = run.Path(step, k);
    if (with_prev) o.prev = run.Path(step - 1, k);
    o.shard = k;
    o.count = static_cast<uint32_t>(run.shards());
    o.anchor_every = 3;
    o.sign_key = sign_key;
    o.store.retries = 3;
    PublishFileResult r;
    const Status s = PublishFile(url, o, &r);
    REQUIRE_MESSAGE(s.ok(), s.ToString());
    reports->push_back(r);
  }
}

TEST_CASE(
    "publish files, pull them into a checkpoint directory, list, verify and prune the store") {
  TempDir tmp;
  TrainerRun run(tmp / "run", TwoShards(), 0.01, 11);
  std::string key_id;
  REQUIRE(GenerateSigningKey(tmp / "key", &key_id).ok());
  for (const Backend& b : sync::test::Backends(tmp, "file_api")) {
    SUBCASE(b.name.c_str()) {
      // A local store that does not exist yet is made by the first publish.
      const std::string url = b.name == "local" ? b.url + "/new" : b.url;
      std::vector<PublishFileResult> reports;
      for (uint64_t step = 1; step <= 7; ++step) {
        if (step > 1) run.Advance();
        run.Write(step);
        PublishStep(url, run, step, step > 1, tmp / "key", &reports);
        CHECK_FALSE(reports[0].committed);
        CHECK(reports[0].pending.find("waiting for shard") != std::string::npos);
        CHECK(reports[1].committed);
        CHECK(reports[1].step == step);
        CHECK(reports[1].shard == 1);
        CHECK(reports[1].file == TrainerRun::FileName(1, 2));
        CHECK(reports[1].delta.key.empty() == (step == 1));
        CHECK(reports[1].anchor.key.empty() == (step != 1 && step % 3 != 0));
        CHECK(reports[1].uploaded_bytes > 0);
      }
      // The same file again is a no-op.
      PublishFileOptions again;
      again.step = 7;
      again.next = run.Path(7, 1);
      again.prev = run.Path(6, 1);
      again.shard = 1;
      again.count = 2;
      again.sign_key = tmp / "key";
      PublishFileResult r;
      REQUIRE(PublishFile(url, again, &r).ok());
      CHECK(r.already_published);
      CHECK(r.uploaded_bytes == 0);

      // A region pulls step 5, then the latest by the chain after it.
      const std::string dir = tmp / ("region-" + b.name);
      PullFilesOptions pull;
      pull.step = 5;
      pull.trusted_keys = {tmp / "key.pub"};
      PullFilesResult pulled;
      REQUIRE(PullFiles(url, dir, pull, &pulled).ok());
      CHECK(pulled.route == "anchor 3 -> 5");
      sync::test::CheckHolds(dir, run, 5);
      // kNoStep is no step: not "the newest" (kLatestStep), and DIR stays as it was.
      pull.step = kNoStep;
      CHECK(PullFiles(url, dir, pull, &pulled).code() == ErrorCode::kInvalidArgument);
      sync::test::CheckHolds(dir, run, 5);
      MirrorOptions none;
      none.step = kNoStep;
      MirrorResult mirrored;
      CHECK(MirrorSteps(url, tmp / ("mirror-" + b.name), none, &mirrored).code() ==
            ErrorCode::kInvalidArgument);
      pull.step = kLatestStep;
      REQUIRE(PullFiles(url, dir, pull, &pulled).ok());
      CHECK(pulled.from_step == 5);
      CHECK(pulled.to_step == 7);
      CHECK(pulled.steps == std::vector<uint64_t>{6, 7});
      CHECK(pulled.fetched_bytes > 0);
      sync::test::CheckHolds(dir, run, 7);
      REQUIRE(PullFiles(url, dir, pull, &pulled).ok());
      CHECK(pulled.up_to_date);

      std::vector<StepInfo> steps;
      REQUIRE(ListSteps(url, StoreSettings(), true, &steps).ok());
      REQUIRE(steps.size() == 7);
      for (const StepInfo& s : steps) {
        CHECK(s.committed);
        CHECK(s.count == 2);
        CHECK(s.anchor == (s.step == 1 || s.step % 3 == 0));
        CHECK(s.base_step == (s.step == 1 ? kNoStep : s.step - 1));
        REQUIRE(s.shards.size() == 2);
        CHECK(s.shards[1].file == TrainerRun::FileName(1, 2));
        CHECK(s.delta_bytes == s.shards[0].delta_bytes + s.shards[1].delta_bytes);
        CHECK(s.objects > 0);
      }

      std::vector<StepVerdict> verdicts;
      REQUIRE(VerifySteps(url, StoreSettings(), {tmp / "key.pub"}, &verdicts).ok());
      REQUIRE(verdicts.size() == 7);
      for (const StepVerdict& v : verdicts) {
        CHECK(v.status.ok());
        CHECK(v.keyid == key_id);
      }
      // Another key verifies nothing.
      REQUIRE(GenerateSigningKey(tmp / ("other-" + b.name), &key_id).ok());
      REQUIRE(
          VerifySteps(url, StoreSettings(), {tmp / ("other-" + b.name + ".pub")}, &verdicts).ok());
      for (const StepVerdict& v : verdicts) CHECK(v.status.code() == ErrorCode::kUntrusted);

      // Anchors at 1, 3, 6: keeping 2 deletes steps 1 and 2; a dry run deletes nothing.
      PruneResult pruned;
      REQUIRE(PruneSteps(url, StoreSettings(), 2, true, 0, &pruned).ok());
      CHECK(pruned.keep_from == 3);
      CHECK(pruned.deleted_steps == std::vector<uint64_t>{1, 2});
      REQUIRE(ListSteps(url, StoreSettings(), false, &steps).ok());
      CHECK(steps.size() == 7);
      REQUIRE(PruneSteps(url, StoreSettings(), 2, false, 0, &pruned).ok());
      REQUIRE(ListSteps(url, StoreSettings(), false, &steps).ok());
      REQUIRE(steps.size() == 5);
      CHECK(steps[0].step == 3);
      CHECK(steps[0].shards.empty());  // not asked for
    }
  }
}

TEST_CASE(
    "following files: a region keeps up, and a store that is not there is waited for or refused") {
  TempDir tmp;
  TrainerRun run(tmp / "run", TwoShards(), 0.01, 12);
  const std::string url = tmp / "store";
  std::vector<PublishFileResult> reports;
  for (uint64_t step = 1; step <= 3; ++step) {
    if (step > 1) run.Advance();
    run.Write(step);
    PublishStep(url, run, step, step > 1, "", &reports);
  }
  FollowOptions follow;
  follow.interval_seconds = 0.05;
  follow.until = 3;
  std::vector<uint64_t> pulled;
  const Status s = FollowFiles(url, tmp / "region", PullFilesOptions(), follow,
                               [&](const FollowEvent& e, const PullFilesResult* r) {
                                 if (e.kind == FollowEvent::Kind::kPulled) {
                                   REQUIRE(r != nullptr);
                                   pulled.push_back(r->to_step);
                                 }
                                 return true;
                               });
  REQUIRE(s.ok());
  CHECK(pulled == std::vector<uint64_t>{3});
  sync::test::CheckHolds(tmp / "region", run, 3);

  // A committed step whose objects are missing is not waited for as a step still being
  // written: each poll that cannot pull it is a failure, and max_failures of them in a
  // row end the follow with not_found; the region keeps step 3.
  run.Advance();
  run.Write(4);
  PublishStep(url, run, 4, true, "", &reports);
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(std::string(tmp / "store") + "/o")) {
    if (entry.path().string().find("/000000000004-") != std::string::npos &&
        entry.is_regular_file()) {
      std::filesystem::remove(entry.path());
    }
  }
  follow.until = 4;
  follow.max_failures = 3;
  int retries = 0, waited = 0;
  const Status missing = FollowFiles(url, tmp / "region", PullFilesOptions(), follow,
                                     [&](const FollowEvent& e, const PullFilesResult*) {
                                       retries += e.kind == FollowEvent::Kind::kRetrying;
                                       waited += e.kind == FollowEvent::Kind::kWaiting;
                                       return waited == 0;  // a wait here would be for ever
                                     });
  CHECK_MESSAGE(missing.code() == ErrorCode::kNotFound, missing.ToString());
  CHECK(retries == 2);
  CHECK(waited == 0);
  sync::test::CheckHolds(tmp / "region", run, 3);
  follow.max_failures = 10;

  // Pull and list refuse a local store that does not exist; follow waits for it (and here
  // stops when told).
  PullFilesResult report;
  CHECK(PullFiles(tmp / "nowhere", tmp / "region2", PullFilesOptions(), &report).code() ==
        ErrorCode::kNotFound);
  std::vector<StepInfo> steps;
  CHECK(ListSteps(tmp / "nowhere", StoreSettings(), false, &steps).code() == ErrorCode::kNotFound);
  int waits = 0;
  follow.stop_requested = [&] { return waits > 0; };
  CHECK(FollowFiles(tmp / "nowhere", tmp / "region2", PullFilesOptions(), follow,
                    [&](const FollowEvent& e, const PullFilesResult*) {
                      waits += e.kind == FollowEvent::Kind::kWaiting;
                      return true;
                    })
            .ok());
  CHECK(waits == 1);
  CHECK(PullFiles("ftp://example/x", tmp / "region2", PullFilesOptions(), &report).code() ==
        ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace arc_v3
