// What the signed-step tests share: the trainer's, a rotated and an attacker's keys, a
// signed publish of a whole step, trusting pulls, and the attacker's raw reads, writes and
// forgeries through the store (it holds the bucket's credentials, not the trainer's key).
#ifndef ARC_V3_TESTS_SYNC_SIGNED_TEST_UTIL_H_
#define ARC_V3_TESTS_SYNC_SIGNED_TEST_UTIL_H_

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "src/checkpoint/container.h"
#include "src/sync/protocol.h"
#include "src/sync/signing.h"
#include "src/sync/sync.h"
#include "tests/sync/sync_test_util.h"

namespace arc_v3 {
namespace sync {
namespace test {

inline std::vector<std::vector<TensorSpec>> TwoShards() {
  return {{{"embed", {10000, 256}}, {"layers.0.norm", {256}}, {"layers.0.w", {1024, 256}}},
          {{"lm_head", {6000, 256}}, {"layers.1.norm", {256}}}};
}

struct Keys {
  std::string trainer, rotated, attacker;  // private key paths; public ones add .pub
  explicit Keys(const TempDir& tmp)
      : trainer(tmp / "trainer.key"), rotated(tmp / "rotated.key"), attacker(tmp / "evil.key") {
    for (const std::string* path : {&trainer, &rotated, &attacker}) {
      SigningKey key;
      REQUIRE(SigningKey::Generate(&key).ok());
      REQUIRE(key.Write(*path).ok());
    }
  }
};

// Publishes `step` of every shard (sequentially: the last one commits), signed by `key`
// ("": unsigned), as anchors or deltas; every shard carries `index` ("": none).
inline void PublishStep(Store* store, const TrainerRun& run, uint64_t step, const std::string& key,
                        bool delta, const std::string& incarnation = kDefaultIncarnation,
                        const std::string& index = "") {
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
    o.index = index;
    PublishReport report;
    const Status s = Publish(store, o, &report);
    INFO("step ", step, " shard ", k, ": ", s.ToString());
    REQUIRE(s.ok());
    CHECK(report.committed == (k + 1 == run.shards()));
  }
}

// Steps 0 (an anchor) to `last` of `run`, each written and published signed by `key`.
inline void PublishSteps(Store* store, TrainerRun* run, uint64_t last, const std::string& key,
                         const std::string& index = "") {
  for (uint64_t step = 0; step <= last; ++step) {
    if (step > 0) run->Advance();
    run->Write(step);
    PublishStep(store, *run, step, key, step > 0, kDefaultIncarnation, index);
  }
}

inline Status PullTrusting(Store* store, const std::string& dir, uint64_t step,
                           const std::vector<std::string>& trust, PullReport* report,
                           const std::string& rows = "") {
  PullOptions o;
  o.step = step;
  o.trusted_keys = trust;
  o.transfers = FastRetries();
  if (!rows.empty()) {
    o.tensors = ".*";
    o.row_begin = 0;
    o.row_end = 100;
  }
  return Pull(store, dir, o, report);
}

inline std::vector<uint8_t> Get(Store* store, const std::string& key) {
  std::vector<uint8_t> bytes;
  REQUIRE(store->Get(key, kMaxDocumentBytes << 4, &bytes, nullptr).ok());
  return bytes;
}
inline void Put(Store* store, const std::string& key, const std::vector<uint8_t>& bytes) {
  REQUIRE(store->Put(key, bytes.data(), bytes.size(), PutMode::kOverwrite).ok());
}
inline void Put(Store* store, const std::string& key, const std::string& text) {
  Put(store, key, std::vector<uint8_t>(text.begin(), text.end()));
}
inline std::string Sha(const std::vector<uint8_t>& bytes) {
  return DigestHex(Sha256(bytes.data(), bytes.size()));
}

// The attacker: flips a byte in the middle of shard 0's delta of `step`, stores it under
// its new key with a matching piece-digest object, and rewrites every XXH3 and SHA-256
// naming it up the chain (record, group index, and if `root` the root), signing what it
// rewrote with its own key. What it cannot make is the trainer's signature.
inline void ForgeDelta(Store* store, uint64_t step, const std::string& attacker_key, bool root) {
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
  REQUIRE(
      checkpoint::Reader::Open(std::make_unique<checkpoint::MemorySource>(object), &reader).ok());
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

}  // namespace test
}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_TESTS_SYNC_SIGNED_TEST_UTIL_H_
