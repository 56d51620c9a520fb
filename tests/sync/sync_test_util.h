// What the sync tests share: the stores every test runs against (a directory, and the
// radosgw that tests/run_tests.sh boots), temporary directories, and a trainer's run of
// sharded safetensors checkpoints.
#ifndef ARC_V3_TESTS_SYNC_SYNC_TEST_UTIL_H_
#define ARC_V3_TESTS_SYNC_SYNC_TEST_UTIL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include "src/checkpoint/safetensors.h"
#include "src/sync/store.h"
#include "src/sync/sync.h"

namespace arc_v3 {
namespace sync {
namespace test {

namespace fs = std::filesystem;

// A TCP socket listening on 127.0.0.1 at a free port (for servers a test plays itself).
inline int ListenOnLoopback(int backlog, int* port) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(listen(listener, backlog) == 0);
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return listener;
}

inline std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// A fresh directory, removed with its contents.
class TempDir {
 public:
  TempDir() {
    const std::string base = Env("TEST_TMPDIR").empty() ? "/tmp" : Env("TEST_TMPDIR");
    std::string pattern = base + "/arc_v3_sync_XXXXXX";
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A store to run a test against, with what the test may do to it behind the library's
// back (through a second handle: the directory, or the same bucket).
struct Backend {
  std::string name;  // "local" or "s3"
  std::string url;
  std::unique_ptr<Store> store;
  std::string directory;  // the local store's root
};

inline std::string UniqueName(const std::string& what) {
  static std::atomic<int> counter{0};
  std::random_device rd;
  return what + "-" + std::to_string(getpid()) + "-" + std::to_string(rd() % 1000000) + "-" +
         std::to_string(counter++);
}

// The radosgw bucket URL the test environment names, or "" (the S3 half of a test is then
// skipped, loudly, unless ARC_V3_REQUIRE_S3=1 makes it a failure).
inline std::string S3Bucket() {
  const std::string bucket = Env("ARC_V3_TEST_S3");
  if (bucket.empty()) {
    if (Env("ARC_V3_REQUIRE_S3") == "1") FAIL("ARC_V3_REQUIRE_S3=1 but ARC_V3_TEST_S3 is unset");
    static bool warned = false;
    if (!warned)
      MESSAGE(
          "SKIP: no S3 server (ARC_V3_TEST_S3 unset): the radosgw half of the sync tests did not "
          "run");
    warned = true;
  }
  return bucket;
}

inline StoreOptions FastRetries() {
  StoreOptions o;
  o.attempts = 3;
  o.backoff_s = 0.05;
  o.max_backoff_s = 0.2;
  o.connect_timeout_s = 5;
  o.part_bytes = uint64_t{5} << 20;  // S3's smallest multipart part
  return o;
}

// A local store under `tmp`, and the S3 store (a fresh prefix) when there is one.
inline std::vector<Backend> Backends(const TempDir& tmp, const std::string& test) {
  std::vector<Backend> out;
  Backend dir;
  dir.name = "local";
  dir.directory = tmp / UniqueName(test);
  fs::create_directories(dir.directory);
  dir.url = dir.directory;
  REQUIRE(OpenStore(dir.url, FastRetries(), &dir.store).ok());
  out.push_back(std::move(dir));
  const std::string bucket = S3Bucket();
  if (!bucket.empty()) {
    Backend s3;
    s3.name = "s3";
    s3.url = bucket + "/" + UniqueName(test);
    REQUIRE(OpenStore(s3.url, FastRetries(), &s3.store).ok());
    out.push_back(std::move(s3));
  }
  return out;
}

inline std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

inline void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> shape;
};

// A trainer's run: `shards` safetensors files per step, BF16 weights ~ N(0, 0.02) of
// which about `density` move by one to three units in the last place each step (sign and
// exponent untouched, as most optimizer updates), deterministic in the seed.
class TrainerRun {
 public:
  TrainerRun(const std::string& dir, std::vector<std::vector<TensorSpec>> shards, double density,
             uint32_t seed)
      : dir_(dir), shards_(std::move(shards)), density_(density), rng_(seed) {
    for (const auto& tensors : shards_) {
      std::vector<std::vector<uint16_t>> values;
      for (const TensorSpec& t : tensors) {
        uint64_t n = 1;
        for (uint64_t d : t.shape) n *= d;
        std::normal_distribution<float> normal(0.0f, 0.02f);
        std::vector<uint16_t> w(n);
        for (auto& x : w) {
          const float f = normal(rng_);
          uint32_t bits;
          std::memcpy(&bits, &f, 4);
          x = static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
        }
        values.push_back(std::move(w));
      }
      weights_.push_back(std::move(values));
    }
  }

  static std::string FileName(size_t shard, size_t count) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", shard + 1, count);
    return name;
  }
  // The file of `shard` at `step` (written by Advance / Write).
  std::string Path(uint64_t step, size_t shard) const {
    return dir_ + "/step_" + std::to_string(step) + "/" + FileName(shard, shards_.size());
  }
  size_t shards() const { return shards_.size(); }

  // Writes the current weights as `step`.
  void Write(uint64_t step) {
    fs::create_directories(dir_ + "/step_" + std::to_string(step));
    for (size_t k = 0; k < shards_.size(); ++k) {
      std::vector<safetensors::TensorInfo> infos;
      for (const TensorSpec& t : shards_[k]) {
        safetensors::TensorInfo info;
        info.name = t.name;
        info.dtype = "BF16";
        info.shape = t.shape;
        info.end = weights_[k][infos.size()].size() * 2;
        infos.push_back(info);
      }
      std::vector<uint8_t> bytes = safetensors::BuildHeader(&infos, {{"format", "pt"}});
      for (const auto& w : weights_[k]) {
        const uint8_t* p = reinterpret_cast<const uint8_t*>(w.data());
        bytes.insert(bytes.end(), p, p + w.size() * 2);
      }
      WriteBytes(Path(step, k), bytes);
    }
  }

  // One optimizer step.
  void Advance() {
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (auto& shard : weights_) {
      for (auto& w : shard) {
        std::geometric_distribution<uint64_t> gap(density_);
        for (uint64_t i = gap(rng_); i < w.size(); i += 1 + gap(rng_)) {
          const uint16_t x = w[i];
          const int step = 1 + static_cast<int>(rng_() % 3);
          const int mantissa = (x & 0x7F) + (uniform(rng_) < 0.5 ? step : -step);
          if (mantissa < 0 || mantissa > 0x7F) continue;  // would cross an exponent
          w[i] = static_cast<uint16_t>((x & 0xFF80) | mantissa);
        }
      }
    }
  }

 private:
  std::string dir_;
  std::vector<std::vector<TensorSpec>> shards_;
  double density_;
  std::mt19937_64 rng_;
  std::vector<std::vector<std::vector<uint16_t>>> weights_;  // [shard][tensor]
};

// Every file under `dir` (the directory's state included), for "left exactly as it was".
inline std::map<std::string, std::vector<uint8_t>> Snapshot(const std::string& dir) {
  std::map<std::string, std::vector<uint8_t>> files;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); ++it) {
    if (it->is_regular_file() && it->path().filename() != "lock") {
      files[fs::relative(it->path(), dir).string()] = ReadBytes(it->path().string());
    }
  }
  return files;
}

// Whether `dir` holds `step` of the run, byte for byte, and nothing else but its state.
inline void CheckHolds(const std::string& dir, const TrainerRun& run, uint64_t step) {
  for (size_t k = 0; k < run.shards(); ++k) {
    INFO(dir, " shard ", k, " of step ", step);
    CHECK(ReadBytes(dir + "/" + TrainerRun::FileName(k, run.shards())) ==
          ReadBytes(run.Path(step, k)));
  }
  uint64_t held = kNoStep;
  REQUIRE(DirectoryStep(dir, &held).ok());
  CHECK(held == step);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  CHECK(files == run.shards());
}

}  // namespace test
}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_TESTS_SYNC_SYNC_TEST_UTIL_H_
