// Fuzz target: a region's pull from a store whose answers the fuzzer spoils, into a
// directory (sync::Pull, src/sync/sync.h) or into memory (arc_v3::Follower). The store
// holds a real run written by the project's publisher once per process (2 shards, steps 1
// to 4, anchors at 1 and 3; unsigned and signed), kept in memory with the versions each
// object had after every step, and is opened by URL (fault://, RegisterStoreScheme).
// Input: one byte choosing the run, the region's start (empty, at step 1, at step 2), the
// step asked for, `reset` and the reader; then one or two bytes per store call: pass, fail
// (unavailable, or not found), corrupt a byte, truncate, answer with an older version of
// the object (an eventually consistent store, a stale cache) or with the previous call's
// answer (answers reordered or duplicated). Delays are not modelled: a pull has no
// deadline but the store's own timeouts.
// Promises checked: no crash; a pull that succeeds holds a published step byte for byte
// (the one asked for), recorded as the region's step; a directory pull that fails says why
// and leaves the directory exactly as it was; a Follower that fails holds the last step it
// completed, byte for byte, and says which (the step it held, or one of its route's).
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "arc_v3_sync.hpp"
#include "src/checkpoint/safetensors.h"
#include "src/sync/sync.h"
#include "tests/fuzz/fuzz_common.h"

namespace arc_v3 {
namespace fuzz {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kShards = 2;
constexpr uint64_t kSteps = 4;
using Objects = std::map<std::string, std::vector<uint8_t>>;

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  FUZZ_CHECK(out.good(), "cannot write a scratch file");
}

std::string ShardFile(uint32_t shard) {
  return "model-0000" + std::to_string(shard + 1) + "-of-0000" + std::to_string(kShards) +
         ".safetensors";
}

// A shard's file at `step`: three BF16 tensors (one of them 2-D, for the row pieces) and an
// F32 one, of which a few values move every step.
std::vector<uint8_t> ShardBytes(uint32_t shard, uint64_t step) {
  const std::vector<std::pair<std::string, std::vector<uint64_t>>> specs = {
      {"a.weight", {48, 32}}, {"b.weight", {700}}, {"c.bias", {40}}, {"d.scale", {8}}};
  std::vector<safetensors::TensorInfo> infos;
  std::vector<uint8_t> data;
  uint64_t salt = shard * 100003;
  for (const auto& spec : specs) {
    uint64_t n = 1;
    for (uint64_t d : spec.second) n *= d;
    safetensors::TensorInfo info;
    info.name = spec.first;
    info.dtype = spec.first == "d.scale" ? "F32" : "BF16";
    info.shape = spec.second;
    const size_t width = info.dtype == "F32" ? 4 : 2;
    info.end = n * width;
    infos.push_back(info);
    for (uint64_t i = 0; i < n; ++i) {
      uint16_t v = BaseValue(salt + i);
      for (uint64_t s = 2; s <= step; ++s) {
        if ((i * 7 + s * 13 + salt) % 29 == 0) v = static_cast<uint16_t>(v ^ (1 + (s & 3)));
      }
      const uint8_t lo = static_cast<uint8_t>(v), hi = static_cast<uint8_t>(v >> 8);
      if (width == 4)
        data.insert(data.end(), {0, 0, lo, hi});
      else
        data.insert(data.end(), {lo, hi});
    }
    salt += n;
  }
  std::vector<uint8_t> bytes = safetensors::BuildHeader(&infos, {{"format", "pt"}});
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

// The fault script of one execution, shared by every store opened during it. Unarmed, the
// stores answer truly (to bring a Follower to its start).
struct Faults {
  const std::vector<Objects>* versions = nullptr;
  const uint8_t* script = nullptr;
  size_t size = 0, at = 0;
  bool armed = false;
  std::vector<uint8_t> previous;
  std::mutex mutex;

  uint8_t Next() {
    std::lock_guard<std::mutex> lock(mutex);
    return armed && at < size ? script[at++] : 0;
  }
};
Faults current;

// An object store in memory over `current`: the run's objects as they were after step
// 1..kSteps, served through the script, one or two bytes per call.
class FaultStore : public sync::Store {
 public:
  const std::string& url() const override { return url_; }
  bool writable() const override { return false; }
  bool listable() const override { return true; }

  Status Head(const std::string& key, sync::ObjectInfo* info) override {
    std::vector<uint8_t> bytes;
    Status s = Answer(key, &bytes);
    if (!s.ok()) return s;
    *info = {key, bytes.size(), Tag(bytes)};
    return Status::Ok();
  }
  Status GetIfChanged(const std::string& key, const std::string& etag, uint64_t max_size,
                      std::vector<uint8_t>* data, sync::ObjectInfo* info, bool* changed) override {
    std::vector<uint8_t> bytes;
    Status s = Answer(key, &bytes);
    if (!s.ok()) return s;
    *changed = etag.empty() || etag != Tag(bytes);
    if (!*changed) return Status::Ok();
    if (bytes.size() > max_size)
      return Status(ErrorCode::kCorruptHeader, key + ": longer than expected");
    if (info != nullptr) *info = {key, bytes.size(), Tag(bytes)};
    *data = std::move(bytes);
    return Status::Ok();
  }
  Status GetRange(const std::string& key, uint64_t offset, uint64_t size, uint8_t* out) override {
    std::vector<uint8_t> bytes;
    Status s = Answer(key, &bytes);
    if (!s.ok()) return s;
    if (offset > bytes.size() || size > bytes.size() - offset) {
      return Status(ErrorCode::kTruncated,
                    key + ": ends before byte " + std::to_string(offset + size));
    }
    if (size != 0) std::memcpy(out, bytes.data() + offset, size);
    return Status::Ok();
  }
  Status List(const std::string& prefix, std::vector<sync::ObjectInfo>* objects) override {
    objects->clear();
    const uint8_t op = current.Next();
    if (op >= 128 && op < 160) return Status(ErrorCode::kUnavailable, "listing: injected failure");
    // A stale listing: the objects of an older version.
    const std::vector<Objects>& versions = *current.versions;
    const Objects& from = (op >= 224) ? versions[op % versions.size()] : versions.back();
    for (const auto& o : from) {
      if (o.first.compare(0, prefix.size(), prefix) == 0)
        objects->push_back({o.first, o.second.size(), Tag(o.second)});
    }
    return Status::Ok();
  }
  Status Put(const std::string&, const uint8_t*, uint64_t, sync::PutMode) override {
    return ReadOnly();
  }
  Status PutFile(const std::string&, const std::string&, sync::PutMode) override {
    return ReadOnly();
  }
  Status Delete(const std::string&) override { return ReadOnly(); }

 private:
  static std::string Tag(const std::vector<uint8_t>& bytes) {
    return std::to_string(std::hash<std::string>()(std::string(bytes.begin(), bytes.end()))) + "-" +
           std::to_string(bytes.size());
  }
  Status ReadOnly() const {
    return Status(ErrorCode::kInvalidArgument, "the fault store is read-only");
  }

  // The answer to a read of `key`: its latest bytes, spoiled as the next script byte says.
  Status Answer(const std::string& key, std::vector<uint8_t>* bytes) {
    const uint8_t op = current.Next();
    const uint8_t arg = op >= 128 ? current.Next() : 0;
    const std::vector<Objects>& versions = *current.versions;
    const Objects& latest = versions.back();
    auto it = latest.find(key);
    if (op >= 128 && op < 144) return Status(ErrorCode::kUnavailable, key + ": injected failure");
    if (op >= 144 && op < 160) return Status(ErrorCode::kNotFound, key + ": injected not found");
    if (op >= 224 && op < 240) {  // an older version (or none yet)
      const Objects& old = versions[arg % versions.size()];
      it = old.find(key);
      if (it == old.end()) return Status(ErrorCode::kNotFound, key + ": not found (stale)");
    } else if (op >= 240) {  // the previous answer again
      std::lock_guard<std::mutex> lock(current.mutex);
      *bytes = current.previous;
      return Status::Ok();
    } else if (it == latest.end()) {
      return Status(ErrorCode::kNotFound, key + ": not found");
    }
    *bytes = it->second;
    if (op >= 160 && op < 192 && !bytes->empty())
      (*bytes)[(arg * 131u + op) % bytes->size()] ^= 1u << (op & 7);
    if (op >= 192 && op < 224) bytes->resize(bytes->size() * arg / 256);
    std::lock_guard<std::mutex> lock(current.mutex);
    current.previous = *bytes;
    return Status::Ok();
  }

  const std::string url_ = "fault://run";
};

Objects ReadAll(sync::Store* store) {
  std::vector<sync::ObjectInfo> infos;
  FUZZ_CHECK(store->List("", &infos).ok(), "cannot list the run's store");
  Objects objects;
  for (const sync::ObjectInfo& o : infos) {
    FUZZ_CHECK(store->Get(o.key, UINT64_MAX, &objects[o.key], nullptr).ok(),
               "cannot read the run's store");
  }
  return objects;
}

struct Run {
  std::vector<Objects> versions;     // the store after step 1..kSteps
  std::vector<std::string> trust;    // the public key of a signed run
  std::vector<std::string> regions;  // a region at nothing, at step 1, at step 2
};

struct World {
  std::string root;
  std::vector<std::vector<std::vector<uint8_t>>> files;  // [step][shard]
  Run runs[2];                                           // unsigned, signed
};

World* world = nullptr;
void RemoveWorld() {
  std::error_code ec;
  if (world != nullptr) fs::remove_all(world->root, ec);
}

// A copy of a region, its files' times included (a region records them to notice edits).
void CopyDir(const std::string& from, const std::string& to) {
  fs::create_directories(to);
  fs::copy(from, to, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  for (const auto& e : fs::recursive_directory_iterator(from)) {
    if (e.is_regular_file())
      fs::last_write_time(to / fs::relative(e.path(), from), e.last_write_time());
  }
}

// Publishes the run once: the trainer's files, the store after each step, the regions.
World& GetWorld() {
  if (world != nullptr) return *world;
  world = new World;
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/arc_v3_fuzz_faults.XXXXXX";
  if (mkdtemp(&pattern[0]) == nullptr) std::abort();
  world->root = pattern;
  std::atexit(RemoveWorld);
  const std::string& root = world->root;
  world->files.resize(kSteps + 1);
  for (uint64_t step = 1; step <= kSteps; ++step) {
    fs::create_directories(root + "/train/" + std::to_string(step));
    for (uint32_t k = 0; k < kShards; ++k) {
      world->files[step].push_back(ShardBytes(k, step));
      WriteFile(root + "/train/" + std::to_string(step) + "/" + ShardFile(k),
                world->files[step][k]);
    }
  }
  std::string key_id;
  FUZZ_CHECK(sync::GenerateKey(root + "/key", &key_id).ok(), "cannot make a key");
  const Status registered = sync::RegisterStoreScheme(
      "fault",
      [](const std::string&, const sync::StoreOptions&, std::unique_ptr<sync::Store>* store) {
        *store = std::make_unique<FaultStore>();
        return Status::Ok();
      });
  FUZZ_CHECK(registered.ok(), "cannot register fault://");
  for (int r = 0; r < 2; ++r) {
    Run& run = world->runs[r];
    const std::string dir = root + "/store" + std::to_string(r);
    std::unique_ptr<sync::Store> store = sync::NewLocalStore(dir, dir);
    fs::create_directories(dir);
    if (r == 1) run.trust = {root + "/key.pub"};
    run.regions.push_back(root + "/region" + std::to_string(r) + "_empty");
    fs::create_directories(run.regions.back());
    for (uint64_t step = 1; step <= kSteps; ++step) {
      for (uint32_t k = 0; k < kShards; ++k) {
        sync::PublishOptions o;
        o.step = step;
        o.next = root + "/train/" + std::to_string(step) + "/" + ShardFile(k);
        if (step > 1) o.prev = root + "/train/" + std::to_string(step - 1) + "/" + ShardFile(k);
        o.shard = k;
        o.count = kShards;
        o.anchor_every = 3;
        o.no_index = true;
        o.work_dir = root;
        o.checkpoint.threads = 1;
        if (r == 1) o.sign_key = root + "/key";
        sync::PublishReport report;
        const Status s = sync::Publish(store.get(), o, &report);
        FUZZ_CHECK(s.ok(), s.message().c_str());
      }
      run.versions.push_back(ReadAll(store.get()));
      if (step <= 2) {  // a region that holds this step
        const std::string region =
            root + "/region" + std::to_string(r) + "_" + std::to_string(step);
        fs::create_directories(region);
        sync::PullOptions o;
        o.checkpoint.threads = 1;
        o.trusted_keys = run.trust;
        sync::PullReport report;
        const Status s = sync::Pull(store.get(), region, o, &report);
        FUZZ_CHECK(s.ok(), s.message().c_str());
        run.regions.push_back(region);
      }
    }
  }
  return *world;
}

std::map<std::string, std::vector<uint8_t>> Snapshot(const std::string& dir) {
  std::map<std::string, std::vector<uint8_t>> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().filename() != "lock") {
      files[fs::relative(e.path(), dir).string()] = ReadFile(e.path().string());
    }
  }
  return files;
}

// Whether the follower holds `step` of the run, byte for byte, and nothing else.
void CheckFollower(const World& w, const Follower& follower, uint64_t step) {
  const std::vector<FollowedTensor> tensors = follower.tensors();
  if (step == kNoStep) {
    FUZZ_CHECK(tensors.empty(), "a follower that holds no step holds tensors");
    return;
  }
  size_t expected = 0;
  for (uint32_t k = 0; k < kShards; ++k) {
    const std::string path = w.root + "/train/" + std::to_string(step) + "/" + ShardFile(k);
    safetensors::File file;
    FUZZ_CHECK(safetensors::File::Open(path, &file).ok(), "cannot open a step's file");
    for (const safetensors::TensorInfo& t : file.tensors()) {
      ++expected;
      bool found = false;
      for (const FollowedTensor& h : tensors) {
        if (h.shard != k || h.name != t.name) continue;
        found = true;
        FUZZ_CHECK(h.dtype == t.dtype && h.shape == t.shape, "a held tensor of another kind");
        FUZZ_CHECK(std::memcmp(h.data, file.data(t), t.size()) == 0,
                   "a held tensor differs from the step");
      }
      FUZZ_CHECK(found, "a tensor of the step is not held");
    }
  }
  FUZZ_CHECK(tensors.size() == expected, "the follower holds tensors the step has not");
}

void FuzzFollower(const World& w, const Run& run, uint64_t start, uint64_t ask, const uint8_t* data,
                  size_t size) {
  FollowerOptions options;
  options.trusted_keys = run.trust;
  options.threads = 1;
  options.fetch_ahead_bytes =
      (data[0] & 0x80) ? 1 : (uint64_t{64} << 20);  // piece by piece, or all at once
  std::unique_ptr<Follower> follower;
  FUZZ_CHECK(Follower::Open("fault://run", options, &follower).ok(), "cannot open the follower");
  if (start != kNoStep) {
    FollowResult result;
    const Status s = follower->Pull(start, &result);
    FUZZ_CHECK(s.ok(), s.message().c_str());
  }
  current.armed = true;
  current.script = data + 1;
  current.size = size - 1;
  FollowResult result;
  const Status s = follower->Pull(ask, &result);
  current.armed = false;
  if (!s.ok()) {
    FUZZ_CHECK(!s.message().empty(), "an error without a message");
    // As documented: a long route commits step by step, so the follower holds the last
    // step it completed, which on a rerouted anchor route may be older than the one it held.
    const uint64_t held = follower->step();
    FUZZ_CHECK(held == start || (held >= 1 && held <= kSteps),
               "a failed pull left the follower at a step never published");
    CheckFollower(w, *follower, held);
    return;
  }
  FUZZ_CHECK(result.step >= 1 && result.step <= kSteps, "a pull ended at a step never published");
  FUZZ_CHECK(ask == kLatestStep || result.step == ask, "a pull ended at another step");
  FUZZ_CHECK(follower->step() == result.step, "the follower records another step");
  CheckFollower(w, *follower, result.step);
}

void FuzzDirectory(const World& w, const Run& run, const std::string& start, uint64_t ask,
                   bool reset, const uint8_t* data, size_t size) {
  sync::PullOptions options;
  options.step = ask;
  options.reset = reset;
  options.trusted_keys = run.trust;
  options.checkpoint.threads = 1;
  options.store.connections = 1;
  const std::string dir = w.root + "/work";
  std::error_code ec;
  fs::remove_all(dir, ec);
  CopyDir(start, dir);
  const auto before = Snapshot(dir);
  std::unique_ptr<sync::Store> store;
  FUZZ_CHECK(sync::OpenStore("fault://run", options.transfer_options(), &store).ok(),
             "cannot open the store");
  current.armed = true;
  current.script = data + 1;
  current.size = size - 1;
  sync::PullReport report;
  const Status s = sync::Pull(store.get(), dir, options, &report);
  current.armed = false;
  if (!s.ok()) {
    FUZZ_CHECK(!s.message().empty(), "an error without a message");
    const auto after = Snapshot(dir);
    if (after != before) {
      std::fprintf(stderr, "pull failed: %s\n", s.message().c_str());
      for (const auto& f : after) {
        if (before.count(f.first) == 0 || before.at(f.first) != f.second)
          std::fprintf(stderr, "  changed: %s\n", f.first.c_str());
      }
      for (const auto& f : before) {
        if (after.count(f.first) == 0) std::fprintf(stderr, "  removed: %s\n", f.first.c_str());
      }
    }
    FUZZ_CHECK(after == before, "a failed pull changed the region's directory");
    return;
  }
  FUZZ_CHECK(report.to_step >= 1 && report.to_step <= kSteps,
             "a pull ended at a step never published");
  FUZZ_CHECK(ask == kLatestStep || report.to_step == ask, "a pull ended at another step");
  uint64_t held = sync::kNoStep;
  FUZZ_CHECK(sync::DirectoryStep(dir, &held).ok() && held == report.to_step,
             "the directory records another step");
  for (uint32_t k = 0; k < kShards; ++k) {
    FUZZ_CHECK(ReadFile(dir + "/" + ShardFile(k)) == w.files[report.to_step][k],
               "a pulled file differs from the step");
  }
}

}  // namespace

// The first byte: bit 0 the run (signed), bits 1-2 the start (empty, step 1, step 2),
// bits 3-4 the step asked for (latest, 2, 3, 4), bit 5 `reset` (directory) or bit 7
// fetching piece by piece (Follower), bit 6 the reader (directory, Follower).
int FuzzStoreFaults(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  World& w = GetWorld();
  const uint8_t choice = data[0];
  const Run& run = w.runs[choice & 1];
  const size_t start = ((choice >> 1) & 3) % run.regions.size();
  static const uint64_t kAsk[] = {kLatestStep, 2, 3, 4};
  const uint64_t ask = kAsk[(choice >> 3) & 3];
  current.versions = &run.versions;
  current.at = 0;
  current.armed = false;
  current.previous.clear();
  if (choice & 0x40) {
    FuzzFollower(w, run, start == 0 ? kNoStep : start, ask, data, size);
  } else {
    FuzzDirectory(w, run, run.regions[start], ask, (choice & 0x20) != 0, data, size);
  }
  return 0;
}

ARC_V3_FUZZ_ENTRY(FuzzStoreFaults)

}  // namespace fuzz
}  // namespace arc_v3
