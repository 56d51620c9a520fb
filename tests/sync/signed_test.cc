// Signed steps (src/sync/SIGNED_STEPS.md, "Signed steps") on both stores: honest signed
// steps are pulled bit-exactly by trusting regions, full and partial, and by trusting
// followers; an attacker who holds the bucket's credentials (this test, through the
// store) cannot make a trusting region load anything else or go back.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "arc_v3_sync.hpp"
#include "src/checkpoint/container.h"
#include "src/sync/protocol.h"
#include "src/sync/signing.h"
#include "src/sync/sync.h"
#include "tests/sync/signed_test_util.h"
#include "tests/sync/sync_test_util.h"

namespace arc_v3 {
namespace sync {
namespace {

using test::Backend;
using test::CheckHolds;
using test::ForgeDelta;
using test::Get;
using test::Keys;
using test::PublishStep;
using test::PullTrusting;
using test::Put;
using test::Snapshot;
using test::TempDir;
using test::TrainerRun;
using test::TwoShards;
namespace fs = std::filesystem;

TEST_CASE(
    "signed steps: a trusting region takes its trainer's signed steps only, and never goes back") {
  TempDir tmp;
  Keys keys(tmp);
  const std::string pub = keys.trainer + ".pub", rotated_pub = keys.rotated + ".pub";
  for (Backend& b : test::Backends(tmp, "signed")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), TwoShards(), 0.02, 41);
    for (uint64_t step = 0; step <= 3; ++step) {
      if (step > 0) run.Advance();
      run.Write(step);
      PublishStep(store, run, step, keys.trainer, step > 0);
    }
    // Honest: the whole run, and a slice, bit for bit.
    const std::string full = tmp / ("full-" + b.name), slice = tmp / ("slice-" + b.name);
    PullReport r;
    REQUIRE(PullTrusting(store, full, 1, {pub}, &r).ok());
    CheckHolds(full, run, 1);
    REQUIRE(PullTrusting(store, full, 2, {pub}, &r).ok());
    CHECK(r.route == "chain 1 -> 2");
    CheckHolds(full, run, 2);
    REQUIRE(PullTrusting(store, slice, 2, {pub}, &r, "rows").ok());
    // The trainer's key among others (a rotation): trusted.
    REQUIRE(PullTrusting(store, tmp / ("rot-" + b.name), 2, {rotated_pub, pub}, &r).ok());
    // Another key only, or a file that is no key.
    const std::string none = tmp / ("none-" + b.name);
    Status s = PullTrusting(store, none, 2, {keys.attacker + ".pub"}, &r);
    CHECK(s.code() == ErrorCode::kUntrusted);
    CHECK(s.message().find("no trusted key") != std::string::npos);
    CHECK(!fs::exists(none));
    CHECK(PullTrusting(store, none, 2, {tmp / "trainer.key.missing"}, &r).code() ==
          ErrorCode::kInvalidArgument);

    // A byte of a piece flipped, and every digest up to the group index rewritten: the
    // signed root's SHA-256 of the group index differs. Up to the root: its signature is
    // the attacker's. Either way the regions stay as they were, full or sliced.
    const std::string root3 = RootKey(3);
    const std::vector<uint8_t> honest_root = Get(store, root3);
    StepManifest honest;
    REQUIRE(ReadManifest(store, 3, &honest, nullptr).ok());
    const std::string record3 = ShardRecordKey(3, 0, 2, kDefaultIncarnation);
    const std::string group3 = GroupIndexKey(3, 2, kDefaultIncarnation, 0);
    const std::vector<uint8_t> honest_record = Get(store, record3),
                               honest_group = Get(store, group3);
    for (bool root : {false, true}) {
      INFO("forged up to the root: ", root);
      ForgeDelta(store, 3, keys.attacker, root);
      const auto before = Snapshot(full), before_slice = Snapshot(slice);
      s = PullTrusting(store, full, 3, {pub}, &r);
      CHECK(s.code() == ErrorCode::kUntrusted);
      INFO(s.message());
      CHECK(Snapshot(full) == before);
      s = PullTrusting(store, slice, 3, {pub}, &r, "rows");
      CHECK(s.code() == ErrorCode::kUntrusted);
      CHECK(Snapshot(slice) == before_slice);
      if (!root) {
        // Without trust, the group index fails its root's XXH3: damage, as any reader sees it.
        CHECK(PullTrusting(store, tmp / ("plain-" + b.name), 3, {}, &r).code() ==
              ErrorCode::kCorruptChunk);
      }
      Put(store, record3, honest_record);
      Put(store, group3, honest_group);
      Put(store, root3, honest_root);
    }
    // The object alone damaged (its key kept): its SHA-256 or a piece's differs.
    std::vector<uint8_t> object = Get(store, honest.shards[1].delta.key);
    const std::vector<uint8_t> honest_object = object;
    object[object.size() - 5] ^= 1;
    Put(store, honest.shards[1].delta.key, object);
    CHECK(PullTrusting(store, full, 3, {pub}, &r).code() == ErrorCode::kUntrusted);
    CHECK(PullTrusting(store, slice, 3, {pub}, &r, "rows").code() == ErrorCode::kUntrusted);
    Put(store, honest.shards[1].delta.key, honest_object);
    // A truncated signature on the root.
    {
      std::string text(honest_root.begin(), honest_root.end());
      Envelope e;
      REQUIRE(ParseEnvelope(text, root3, &e).ok());
      const std::string sig = Base64(e.signatures[0].sig);
      const size_t at = text.find(sig);
      REQUIRE(at != std::string::npos);
      text.replace(at, sig.size(), Base64(e.signatures[0].sig.substr(0, 40)));
      Put(store, root3, text);
      s = PullTrusting(store, full, 3, {pub}, &r);
      CHECK(s.code() == ErrorCode::kUntrusted);
      CHECK(s.message().find("does not verify") != std::string::npos);
      Put(store, root3, honest_root);
    }
    REQUIRE(PullTrusting(store, full, 3, {pub}, &r).ok());
    CheckHolds(full, run, 3);

    // Replays: `latest` at step 1 and the later roots gone; step 1 asked for by name; the
    // roots of steps 2 and 3 swapped. The region stays at step 3.
    const std::vector<uint8_t> root2 = Get(store, RootKey(2));
    const auto at3 = Snapshot(full);
    Put(store, "latest", LatestJson(1));
    REQUIRE(store->Delete(RootKey(3)).ok());
    REQUIRE(store->Delete(RootKey(2)).ok());
    s = PullTrusting(store, full, kLatestStep, {pub}, &r);
    CHECK(s.code() == ErrorCode::kUntrusted);
    CHECK(s.message().find("older") != std::string::npos);
    CHECK(PullTrusting(store, full, 1, {pub}, &r).code() == ErrorCode::kUntrusted);
    Put(store, RootKey(2), honest_root);
    Put(store, RootKey(3), root2);
    CHECK_FALSE(PullTrusting(store, full, 3, {pub}, &r).ok());
    CHECK(Snapshot(full) == at3);
    Put(store, RootKey(2), root2);
    Put(store, RootKey(3), honest_root);
    Put(store, "latest", LatestJson(3));

    // The attacker's own run at step 4, signed by its key, then unsigned: refused.
    run.Advance();
    run.Write(4);
    PublishStep(store, run, 4, keys.attacker, false, "evil");
    s = PullTrusting(store, full, kLatestStep, {pub}, &r);
    CHECK(s.code() == ErrorCode::kUntrusted);
    CHECK(Snapshot(full) == at3);
    REQUIRE(store->Delete(RootKey(4)).ok());
    PublishStep(store, run, 4, "", false, "plain");
    s = PullTrusting(store, full, kLatestStep, {pub}, &r);
    CHECK(s.code() == ErrorCode::kUntrusted);
    CHECK(s.message().find("not signed") != std::string::npos);
    CHECK(Snapshot(full) == at3);
    REQUIRE(store->Delete(RootKey(4)).ok());

    // A new run signed by the trainer's own key (an anchor step starting over): another
    // run, refused where DIR holds the old one, taken with --reset or by a new region.
    PublishStep(store, run, 4, keys.trainer, false, "run2");
    s = PullTrusting(store, full, kLatestStep, {pub}, &r);
    CHECK(s.code() == ErrorCode::kUntrusted);
    CHECK(s.message().find("run") != std::string::npos);
    PullOptions reset;
    reset.trusted_keys = {pub};
    reset.reset = true;
    reset.transfers = test::FastRetries();
    REQUIRE(Pull(store, full, reset, &r).ok());
    CheckHolds(full, run, 4);

    // The key rotated mid-run: steps 5 on are signed by the new key; a region trusting
    // both follows, one trusting the old key alone stops at step 4.
    run.Advance();
    run.Write(5);
    PublishStep(store, run, 5, keys.rotated, true, "run2");
    REQUIRE(PullTrusting(store, full, kLatestStep, {pub, rotated_pub}, &r).ok());
    CHECK(r.route == "chain 4 -> 5");
    CheckHolds(full, run, 5);
    const std::string old_only = tmp / ("old-" + b.name);
    REQUIRE(PullTrusting(store, old_only, 4, {pub}, &r).ok());
    CHECK(PullTrusting(store, old_only, kLatestStep, {pub}, &r).code() == ErrorCode::kUntrusted);
  }
}

TEST_CASE(
    "signed steps: a signing completer takes no unsigned record; a trusting follower refuses as a "
    "region does") {
  TempDir tmp;
  Keys keys(tmp);
  for (Backend& b : test::Backends(tmp, "signed-roles")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), TwoShards(), 0.02, 43);
    run.Write(0);
    // Shard 0 unsigned, shard 1 signing: the step does not commit.
    PublishOptions o;
    o.step = 0;
    o.count = 2;
    o.next = run.Path(0, 0);
    PublishReport report;
    REQUIRE(Publish(store, o, &report).ok());
    o.shard = 1;
    o.next = run.Path(0, 1);
    o.sign_key = keys.trainer;
    const Status s = Publish(store, o, &report);
    CHECK(s.code() == ErrorCode::kUntrusted);
    CHECK(s.message().find("completes no step") != std::string::npos);
    StepManifest m;
    CHECK(ReadRoot(store, 0, &m, nullptr).code() == ErrorCode::kNotFound);
    // Signed by both: committed. A trusting follower follows, and refuses a forged step.
    o.shard = 0;
    o.next = run.Path(0, 0);
    o.incarnation = "signed";
    REQUIRE(Publish(store, o, &report).ok());
    o.shard = 1;
    o.next = run.Path(0, 1);
    REQUIRE(Publish(store, o, &report).ok());
    CHECK(report.committed);
    run.Advance();
    run.Write(1);
    PublishStep(store, run, 1, keys.trainer, true, "signed");
    FollowerOptions fo;
    fo.trusted_keys = {keys.trainer + ".pub"};
    fo.threads = 2;
    std::unique_ptr<Follower> follower, slice;
    REQUIRE(Follower::Open(b.url, fo, &follower).ok());
    fo.tensors = "embed";
    REQUIRE(Follower::Open(b.url, fo, &slice).ok());
    FollowResult pulled;
    const Status first = follower->Pull(0, &pulled);
    INFO(first.ToString());
    REQUIRE(first.ok());
    REQUIRE(slice->Pull(0, &pulled).ok());
    ForgeDelta(store, 1, keys.attacker, false);
    CHECK(follower->Pull(kLatestStep, &pulled).code() == ErrorCode::kUntrusted);
    CHECK(follower->step() == 0);
    CHECK(slice->Pull(kLatestStep, &pulled).code() == ErrorCode::kUntrusted);
    FollowerOptions other;
    other.trusted_keys = {keys.attacker + ".pub"};
    std::unique_ptr<Follower> wrong;
    REQUIRE(Follower::Open(b.url, other, &wrong).ok());
    CHECK(wrong->Pull(0, &pulled).code() == ErrorCode::kUntrusted);
    other.trusted_keys = {tmp / "no-such.pub"};
    CHECK(Follower::Open(b.url, other, &wrong).code() == ErrorCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace sync
}  // namespace arc_v3
