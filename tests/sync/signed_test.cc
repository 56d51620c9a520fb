// Signed steps (src/sync/PROTOCOL.md, "Signed steps") on both stores: honest signed
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
#include "tests/sync/sync_test_util.h"

namespace arc_v3 {
namespace sync {
namespace {

using test::Backend;
using test::TempDir;
using test::CheckHolds;
using test::Snapshot;
using test::TrainerRun;
namespace fs = std::filesystem;

std::vector<std::vector<test::TensorSpec>> TwoShards() {
  return {{{"embed", {10000, 256}}, {"layers.0.norm", {256}}, {"layers.0.w", {1024, 256}}},
          {{"lm_head", {6000, 256}}, {"layers.1.norm", {256}}}};
}

struct Keys {
  std::string trainer, rotated, attacker;  // private key paths; public ones add .pub
  explicit Keys(const TempDir& tmp) : trainer(tmp / "trainer.key"), rotated(tmp / "rotated.key"), attacker(tmp / "evil.key") {
    for (const std::string* path : {&trainer, &rotated, &attacker}) {
      SigningKey key;
      REQUIRE(SigningKey::Generate(&key).ok());
      REQUIRE(key.Write(*path).ok());
    }
  }
};

// Publishes `step` of every shard (sequentially: the last one commits), signed by `key`
// ("": unsigned), as anchors or deltas.
void PublishStep(Store* store, const TrainerRun& run, uint64_t step, const std::string& key, bool delta,
                 const std::string& incarnation = kDefaultIncarnation) {
  for (size_t k = 0; k < run.shards(); ++k) {
    PublishOptions o;
    o.step = step;
    o.next = run.Path(step, k);
    if (delta) o.prev = run.Path(step - 1, k);
    o.shard = static_cast<uint32_t>(k);
    o.count = static_cast<uint32_t>(run.shards());
    o.anchor_every = 4;
    o.incarnation = incarnation;
    o.sign_key = key;
    PublishReport report;
    const Status s = Publish(store, o, &report);
    INFO("step ", step, " shard ", k, ": ", s.ToString());
    REQUIRE(s.ok());
    CHECK(report.committed == (k + 1 == run.shards()));
  }
}

Status PullTrusting(Store* store, const std::string& dir, uint64_t step, const std::vector<std::string>& trust,
                    PullReport* report, const std::string& rows = "") {
  PullOptions o;
  o.step = step;
  o.trust = trust;
  o.store = test::FastRetries();
  if (!rows.empty()) {
    o.tensors = ".*";
    o.row_begin = 0;
    o.row_end = 100;
  }
  return Pull(store, dir, o, report);
}

std::vector<uint8_t> Get(Store* store, const std::string& key) {
  std::vector<uint8_t> bytes;
  REQUIRE(store->Get(key, kMaxDocumentBytes << 4, &bytes, nullptr).ok());
  return bytes;
}
void Put(Store* store, const std::string& key, const std::vector<uint8_t>& bytes) {
  REQUIRE(store->Put(key, bytes.data(), bytes.size(), PutMode::kOverwrite).ok());
}
void Put(Store* store, const std::string& key, const std::string& text) {
  Put(store, key, std::vector<uint8_t>(text.begin(), text.end()));
}
std::string Sha(const std::vector<uint8_t>& bytes) { return DigestHex(Sha256(bytes.data(), bytes.size())); }

// The attacker: flips a byte in the middle of shard 0's delta of `step`, stores it under
// its new key with a matching piece-digest object, and rewrites every XXH3 and SHA-256
// naming it up the chain (record, group index, and if `root` the root), signing what it
// rewrote with its own key. What it cannot make is the trainer's signature.
void ForgeDelta(Store* store, uint64_t step, const std::string& attacker_key, bool root) {
  SigningKey evil;
  REQUIRE(SigningKey::Load(attacker_key, &evil).ok());
  StepManifest m;
  std::vector<uint8_t> root_bytes;
  REQUIRE(ReadManifest(store, step, &m, &root_bytes).ok());
  ShardRecord r = m.shards[0];
  std::vector<uint8_t> object = Get(store, r.delta.key);
  object[r.delta.head_size + (object.size() - r.delta.head_size) / 2] ^= 0x20;
  r.delta.xxh3 = checkpoint::Hash(object.data(), object.size());
  r.delta.key = PieceKey(step, 0, m.count, "delta", r.delta.xxh3);
  r.delta.sha256 = Sha(object);
  Put(store, r.delta.key, object);
  checkpoint::Reader reader;
  REQUIRE(checkpoint::Reader::Open(std::make_unique<checkpoint::MemorySource>(object), &reader).ok());
  std::string sums;
  for (const auto& range : StoredRanges(reader.manifest())) {
    const Digest d = Sha256(object.data() + r.delta.head_size + range.first, range.second);
    sums.append(reinterpret_cast<const char*>(d.data()), d.size());
  }
  r.delta.sums_sha256 = DigestHex(Sha256(sums));
  Put(store, SumsKey(r.delta.key), sums);
  const std::string record = RecordJson(r, &evil);
  Put(store, ShardRecordKey(step, 0, m.count, m.incarnation), record);
  const std::string group_key = GroupIndexKey(step, m.count, m.incarnation, 0);
  const std::vector<uint8_t> group_bytes = Get(store, group_key);
  GroupIndex g;
  REQUIRE(ParseGroupIndex(group_bytes, group_key, &g).ok());
  g.records[0] = {checkpoint::Hash(record.data(), record.size()), record.size()};
  g.record_sha256[0] = DigestHex(Sha256(record));
  const std::string group = GroupIndexJson(g, &evil);
  Put(store, group_key, group);
  if (root) {
    m.groups[0].xxh3 = checkpoint::Hash(group.data(), group.size());
    m.groups[0].size = group.size();
    m.groups[0].sha256 = DigestHex(Sha256(group));
    Put(store, RootKey(step), RootJson(m, &evil));
  }
}

TEST_CASE("signed steps: a trusting region takes its trainer's signed steps only, and never goes back") {
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
    CHECK(PullTrusting(store, none, 2, {tmp / "trainer.key.missing"}, &r).code() == ErrorCode::kInvalidArgument);

    // A byte of a piece flipped, and every digest up to the group index rewritten: the
    // signed root's SHA-256 of the group index differs. Up to the root: its signature is
    // the attacker's. Either way the regions stay as they were, full or sliced.
    const std::string root3 = RootKey(3);
    const std::vector<uint8_t> honest_root = Get(store, root3);
    StepManifest honest;
    REQUIRE(ReadManifest(store, 3, &honest, nullptr).ok());
    const std::string record3 = ShardRecordKey(3, 0, 2, kDefaultIncarnation);
    const std::string group3 = GroupIndexKey(3, 2, kDefaultIncarnation, 0);
    const std::vector<uint8_t> honest_record = Get(store, record3), honest_group = Get(store, group3);
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
        CHECK(PullTrusting(store, tmp / ("plain-" + b.name), 3, {}, &r).code() == ErrorCode::kCorruptChunk);
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
    s = PullTrusting(store, full, kNoStep, {pub}, &r);
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
    s = PullTrusting(store, full, kNoStep, {pub}, &r);
    CHECK(s.code() == ErrorCode::kUntrusted);
    CHECK(Snapshot(full) == at3);
    REQUIRE(store->Delete(RootKey(4)).ok());
    PublishStep(store, run, 4, "", false, "plain");
    s = PullTrusting(store, full, kNoStep, {pub}, &r);
    CHECK(s.code() == ErrorCode::kUntrusted);
    CHECK(s.message().find("not signed") != std::string::npos);
    CHECK(Snapshot(full) == at3);
    REQUIRE(store->Delete(RootKey(4)).ok());

    // A new run signed by the trainer's own key (an anchor step starting over): another
    // run, refused where DIR holds the old one, taken with --reset or by a new region.
    PublishStep(store, run, 4, keys.trainer, false, "run2");
    s = PullTrusting(store, full, kNoStep, {pub}, &r);
    CHECK(s.code() == ErrorCode::kUntrusted);
    CHECK(s.message().find("run") != std::string::npos);
    PullOptions reset;
    reset.trust = {pub};
    reset.reset = true;
    reset.store = test::FastRetries();
    REQUIRE(Pull(store, full, reset, &r).ok());
    CheckHolds(full, run, 4);

    // The key rotated mid-run: steps 5 on are signed by the new key; a region trusting
    // both follows, one trusting the old key alone stops at step 4.
    run.Advance();
    run.Write(5);
    PublishStep(store, run, 5, keys.rotated, true, "run2");
    REQUIRE(PullTrusting(store, full, kNoStep, {pub, rotated_pub}, &r).ok());
    CHECK(r.route == "chain 4 -> 5");
    CheckHolds(full, run, 5);
    const std::string old_only = tmp / ("old-" + b.name);
    REQUIRE(PullTrusting(store, old_only, 4, {pub}, &r).ok());
    CHECK(PullTrusting(store, old_only, kNoStep, {pub}, &r).code() == ErrorCode::kUntrusted);
  }
}

TEST_CASE("signed steps: a signing completer takes no unsigned record; a trusting follower refuses as a region does") {
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
