// The reader rules a second implementation needs (src/sync/PROTOCOL.md), each as the
// library applies it: the piece-digest object's key, where `latest` leads, rank-0
// tensors under a row slice, the container's file against its record, the order of
// tensors without bytes, the base of an anchor step's deltas, the link between the steps
// of a route, a signed root naming an unsigned document, which signatures count, and a
// member named twice. Documents are rewritten in a local store as a writer of bad
// documents would (their hash chain up to the root rewritten too).
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <fstream>

#include "arc_v3_sync.hpp"
#include "src/checkpoint/safetensors.h"
#include "src/sync/protocol.h"
#include "src/sync/signing.h"
#include "src/sync/sync.h"
#include "tests/sync/signed_test_util.h"
#include "tests/sync/sync_test_util.h"

namespace arc_v3 {
namespace sync {
namespace {

using test::Get;
using test::Keys;
using test::PublishStep;
using test::PullTrusting;
using test::Put;
using test::ReadBytes;
using test::TempDir;
using test::TensorSpec;
using test::TrainerRun;
namespace fs = std::filesystem;

std::string Text(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

// A local store only: these are rules of reading, not of a backend.
struct LocalStore {
  explicit LocalStore(const TempDir& tmp, const std::string& name) : url(tmp / name) {
    fs::create_directories(url);
    store = NewLocalStore(fs::absolute(url).string(), url);  // no URL factory: no libcurl
  }
  std::string url;
  std::unique_ptr<Store> store;
};

// Rewrites shard k's record of `step` in an unsigned store by `edit` (of its JSON text),
// then the group index and root that name it, so that only the reader's rules can tell.
// With `layout`, the group's layout is rewritten from the edited record's file and tensors,
// shard k's tensor names renamed by `rename`.
template <class Edit>
void RewriteRecord(Store* store, uint64_t step, uint32_t k, const Edit& edit, bool layout = false,
                   const std::map<std::string, std::string>& rename = {}) {
  StepManifest m;
  REQUIRE(ReadManifest(store, step, &m, nullptr).ok());
  const std::string record = edit(RecordJson(m.shards[k]));
  Put(store, ShardRecordKey(step, k, m.count, m.incarnation), record);
  const uint32_t g = GroupOf(k);
  const std::string group_key = GroupIndexKey(step, m.count, m.incarnation, g);
  GroupIndex gi;
  REQUIRE(ParseGroupIndex(Get(store, group_key), group_key, &gi).ok());
  gi.records[k % kFanIn] = {checkpoint::Hash(record.data(), record.size()), record.size()};
  if (layout) {
    ShardRecord r;
    REQUIRE(ParseRecord(std::vector<uint8_t>(record.begin(), record.end()), "edited", &r).ok());
    Layout l;
    for (uint32_t i = g * kFanIn; i < std::min(m.count, (g + 1) * kFanIn); ++i) {
      const ShardRecord& s = i == k ? r : m.shards[i];
      Layout shard;  // the shard layout its record names
      REQUIRE(ParseLayout(Get(store, LayoutKey(s.layout_xxh3)), "shard layout", &shard).ok());
      REQUIRE(shard.shards.size() == 1);
      for (std::string& name : shard.shards[0].tensors) {
        if (i == k && rename.count(name) != 0) name = rename.at(name);
      }
      l.shards.push_back({s.file, shard.shards[0].tensors});
    }
    const std::string text = LayoutJson(l);
    gi.layout_xxh3 = checkpoint::Hash(text.data(), text.size());
    gi.layout_size = text.size();
    Put(store, LayoutKey(gi.layout_xxh3), text);
    m.groups[g].layout_xxh3 = gi.layout_xxh3;
    m.groups[g].layout_size = gi.layout_size;
  }
  const std::string group = GroupIndexJson(gi);
  Put(store, group_key, group);
  m.groups[g].xxh3 = checkpoint::Hash(group.data(), group.size());
  m.groups[g].size = group.size();
  Put(store, RootKey(step), RootJson(m));
}

// `text` with the first `"field": value` replaced.
std::string Replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

Status PullTo(Store* store, const std::string& dir, uint64_t step, bool rows = false) {
  PullReport report;
  return PullTrusting(store, dir, step, {}, &report, rows ? "rows" : "");
}

TEST_CASE("reader rules: the piece-digest object sits at its container's key, .sha256 for .a3d") {
  TempDir tmp;
  Keys keys(tmp);
  LocalStore s(tmp, "store");
  TrainerRun run(tmp / "trainer", test::TwoShards(), 0.02, 61);
  test::PublishSteps(s.store.get(), &run, 1, keys.trainer);
  StepManifest m;
  REQUIRE(ReadManifest(s.store.get(), 1, &m, nullptr).ok());
  for (const ShardRecord& r : m.shards) {
    for (const ObjectRef* ref : {&r.delta, &r.anchor}) {
      if (!ref->present()) continue;
      const std::string sums_key = ref->key.substr(0, ref->key.size() - 4) + ".sha256";
      CHECK(SumsKey(ref->key) == sums_key);
      CHECK(ref->key.find("-" + checkpoint::HexU64(ref->xxh3) + ".a3d") != std::string::npos);
      const std::vector<uint8_t> sums = Get(s.store.get(), sums_key);
      CHECK(sums.size() == ref->sums_size);
      CHECK(DigestHex(Sha256(sums.data(), sums.size())) == ref->sums_sha256);
    }
  }
}

TEST_CASE(
    "reader rules: latest leads to the last committed step after it, and to none ahead of the "
    "roots") {
  TempDir tmp;
  LocalStore s(tmp, "store");
  Store* store = s.store.get();
  TrainerRun run(tmp / "trainer", test::TwoShards(), 0.02, 62);
  test::PublishSteps(store, &run, 4, "");  // step 4 is an anchor step (anchor_every 4)
  PullReport r;
  Put(store, "latest", LatestJson(0));  // behind: steps 1 to 4 are probed
  REQUIRE(PullTrusting(store, tmp / "behind", kLatestStep, {}, &r).ok());
  CHECK(r.to_step == 4);
  // Ahead of the roots: step 5 has none, nor has step 6.
  Put(store, "latest", LatestJson(5));
  CHECK(PullTrusting(store, tmp / "ahead", kLatestStep, {}, &r).code() == ErrorCode::kNotFound);
  // Naming a step without a root whose successor has one: the successor (by its anchor).
  REQUIRE(store->Delete(RootKey(3)).ok());
  Put(store, "latest", LatestJson(3));
  REQUIRE(PullTrusting(store, tmp / "past", kLatestStep, {}, &r).ok());
  CHECK(r.to_step == 4);
}

TEST_CASE("reader rules: a row slice holds a rank-0 tensor whole, in the manifest's order") {
  TempDir tmp;
  LocalStore s(tmp, "store");
  TrainerRun run(tmp / "trainer", {{{"w", {300, 16}}, {"scale", {}}, {"v", {20, 8}}}}, 0.05, 63);
  test::PublishSteps(s.store.get(), &run, 1, "");
  PullOptions o;
  o.step = 1;
  o.tensors = ".*";
  o.row_begin = 5;
  o.row_end = 10;
  o.transfers = test::FastRetries();
  PullReport r;
  const std::string dir = tmp / "slice";
  REQUIRE(Pull(s.store.get(), dir, o, &r).ok());
  safetensors::File held, whole;
  REQUIRE(safetensors::File::Open(dir + "/" + TrainerRun::FileName(0, 1), &held).ok());
  REQUIRE(safetensors::File::Open(run.Path(1, 0), &whole).ok());
  const safetensors::TensorInfo* scale = held.Find("scale");
  REQUIRE(scale != nullptr);
  CHECK(scale->shape.empty());
  REQUIRE(scale->size() == 2);
  CHECK(std::memcmp(held.data(*scale), whole.data(*whole.Find("scale")), 2) == 0);
  const safetensors::TensorInfo* w = held.Find("w");
  REQUIRE(w != nullptr);
  CHECK(w->shape == std::vector<uint64_t>{5, 16});
  CHECK(std::memcmp(held.data(*w), whole.data(*whole.Find("w")) + 5 * 16 * 2, 5 * 16 * 2) == 0);
}

TEST_CASE("reader rules: a container holds the record's file, of the record's size") {
  TempDir tmp;
  LocalStore s(tmp, "store");
  Store* store = s.store.get();
  TrainerRun run(tmp / "trainer", test::TwoShards(), 0.02, 64);
  test::PublishSteps(store, &run, 1, "");
  const std::string name0 = TrainerRun::FileName(0, 2);
  // Another name (the layout rewritten alike, so only the container can tell).
  RewriteRecord(
      store, 1, 0, [&](const std::string& t) { return Replace(t, name0, "other.safetensors"); },
      true);
  Status st = PullTo(store, tmp / "name", 1);
  CHECK(st.code() == ErrorCode::kCorruptHeader);
  CHECK(st.message().find("not the record's 'other.safetensors'") != std::string::npos);
  CHECK(PullTo(store, tmp / "name-rows", 1, true).code() == ErrorCode::kCorruptHeader);
}

TEST_CASE("reader rules: a container read beside its layout holds the layout's tensors") {
  TempDir tmp;
  LocalStore s(tmp, "store");
  Store* store = s.store.get();
  TrainerRun run(tmp / "trainer", test::TwoShards(), 0.02, 67);
  test::PublishSteps(store, &run, 1, "");
  // The group layout names another tensor for shard 0 (root and group index rewritten to
  // name it): only a partial pull reads layouts, and only the container can tell.
  RewriteRecord(store, 1, 0, [](const std::string& t) { return t; }, true,
                {{"layers.0.w", "layers.0.renamed"}});
  CHECK(PullTo(store, tmp / "full", 1).ok());
  const Status st = PullTo(store, tmp / "rows", 1, true);
  CHECK(st.code() == ErrorCode::kCorruptHeader);
  CHECK(st.message().find("its tensors are not the ones its layout lists") != std::string::npos);
}

TEST_CASE("reader rules: a record of a file of another size is refused, full or sliced") {
  TempDir tmp;
  LocalStore s(tmp, "store");
  Store* store = s.store.get();
  TrainerRun run(tmp / "trainer", test::TwoShards(), 0.02, 65);
  test::PublishSteps(store, &run, 1, "");
  StepManifest m;
  REQUIRE(ReadManifest(store, 1, &m, nullptr).ok());
  const std::string size = "\"file_size\": " + std::to_string(m.shards[1].file_size);
  RewriteRecord(store, 1, 1, [&](const std::string& t) {
    return Replace(t, size, "\"file_size\": " + std::to_string(m.shards[1].file_size + 2));
  });
  CHECK(PullTo(store, tmp / "size", 1).code() == ErrorCode::kCorruptHeader);
  CHECK(PullTo(store, tmp / "size-rows", 1, true).code() == ErrorCode::kCorruptHeader);
}

TEST_CASE("reader rules: tensors in data-section order, those starting at one offset by name") {
  TempDir tmp;
  LocalStore s(tmp, "store");
  TrainerRun run(tmp / "trainer",
                 {{{"w", {64, 8}}, {"zb", {0, 4}}, {"za", {0, 4}}, {"v", {16, 8}}}}, 0.05, 66);
  test::PublishSteps(s.store.get(), &run, 0, "");
  StepManifest m;
  REQUIRE(ReadManifest(s.store.get(), 0, &m, nullptr).ok());
  Layout shard;  // the shard layout the record names
  REQUIRE(
      ParseLayout(Get(s.store.get(), LayoutKey(m.shards[0].layout_xxh3)), "shard layout", &shard)
          .ok());
  const std::vector<std::string> names = shard.shards.at(0).tensors;
  // w at 0; v, za and zb (these two without bytes) all start where w ends: by name.
  CHECK(names == std::vector<std::string>{"w", "v", "za", "zb"});
  REQUIRE(PullTo(s.store.get(), tmp / "region", 0).ok());
  CHECK(ReadBytes(tmp / ("region/" + TrainerRun::FileName(0, 1))) == ReadBytes(run.Path(0, 0)));
}

TEST_CASE("reader rules: an anchor step's deltas continue the root's base") {
  TempDir tmp;
  LocalStore s(tmp, "store");
  Store* store = s.store.get();
  TrainerRun run(tmp / "trainer", test::TwoShards(), 0.02, 67);
  test::PublishSteps(store, &run, 4, "");  // step 4: anchors and deltas (anchor_every 4)
  StepManifest m;
  REQUIRE(ReadManifest(store, 4, &m, nullptr).ok());
  REQUIRE(m.anchor());
  REQUIRE(m.base_step == 3);
  REQUIRE(m.shards[0].delta.present());
  const std::string region = tmp / "region";
  REQUIRE(PullTo(store, region, 3).ok());
  RewriteRecord(store, 4, 0, [](const std::string& t) {
    return Replace(t, "\"base_step\": 3", "\"base_step\": 2");
  });
  const Status st = PullTo(store, region, 4);
  CHECK(st.code() == ErrorCode::kCorruptHeader);
  CHECK(st.message().find("base_step") != std::string::npos);
}

TEST_CASE("reader rules: a route's deltas continue the previous step's count and incarnation") {
  TempDir tmp;
  LocalStore s(tmp, "store");
  Store* store = s.store.get();
  TrainerRun run(tmp / "trainer", test::TwoShards(), 0.02, 68);
  test::PublishSteps(store, &run, 2, "");
  const std::string region = tmp / "region";
  REQUIRE(PullTo(store, region, 1).ok());
  // Step 2's shards (and their group index, which must agree) claim another start's base.
  StepManifest m;
  REQUIRE(ReadManifest(store, 2, &m, nullptr).ok());
  const std::string group_key = GroupIndexKey(2, 2, kDefaultIncarnation, 0);
  GroupIndex gi;
  REQUIRE(ParseGroupIndex(Get(store, group_key), group_key, &gi).ok());
  for (uint32_t k = 0; k < 2; ++k) {
    m.shards[k].base_incarnation = "other";
    const std::string record = RecordJson(m.shards[k]);
    Put(store, ShardRecordKey(2, k, 2, kDefaultIncarnation), record);
    gi.records[k] = {checkpoint::Hash(record.data(), record.size()), record.size()};
  }
  gi.base_incarnation = "other";
  const std::string group = GroupIndexJson(gi);
  Put(store, group_key, group);
  m.groups[0].xxh3 = checkpoint::Hash(group.data(), group.size());
  m.groups[0].size = group.size();
  Put(store, RootKey(2), RootJson(m));
  Status st = PullTo(store, region, 2);
  CHECK(st.code() == ErrorCode::kCorruptHeader);
  CHECK(st.message().find("continues incarnation 'other'") != std::string::npos);
  st = PullTo(store, tmp / "fresh", 2);  // by the anchor route: step 1 -> 2 too
  CHECK(st.code() == ErrorCode::kCorruptHeader);
}

TEST_CASE("reader rules: under trust a signed root naming an unsigned group index is refused") {
  TempDir tmp;
  Keys keys(tmp);
  LocalStore s(tmp, "store");
  Store* store = s.store.get();
  TrainerRun run(tmp / "trainer", test::TwoShards(), 0.02, 69);
  test::PublishSteps(store, &run, 1, keys.trainer);
  // Whoever holds the key writes it (here the test): the group index unsigned, its records
  // named without SHA-256, the root signed and naming that group index by its SHA-256.
  SigningKey trainer;
  REQUIRE(SigningKey::Load(keys.trainer, &trainer).ok());
  StepManifest m;
  REQUIRE(ReadRoot(store, 1, &m, nullptr).ok());
  const std::string group_key = GroupIndexKey(1, 2, kDefaultIncarnation, 0);
  GroupIndex gi;
  REQUIRE(ParseGroupIndex(Get(store, group_key), group_key, &gi).ok());
  gi.layout_sha256.clear();
  gi.record_sha256.clear();
  gi.signatures = nullptr;
  const std::string group = GroupIndexJson(gi);
  Put(store, group_key, group);
  m.groups[0].xxh3 = checkpoint::Hash(group.data(), group.size());
  m.groups[0].size = group.size();
  m.groups[0].sha256 = DigestHex(Sha256(group));
  Put(store, RootKey(1), RootJson(m, &trainer));
  PullReport r;
  const Status st = PullTrusting(store, tmp / "region", 1, {keys.trainer + ".pub"}, &r);
  CHECK(st.code() == ErrorCode::kUntrusted);
  INFO(st.message());
  CHECK(!fs::exists(tmp / "region"));
}

TEST_CASE("reader rules: any signature by a trusted key counts; others are ignored") {
  TempDir tmp;
  Keys keys(tmp);
  LocalStore s(tmp, "store");
  Store* store = s.store.get();
  TrainerRun run(tmp / "trainer", test::TwoShards(), 0.02, 70);
  test::PublishSteps(store, &run, 0, keys.trainer);
  const std::string root = Text(Get(store, RootKey(0)));
  Envelope e;
  REQUIRE(ParseEnvelope(root, RootKey(0), &e).ok());
  SigningKey evil;
  REQUIRE(SigningKey::Load(keys.attacker, &evil).ok());
  std::string evil_sig;
  REQUIRE(evil.Sign(Pae(e.type, e.payload), &evil_sig).ok());
  const std::string trainer_id = e.signatures[0].keyid, trainer_sig = Base64(e.signatures[0].sig);
  const auto with = [&](const std::string& signatures) {
    return "{\"payload\": \"" + Base64(e.payload) + "\", \"payloadType\": \"" + e.type +
           "\", \"signatures\": [" + signatures + "]}\n";
  };
  const std::string by_evil =
      "{\"keyid\": \"" + evil.id() + "\", \"sig\": \"" + Base64(evil_sig) + "\"}";
  const std::string by_trainer =
      "{\"keyid\": \"" + trainer_id + "\", \"sig\": \"" + trainer_sig + "\"}";
  const std::string no_keyid = "{\"sig\": \"" + trainer_sig + "\"}";
  const std::string bad =
      "{\"keyid\": \"" + trainer_id + "\", \"sig\": \"" + Base64(evil_sig) + "\"}";
  const std::string pub = keys.trainer + ".pub";
  int n = 0;
  for (const auto& c :
       std::vector<std::pair<std::string, bool>>{{by_evil + ", " + by_trainer, true},
                                                 {bad + ", " + no_keyid, true},
                                                 {no_keyid, true},
                                                 {by_evil, false},
                                                 {bad, false}}) {
    INFO(c.first);
    Put(store, RootKey(0), with(c.first));
    PullReport r;
    const Status st = PullTrusting(store, tmp / ("region-" + std::to_string(n++)), 0, {pub}, &r);
    CHECK(st.ok() == c.second);
    if (!c.second) CHECK(st.code() == ErrorCode::kUntrusted);
  }
}

TEST_CASE("reader rules: a document naming a member twice has no one reading") {
  TempDir tmp;
  LocalStore s(tmp, "store");
  Store* store = s.store.get();
  TrainerRun run(tmp / "trainer", test::TwoShards(), 0.02, 71);
  test::PublishSteps(store, &run, 0, "");
  RewriteRecord(store, 0, 1, [](const std::string& t) {
    return Replace(t, "\"step\": 0,", "\"step\": 0, \"step\": 0,");
  });
  const Status st = PullTo(store, tmp / "region", 0);
  CHECK(st.code() == ErrorCode::kCorruptHeader);
  CHECK(st.message().find("'step' twice") != std::string::npos);
}

}  // namespace
}  // namespace sync
}  // namespace arc_v3
