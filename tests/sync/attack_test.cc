// Signed steps under attack (src/sync/SIGNED_STEPS.md, "Signed steps"), by an attacker who can
// write anything in the bucket but does not hold the trainer's key: this test, through the
// store, its files and the region's settings. Each case is one that a 1.0 trusting region
// took, or answered with another code than kUntrusted (exit 8): XXH3-equal forgeries of the
// documents a region relies on, tampered envelopes and roots, trust switched off by
// leaving the keys out, a FIFO in the store, documents with a member named twice, and a
// bad step that stopped a trusting follower.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "arc_v3_sync.hpp"
#include "src/sync/dir_state.h"
#include "src/sync/protocol.h"
#include "src/sync/signing.h"
#include "src/sync/sync.h"
#include "tests/sync/signed_test_util.h"
#include "tests/sync/sync_test_util.h"
#include "tests/sync/xxh3_forge.h"

namespace arc_v3 {
namespace sync {
namespace {

using test::Backend;
using test::CheckHolds;
using test::Get;
using test::Keys;
using test::PublishStep;
using test::PullTrusting;
using test::Put;
using test::ReadBytes;
using test::Snapshot;
using test::TempDir;
using test::TrainerRun;
using test::TwoShards;
namespace fs = std::filesystem;

std::string Text(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

// A sharded checkpoint's index of 150 to 240 bytes whose first 128 hold the mapping and a
// padding string: the attacker's forger (xxh3_forge.h) remaps a tensor within its length.
std::string IndexText() {
  return "{\"weight_map\":{\"embed\":\"model-00001-of-00002.safetensors\"},\"pad\":\"" +
         std::string(100, 'p') + "\"}\n";
}

// The files a full pull of `run` leaves in DIR, with the index: each shard's bit for bit.
void CheckFiles(const std::string& dir, const TrainerRun& run, uint64_t step) {
  for (size_t k = 0; k < run.shards(); ++k) {
    CHECK(ReadBytes(dir + "/" + TrainerRun::FileName(k, run.shards())) ==
          ReadBytes(run.Path(step, k)));
  }
}

TEST_CASE(
    "attack: an index of the same size and XXH3 is refused, under trust and without; log --verify "
    "says so") {
  TempDir tmp;
  Keys keys(tmp);
  const std::string pub = keys.trainer + ".pub";
  const std::string index_path = tmp / "index.json";
  const std::string genuine = IndexText();
  { std::ofstream(index_path, std::ios::binary) << genuine; }
  // The attacker's index: `embed` in the other shard's file, the same size and XXH3.
  std::string wanted = genuine;
  wanted.replace(wanted.find("00001-of"), 5, "00002");
  const std::string forged =
      test::ForgeXxh3(genuine, wanted, test::PositionsOf(wanted, "\"pad\":\""));
  REQUIRE(!forged.empty());
  REQUIRE(checkpoint::Hash(forged.data(), forged.size()) ==
          checkpoint::Hash(genuine.data(), genuine.size()));
  REQUIRE(forged.find("\"embed\":\"model-00002-of-00002") != std::string::npos);
  for (Backend& b : test::Backends(tmp, "attack-index")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), TwoShards(), 0.02, 51);
    test::PublishSteps(store, &run, 2, keys.trainer, index_path);
    const std::string dir = tmp / ("region-" + b.name);
    PullReport r;
    REQUIRE(PullTrusting(store, dir, 1, {pub}, &r).ok());
    CHECK(Text(ReadBytes(dir + "/" + kIndexFileName)) == genuine);
    StepManifest m;
    REQUIRE(ReadManifest(store, 2, &m, nullptr).ok());
    const std::string key = m.index()->key;
    Put(store, key, forged);
    const auto before = Snapshot(dir);
    Status s = PullTrusting(store, dir, 2, {pub}, &r);
    CHECK(s.code() == ErrorCode::kUntrusted);
    CHECK(s.message().find("SHA-256") != std::string::npos);
    CHECK(Snapshot(dir) == before);
    // Without trust the signed record's SHA-256 still names other bytes.
    const std::string plain = tmp / ("plain-" + b.name);
    CHECK(PullTrusting(store, plain, 2, {}, &r).code() == ErrorCode::kUntrusted);
    CHECK(!fs::exists(plain));
    std::vector<StepVerdict> verdicts;
    REQUIRE(VerifySteps(store, {pub}, &verdicts).ok());
    REQUIRE(verdicts.size() == 3);
    CHECK(verdicts[1].status.ok());
    CHECK(verdicts[2].status.code() == ErrorCode::kUntrusted);
    CHECK(verdicts[2].status.message().find(key) != std::string::npos);
    // The genuine index back: the step is taken.
    Put(store, key, genuine);
    REQUIRE(PullTrusting(store, dir, 2, {pub}, &r).ok());
    CheckFiles(dir, run, 2);
    CHECK(Text(ReadBytes(dir + "/" + kIndexFileName)) == genuine);
  }
}

TEST_CASE("attack: a cached layout of the same XXH3 as the root's is not used under trust") {
  TempDir tmp;
  Keys keys(tmp);
  const std::string pub = keys.trainer + ".pub";
  // One shard of one tensor whose long name makes the layout 236 bytes (at most 240: the
  // forger's reach).
  Layout probe;
  probe.shards.push_back({TrainerRun::FileName(0, 1), {"w"}});
  const size_t base = LayoutJson(probe).size();
  REQUIRE(base < 170);
  const std::string name = "w" + std::string(236 - base, 'n');
  std::string forged, forged_from;
  for (Backend& b : test::Backends(tmp, "attack-layout")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), {{{name, {512, 64}}}}, 0.02, 52);
    run.Write(0);
    PublishStep(store, run, 0, keys.trainer, false);
    const std::string dir = tmp / ("slice-" + b.name);
    PullReport r;
    REQUIRE(PullTrusting(store, dir, 0, {pub}, &r, "rows").ok());
    StepManifest m;
    REQUIRE(ReadRoot(store, 0, &m, nullptr).ok());
    const std::string cached =
        dir + "/.arc_v3/layouts/" + checkpoint::HexU64(m.groups[0].layout_xxh3) + ".json";
    const std::string genuine = Text(ReadBytes(cached));
    REQUIRE(genuine.size() == 236);
    // Another tensor name, of the same XXH3: its last character changed, the others chosen.
    std::string wanted = genuine;
    const size_t last = wanted.find("\"", wanted.find("\"wn") + 1) - 1;
    wanted[last] = 'X';
    std::vector<size_t> free = test::PositionsOf(wanted, "\"wn");
    free.pop_back();
    // The layout names no step or store: every backend's is the same, forged once.
    if (forged.empty() || forged_from != genuine) forged = test::ForgeXxh3(genuine, wanted, free);
    forged_from = genuine;
    REQUIRE(!forged.empty());
    { std::ofstream(cached, std::ios::binary | std::ios::trunc) << forged; }
    run.Advance();
    run.Write(1);
    PublishStep(store, run, 1, keys.trainer, true);
    const Status s = PullTrusting(store, dir, 1, {pub}, &r, "rows");
    INFO(s.ToString());
    REQUIRE(s.ok());
    CHECK(r.route == "chain 0 -> 1");
    // The region holds the selected rows of step 1 and the layout the root names again.
    PullReport full_report;
    const std::string full = tmp / ("full-" + b.name);
    REQUIRE(PullTrusting(store, full, 1, {pub}, &full_report).ok());
    CHECK(Text(ReadBytes(cached)) == genuine);
    std::vector<uint8_t> whole = ReadBytes(full + "/" + TrainerRun::FileName(0, 1));
    CHECK(whole == ReadBytes(run.Path(1, 0)));
  }
}

TEST_CASE(
    "attack: under trust the chain joins a region only where a signed root names its root's "
    "SHA-256") {
  TempDir tmp;
  Keys keys(tmp);
  const std::string pub = keys.trainer + ".pub";
  for (Backend& b : test::Backends(tmp, "attack-link")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), TwoShards(), 0.02, 53);
    test::PublishSteps(store, &run, 2, keys.trainer);
    PullReport r;
    for (const char* edit : {"", "other", "none"}) {
      INFO("the state's root_sha256: ", edit);
      const std::string dir = tmp / (std::string("region-") + edit + "-" + b.name);
      REQUIRE(PullTrusting(store, dir, 1, {pub}, &r).ok());
      DirState state;
      REQUIRE(ReadState(dir, &state).ok());
      const std::vector<uint8_t> root1 = Get(store, RootKey(1));
      CHECK(state.root_sha256 == DigestHex(Sha256(root1.data(), root1.size())));
      CHECK(state.trusted_keys.size() == 1);
      if (std::string(edit) == "other") state.root_sha256 = std::string(64, '0');
      if (std::string(edit) == "none") state.root_sha256.clear();
      REQUIRE(WriteState(dir, state).ok());
      REQUIRE(PullTrusting(store, dir, 2, {pub}, &r).ok());
      CHECK(r.route == (*edit == 0 ? "chain 1 -> 2" : "anchor 0 -> 2"));
      CheckHolds(dir, run, 2);
    }
  }
}

TEST_CASE("attack: trust stays on once taken; emptied keys are no way to switch it off") {
  TempDir tmp;
  Keys keys(tmp);
  const std::string pub = keys.trainer + ".pub";
  for (Backend& b : test::Backends(tmp, "attack-sticky")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), TwoShards(), 0.02, 54);
    test::PublishSteps(store, &run, 1, keys.trainer);
    const std::string dir = tmp / ("region-" + b.name);
    PullReport r;
    REQUIRE(PullTrusting(store, dir, 0, {pub}, &r).ok());
    // Another run's unsigned step 2 (an attacker's, or anyone's): a pull without keys is
    // refused, whatever the store holds, and so is a follow.
    run.Advance();
    run.Write(2);
    PublishStep(store, run, 2, "", false, "plain");
    const auto before = Snapshot(dir);
    Status s = PullTrusting(store, dir, kLatestStep, {}, &r);
    CHECK(s.code() == ErrorCode::kUntrusted);
    CHECK(s.message().find("pulled trusting key") != std::string::npos);
    CHECK(Snapshot(dir) == before);
    PullOptions o;
    o.transfers = test::FastRetries();
    FollowOptions fo;
    fo.interval_seconds = 0.05;
    fo.until = 2;
    CHECK(Follow(b.url, dir, o, fo, nullptr).code() == ErrorCode::kUntrusted);
    CHECK(Snapshot(dir) == before);
    // The region's keys again: the unsigned step is refused, the trainer's taken.
    CHECK(PullTrusting(store, dir, kLatestStep, {pub}, &r).code() == ErrorCode::kUntrusted);
    REQUIRE(PullTrusting(store, dir, 1, {pub}, &r).ok());
    // Said explicitly, by a reset: the directory is pulled without trust from then on.
    o.reset = true;
    REQUIRE(Pull(store, dir, o, &r).ok());
    CHECK(r.to_step == 2);
    DirState state;
    REQUIRE(ReadState(dir, &state).ok());
    CHECK(state.trusted_keys.empty());
  }
}

TEST_CASE(
    "attack: every tampering a trusting region meets is kUntrusted, the region untouched; "
    "untrusting, damage") {
  TempDir tmp;
  Keys keys(tmp);
  const std::string pub = keys.trainer + ".pub";
  for (Backend& b : test::Backends(tmp, "attack-tamper")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), TwoShards(), 0.02, 55);
    test::PublishSteps(store, &run, 2, keys.trainer);
    const std::string dir = tmp / ("region-" + b.name), slice = tmp / ("slice-" + b.name);
    PullReport r;
    REQUIRE(PullTrusting(store, dir, 1, {pub}, &r).ok());
    REQUIRE(PullTrusting(store, slice, 1, {pub}, &r, "rows").ok());
    const std::string root2 = RootKey(2);
    const std::string honest = Text(Get(store, root2));
    Envelope e;
    REQUIRE(ParseEnvelope(honest, root2, &e).ok());
    const std::string payload = Base64(e.payload), sig = Base64(e.signatures[0].sig);
    const auto envelope = [&](const std::string& body) { return "{" + body + "}\n"; };
    const std::string type = "\"payloadType\": \"" + e.type + "\"";
    const std::string sigs = "\"signatures\": [{\"keyid\": \"" + e.signatures[0].keyid +
                             "\", \"sig\": \"" + sig + "\"}]";
    StepManifest m;
    REQUIRE(ReadManifest(store, 2, &m, nullptr).ok());
    const std::string object = m.shards[1].delta.key;
    const std::vector<uint8_t> honest_object = Get(store, object);
    struct Case {
      const char* what;
      std::string key, bytes;
      ErrorCode untrusting;  // what a reader without keys gets
    };
    std::string spaced = payload;
    spaced.insert(spaced.size() / 2, " ");
    const std::vector<Case> cases = {
        {"an older signed root at step 2's key", root2, Text(Get(store, RootKey(1))),
         ErrorCode::kCorruptHeader},
        {"another payloadType", root2,
         envelope("\"payload\": \"" + payload + "\", \"payloadType\": \"application/json\", " +
                  sigs),
         ErrorCode::kCorruptHeader},
        {"base64 with a space", root2,
         envelope("\"payload\": \"" + spaced + "\", " + type + ", " + sigs),
         ErrorCode::kCorruptHeader},
        {"no signature", root2,
         envelope("\"payload\": \"" + payload + "\", " + type + ", \"signatures\": []"),
         ErrorCode::kCorruptHeader},
        {"a field added", root2,
         envelope("\"payload\": \"" + payload + "\", " + type + ", " + sigs + ", \"note\": \"x\""),
         ErrorCode::kCorruptHeader},
        {"a field named twice", root2,
         envelope("\"payload\": \"" + payload + "\", " + type + ", " + type + ", " + sigs),
         ErrorCode::kCorruptHeader},
        {"the root unsigned (its signed fields kept)", root2, e.payload, ErrorCode::kCorruptHeader},
        {"an object cut short", object, Text(honest_object).substr(0, honest_object.size() / 2),
         ErrorCode::kTruncated},
    };
    for (const Case& c : cases) {
      INFO(c.what);
      const std::string keep = Text(Get(store, c.key));
      Put(store, c.key, c.bytes);
      const auto before = Snapshot(dir), before_slice = Snapshot(slice);
      Status s = PullTrusting(store, dir, 2, {pub}, &r);
      CHECK(s.code() == ErrorCode::kUntrusted);
      INFO(s.message());
      CHECK(Snapshot(dir) == before);
      s = PullTrusting(store, slice, 2, {pub}, &r, "rows");
      CHECK(s.code() == ErrorCode::kUntrusted);
      CHECK(Snapshot(slice) == before_slice);
      // Without keys: damage keeps its own code.
      const std::string plain = tmp / ("plain-" + b.name);
      s = PullTrusting(store, plain, 2, {}, &r);
      if (c.untrusting == ErrorCode::kTruncated) {
        CHECK(!s.ok());  // the chain's object: the anchor route, or truncated
      } else {
        CHECK(s.code() == c.untrusting);
      }
      fs::remove_all(plain);
      Put(store, c.key, keep);
    }
    REQUIRE(PullTrusting(store, dir, 2, {pub}, &r).ok());
    CheckHolds(dir, run, 2);
  }
}

TEST_CASE(
    "attack: a trusting follower refuses a bad step, keeps what it holds, and takes the next step "
    "that verifies") {
  TempDir tmp;
  Keys keys(tmp);
  const std::string pub = keys.trainer + ".pub";
  for (Backend& b : test::Backends(tmp, "attack-follow")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), TwoShards(), 0.02, 56);
    test::PublishSteps(store, &run, 2, keys.trainer);
    FollowerOptions fo;
    fo.trusted_keys = {pub};
    std::unique_ptr<Follower> follower;
    REQUIRE(Follower::Open(b.url, fo, &follower).ok());
    FollowResult pulled;
    REQUIRE(follower->Pull(2, &pulled).ok());
    const std::string dir = tmp / ("region-" + b.name);
    PullReport r;
    REQUIRE(PullTrusting(store, dir, 2, {pub}, &r).ok());
    // Step 3's shard 0 forged (record and group index rewritten and signed by the
    // attacker); step 4 is the next anchor (anchor_every 4), whose route avoids step 3.
    run.Advance();
    run.Write(3);
    PublishStep(store, run, 3, keys.trainer, true);
    test::ForgeDelta(store, 3, keys.attacker, false);
    std::vector<FollowEvent> events;
    bool published = false;
    const auto on_refused = [&](const FollowEvent& e) {
      events.push_back(e);
      if (e.kind == FollowEvent::Kind::kRefused && !published) {
        published = true;
        run.Advance();
        run.Write(4);
        PublishStep(store, run, 4, keys.trainer, true);
      }
      return true;
    };
    FollowOptions options;
    options.interval_seconds = 0.05;
    options.until = 4;
    options.max_failures = 1;
    Status s = follower->Follow(
        options, [&](const FollowEvent& e, const FollowResult*) { return on_refused(e); });
    INFO(s.ToString());
    REQUIRE(s.ok());
    CHECK(follower->step() == 4);
    REQUIRE(!events.empty());
    CHECK(events.front().kind == FollowEvent::Kind::kRefused);
    CHECK(events.front().step == 3);
    CHECK(events.back().kind == FollowEvent::Kind::kPulled);
    // The same for a region's directory, by the same loop.
    events.clear();
    PullOptions o;
    o.trusted_keys = {pub};
    o.transfers = test::FastRetries();
    s = Follow(b.url, dir, o, options, [&](const FollowEvent& e, const PullReport*) {
      events.push_back(e);
      return true;
    });
    REQUIRE(s.ok());
    CheckHolds(dir, run, 4);
    // Step 5 signed by the attacker: reported, and the loop goes on watching.
    run.Advance();
    run.Write(5);
    PublishStep(store, run, 5, keys.attacker, true);
    events.clear();
    options.until = kNoStep;
    const auto start = std::chrono::steady_clock::now();
    options.stop_requested = [&] {
      return std::chrono::steady_clock::now() - start > std::chrono::milliseconds(600);
    };
    s = Follow(b.url, dir, o, options, [&](const FollowEvent& e, const PullReport*) {
      events.push_back(e);
      return true;
    });
    CHECK(s.ok());
    REQUIRE(events.size() == 2);  // by its cheapest route and its anchor's, not at every poll
    for (const FollowEvent& e : events) {
      CHECK(e.kind == FollowEvent::Kind::kRefused);
      CHECK(e.step == 5);
    }
    CheckHolds(dir, run, 4);
  }
}

TEST_CASE("attack: a FIFO or a member named twice in the store is refused at once") {
  TempDir tmp;
  Keys keys(tmp);
  const std::string pub = keys.trainer + ".pub";
  for (Backend& b : test::Backends(tmp, "attack-fifo")) {
    INFO("store ", b.name);
    Store* store = b.store.get();
    TrainerRun run(tmp / ("trainer-" + b.name), TwoShards(), 0.02, 57);
    run.Write(0);
    PublishStep(store, run, 0, keys.trainer, false);
    PullReport r;
    // `latest` naming two steps: one reading only.
    Put(store, "latest",
        "{\"format\":\"arc_v3-sync\",\"version\":2,\"kind\":\"latest\",\"step\":0,\"step\":7}\n");
    Status s = PullTrusting(store, tmp / ("twice-" + b.name), kLatestStep, {}, &r);
    CHECK(s.code() == ErrorCode::kCorruptHeader);
    CHECK(s.message().find("'step' twice") != std::string::npos);
    CHECK(PullTrusting(store, tmp / ("twice-" + b.name), kLatestStep, {pub}, &r).code() ==
          ErrorCode::kUntrusted);
    Put(store, "latest", LatestJson(0));
    if (b.name != "local") continue;
    // A FIFO where `latest` is: no reader waits on it.
    const std::string latest = b.url + "/latest";
    REQUIRE(fs::remove(latest));
    REQUIRE(mkfifo(latest.c_str(), 0644) == 0);
    const auto start = std::chrono::steady_clock::now();
    s = PullTrusting(store, tmp / "fifo", kLatestStep, {}, &r);
    CHECK(s.code() == ErrorCode::kCorruptHeader);
    CHECK(s.message().find("not a regular file") != std::string::npos);
    CHECK(PullTrusting(store, tmp / "fifo", kLatestStep, {pub}, &r).code() ==
          ErrorCode::kUntrusted);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
    CHECK(!fs::exists(tmp / "fifo"));
  }
}

TEST_CASE("attack: a publisher whose key cannot sign leaves no store behind") {
  TempDir tmp;
  TrainerRun run(tmp / "trainer", TwoShards(), 0.02, 58);
  run.Write(0);
  { std::ofstream(tmp / "bad.key") << "not a key\n"; }
  PublishFileOptions o;
  o.next = run.Path(0, 0);
  o.count = 2;
  o.sign_key = tmp / "bad.key";
  PublishFileResult report;
  const std::string store = tmp / "store";
  CHECK(PublishFile(store, o, &report).code() == ErrorCode::kInvalidArgument);
  CHECK(!fs::exists(store));
  PublisherOptions po;
  po.sign_key = tmp / "bad.key";
  std::unique_ptr<Publisher> publisher;
  CHECK(Publisher::Open(store, po, &publisher).code() == ErrorCode::kInvalidArgument);
  CHECK(!fs::exists(store));
}

}  // namespace
}  // namespace sync
}  // namespace arc_v3
