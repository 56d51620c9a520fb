// Tests of the checkpoint delta container and of diff / apply / verify on checkpoints
// generated on the fly in a temporary directory.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <zstd.h>

#include "src/checkpoint/checkpoint_delta.h"
#include "src/checkpoint/container.h"
#include "src/checkpoint/safetensors.h"

namespace arc_v3 {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;

#define REQUIRE_OK(expr)           \
  do {                             \
    const Status status_ = (expr); \
    INFO(status_.ToString());      \
    REQUIRE(status_.ok());         \
  } while (0)

struct TempDir {
  TempDir() {
    char name[] = "/tmp/arc_v3_cli_test_XXXXXX";
    path = mkdtemp(name);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (fs::path(path) / name).string(); }
  std::string path;
};

struct Tensor {
  std::string name, dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};

uint64_t Elements(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

Tensor Random(const std::string& name, const std::string& dtype, std::vector<uint64_t> shape,
              std::mt19937_64* rng) {
  Tensor t{name, dtype, shape, {}};
  t.bytes.resize(Elements(shape) * safetensors::DTypeSize(dtype));
  for (auto& b : t.bytes) b = static_cast<uint8_t>((*rng)());
  if (dtype == "BOOL") {
    for (auto& b : t.bytes) b &= 1;
  }
  return t;
}

// A training-step-like change: about `density` of the elements get their low byte bumped.
Tensor Step(const Tensor& t, double density, std::mt19937_64* rng) {
  Tensor next = t;
  const size_t es = safetensors::DTypeSize(t.dtype);
  std::bernoulli_distribution change(density);
  for (size_t i = 0; i < next.bytes.size(); i += es) {
    if (!change(*rng)) continue;
    if (t.dtype == "BOOL") {
      next.bytes[i] ^= 1;
    } else {
      next.bytes[i] ^= static_cast<uint8_t>(1 + (*rng)() % 3);
      if ((*rng)() % 64 == 0) next.bytes[i + es - 1] ^= 0x80;  // a sign flip now and then
    }
  }
  return next;
}

void WriteSafetensors(const std::string& path, const std::vector<Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {}) {
  std::vector<safetensors::TensorInfo> infos;
  for (const Tensor& t : tensors) {
    safetensors::TensorInfo info;
    info.name = t.name;
    info.dtype = t.dtype;
    info.shape = t.shape;
    info.end = t.bytes.size();
    infos.push_back(info);
  }
  const std::vector<uint8_t> header = safetensors::BuildHeader(&infos, metadata);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), header.size());
  for (const Tensor& t : tensors)
    out.write(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
}

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}
void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// Every regular file of a directory, by name.
std::map<std::string, std::vector<uint8_t>> Snapshot(const std::string& dir) {
  std::map<std::string, std::vector<uint8_t>> files;
  for (const auto& e : fs::directory_iterator(dir))
    files[e.path().filename().string()] = ReadFile(e.path().string());
  return files;
}

RunOptions Threads(int n) {
  RunOptions o;
  o.threads = n;
  return o;
}

// Writes dir/wrong.safetensors: dir/prev.safetensors with bit `mask` of byte `byte` of
// `tensor`'s data flipped.
void WriteWrongBase(const TempDir& dir, const std::string& tensor, uint64_t byte, uint8_t mask) {
  safetensors::File prev;
  REQUIRE_OK(safetensors::File::Open(dir / "prev.safetensors", &prev));
  std::vector<uint8_t> wrong = ReadFile(dir / "prev.safetensors");
  const uint64_t data_start = prev.file_size() - prev.tensors().back().end;
  wrong[data_start + prev.Find(tensor)->begin + byte] ^= mask;
  WriteFile(dir / "wrong.safetensors", wrong);
}

// Apply (to dir/OUT) and verify of dir/d.a3d both refuse dir/wrong.safetensors with a
// checksum mismatch that names `tensor`, and nothing is written.
void CheckWrongBaseRefused(const TempDir& dir, const std::string& tensor, const std::string& out) {
  Status s = Apply(dir / "wrong.safetensors", dir / "d.a3d", dir / out, Threads(2), nullptr);
  CHECK(s.code() == ErrorCode::kChecksumMismatch);
  CHECK(s.message().find(tensor) != std::string::npos);
  CHECK(!fs::exists(dir / out));
  s = Verify(dir / "wrong.safetensors", dir / "d.a3d", Threads(2), nullptr);
  CHECK(s.code() == ErrorCode::kChecksumMismatch);
  CHECK(s.message().find(tensor) != std::string::npos);
}

// The partial checkpoint at `path` holds `count` tensors, each exactly rows
// [first, last) (clamped to its rows) of the same tensor of `next`.
void CheckRowSlices(const std::string& path, const safetensors::File& next, uint64_t first,
                    uint64_t last, size_t count) {
  safetensors::File part;
  REQUIRE_OK(safetensors::File::Open(path, &part));
  CHECK(part.tensors().size() == count);
  for (const safetensors::TensorInfo& t : part.tensors()) {
    CAPTURE(t.name);
    const safetensors::TensorInfo* full = next.Find(t.name);
    REQUIRE(full != nullptr);
    const uint64_t rows = full->shape[0];
    const uint64_t begin = std::min(first, rows), end = std::min(last, rows);
    const uint64_t row_bytes = full->size() / rows;
    CHECK(t.shape[0] == end - begin);
    REQUIRE(t.size() == (end - begin) * row_bytes);
    CHECK(std::memcmp(part.data(t), next.data(*full) + begin * row_bytes, t.size()) == 0);
  }
}

// A pair of single-file checkpoints with every dtype, a multi-piece BF16 tensor, an added,
// a removed, a reshaped and a retyped tensor, a scalar and an empty tensor.
void MakeMixedPair(const std::string& prev, const std::string& next, std::mt19937_64* rng) {
  std::vector<Tensor> a, b;
  const std::vector<std::pair<std::string, std::vector<uint64_t>>> kinds = {
      {"BF16", {2500, 2000}}, {"F32", {300, 70}}, {"F16", {1000}}, {"F8_E4M3", {64, 3}},
      {"F8_E5M2", {50}},      {"I64", {33}},      {"I32", {7, 7}}, {"U8", {99}},
      {"BOOL", {40}},         {"F64", {5}},       {"I8", {12}},    {"BF16", {}}};
  for (size_t i = 0; i < kinds.size(); ++i) {
    a.push_back(Random("t" + std::to_string(i) + "." + kinds[i].first, kinds[i].first,
                       kinds[i].second, rng));
    b.push_back(Step(a.back(), 0.01, rng));
  }
  a.push_back(Random("empty", "F32", {0, 4}, rng));
  b.push_back(a.back());
  a.push_back(Random("removed", "F32", {10}, rng));
  b.push_back(Random("added", "BF16", {20, 3}, rng));
  a.push_back(Random("reshaped", "BF16", {6, 4}, rng));
  b.push_back(Random("reshaped", "BF16", {4, 6}, rng));
  a.push_back(Random("retyped", "F32", {8}, rng));
  b.push_back(Random("retyped", "F16", {8}, rng));
  WriteSafetensors(prev, a, {{"format", "pt"}});
  WriteSafetensors(next, b, {{"format", "pt"}, {"step", "2"}});
}

TEST_CASE("single file, every dtype: diff then apply reproduces NEXT byte for byte") {
  TempDir dir;
  std::mt19937_64 rng(1);
  MakeMixedPair(dir / "prev.safetensors", dir / "next.safetensors", &rng);
  for (int threads : {1, 2, 4}) {
    CAPTURE(threads);
    RunReport report;
    REQUIRE_OK(Diff(dir / "prev.safetensors", dir / "next.safetensors", dir / "d.a3d",
                    Threads(threads), &report));
    REQUIRE_OK(Apply(dir / "prev.safetensors", dir / "d.a3d", dir / "out.safetensors",
                     Threads(threads), &report));
    CHECK(ReadFile(dir / "out.safetensors") == ReadFile(dir / "next.safetensors"));
  }
  // The delta bytes do not depend on the thread count.
  REQUIRE_OK(Diff(dir / "prev.safetensors", dir / "next.safetensors", dir / "d1.a3d", Threads(1),
                  nullptr));
  const std::vector<uint8_t> one = ReadFile(dir / "d1.a3d");
  REQUIRE_OK(Diff(dir / "prev.safetensors", dir / "next.safetensors", dir / "d3.a3d", Threads(3),
                  nullptr));
  CHECK(one == ReadFile(dir / "d3.a3d"));

  std::unique_ptr<MappedFile> file;
  REQUIRE_OK(MappedFile::Open(dir / "d.a3d", &file));
  Reader reader;
  REQUIRE_OK(Reader::Open(std::move(file), &reader));
  const Manifest& m = reader.manifest();
  REQUIRE(m.files.size() == 1);
  std::map<std::string, const TensorEntry*> by_name;
  for (const TensorEntry& t : m.files[0].tensors) by_name[t.name] = &t;
  CHECK(by_name.at("added")->kind == TensorKind::kAdded);
  CHECK(by_name.at("reshaped")->kind == TensorKind::kReshaped);
  CHECK(by_name.at("retyped")->kind == TensorKind::kReshaped);
  CHECK(by_name.at("t1.F32")->kind == TensorKind::kDelta);
  CHECK(m.removed_tensors == std::vector<std::string>{"removed"});
  // 5M BF16 elements: several row-block pieces, each an arc_v3 payload.
  const TensorEntry& big = *by_name.at("t0.BF16");
  CHECK(big.pieces.size() >= 3);
  for (const Piece& p : big.pieces) CHECK(p.coder == Coder::kArcV3);
  CHECK(by_name.at("t1.F32")->pieces[0].coder != Coder::kArcV3);
  CHECK(by_name.at("empty")->pieces.empty());
  // In-place apply of a single file.
  fs::copy_file(dir / "prev.safetensors", dir / "inplace.safetensors");
  REQUIRE_OK(Apply(dir / "inplace.safetensors", dir / "d.a3d", dir / "inplace.safetensors",
                   Threads(2), nullptr));
  CHECK(ReadFile(dir / "inplace.safetensors") == ReadFile(dir / "next.safetensors"));
}

// Sharded checkpoints: tensors move between shards, a shard disappears, the index changes.
void MakeShardedPair(const std::string& prev, const std::string& next, std::mt19937_64* rng) {
  fs::create_directories(prev);
  fs::create_directories(next);
  std::vector<Tensor> t;
  for (int i = 0; i < 6; ++i)
    t.push_back(Random("layer." + std::to_string(i), "BF16", {300, 256}, rng));
  t.push_back(Random("norm", "F32", {256}, rng));
  std::vector<Tensor> u;
  for (const Tensor& x : t) u.push_back(Step(x, 0.02, rng));
  WriteSafetensors(prev + "/model-00001-of-00003.safetensors", {t[0], t[1], t[6]});
  WriteSafetensors(prev + "/model-00002-of-00003.safetensors", {t[2], t[3]});
  WriteSafetensors(prev + "/model-00003-of-00003.safetensors", {t[4], t[5]});
  const auto map = [&](const std::string& dir,
                       const std::vector<std::pair<std::string, std::string>>& entries) {
    std::string s = R"({"metadata": {"total_size": 1}, "weight_map": {)";
    for (size_t i = 0; i < entries.size(); ++i) {
      s += (i ? ", " : "") + ("\"" + entries[i].first + "\": \"" + entries[i].second + "\"");
    }
    s += "}}\n";
    WriteFile(dir + "/model.safetensors.index.json", std::vector<uint8_t>(s.begin(), s.end()));
  };
  map(prev, {{"layer.0", "model-00001-of-00003.safetensors"},
             {"layer.1", "model-00001-of-00003.safetensors"},
             {"norm", "model-00001-of-00003.safetensors"},
             {"layer.2", "model-00002-of-00003.safetensors"},
             {"layer.3", "model-00002-of-00003.safetensors"},
             {"layer.4", "model-00003-of-00003.safetensors"},
             {"layer.5", "model-00003-of-00003.safetensors"}});
  WriteSafetensors(next + "/model-00001-of-00002.safetensors", {u[0], u[1], u[2], u[6]});
  WriteSafetensors(next + "/model-00002-of-00002.safetensors", {u[3], u[4], u[5]});
  map(next, {{"layer.0", "model-00001-of-00002.safetensors"},
             {"layer.1", "model-00001-of-00002.safetensors"},
             {"layer.2", "model-00001-of-00002.safetensors"},
             {"norm", "model-00001-of-00002.safetensors"},
             {"layer.3", "model-00002-of-00002.safetensors"},
             {"layer.4", "model-00002-of-00002.safetensors"},
             {"layer.5", "model-00002-of-00002.safetensors"}});
}

TEST_CASE("BF16 pieces are arc_v3 payloads in the requested format; both decode") {
  std::mt19937_64 rng(11);
  const Tensor base = Random("w", "BF16", {4096}, &rng);
  const Tensor target = Step(base, 0.05, &rng);
  for (const Format format : {Format::kDefault, Format::kPublished}) {
    Piece piece;
    std::vector<uint8_t> stored;
    REQUIRE_OK(EncodePiece(base.bytes.data(), target.bytes.data(), base.bytes.size(), 2, true, 1,
                           &piece, &stored, format));
    CHECK(piece.coder == Coder::kArcV3);
    PayloadInfo info;
    REQUIRE_OK(delta_inspect(stored.data(), stored.size(), &info));
    // Format::kPublished is ARCv3 as published: payload format version 1 (src/codec/FORMAT.md).
    CHECK((info.format_version == 1) == (format == Format::kPublished));
    std::vector<uint8_t> out(base.bytes.size());
    REQUIRE_OK(DecodePiece(piece, stored.data(), base.bytes.data(), out.size(), 2, out.data()));
    CHECK(out == target.bytes);
  }
}

TEST_CASE("sharded directories: apply to a new directory and in place") {
  TempDir dir;
  std::mt19937_64 rng(2);
  MakeShardedPair(dir / "prev", dir / "next", &rng);
  REQUIRE_OK(Diff(dir / "prev", dir / "next", dir / "d.a3d", Threads(2), nullptr));
  REQUIRE_OK(Apply(dir / "prev", dir / "d.a3d", dir / "out", Threads(2), nullptr));
  CHECK(Snapshot(dir / "out") == Snapshot(dir / "next"));

  fs::copy(dir / "prev", dir / "inplace");
  REQUIRE_OK(Apply(dir / "inplace", dir / "d.a3d", dir / "inplace", Threads(2), nullptr));
  CHECK(Snapshot(dir / "inplace") == Snapshot(dir / "next"));  // the old third shard is gone

  // A directory delta needs a directory base, and the reverse.
  const Status s = Apply(dir / "prev/model-00001-of-00003.safetensors", dir / "d.a3d", dir / "x",
                         Threads(1), nullptr);
  CHECK(s.code() == ErrorCode::kInvalidArgument);
  CHECK(Verify(dir / "prev", dir / "d.a3d", Threads(2), nullptr).ok());
}

// Counts the bytes a receiver would fetch with range requests.
class CountingSource : public ByteSource {
 public:
  explicit CountingSource(std::unique_ptr<MappedFile> file) : file_(std::move(file)) {}
  uint64_t size() const override { return file_->size(); }
  Status Read(uint64_t offset, uint64_t size, std::vector<uint8_t>* scratch,
              const uint8_t** data) const override {
    read_ += size;
    return file_->Read(offset, size, scratch, data);
  }
  mutable std::atomic<uint64_t> read_{0};

 private:
  std::unique_ptr<MappedFile> file_;
};

// A delta file opened through a CountingSource (owned by the reader).
struct CountedDelta {
  explicit CountedDelta(const std::string& path) {
    std::unique_ptr<MappedFile> file;
    REQUIRE_OK(MappedFile::Open(path, &file));
    counting = new CountingSource(std::move(file));
    REQUIRE_OK(Reader::Open(std::unique_ptr<ByteSource>(counting), &reader));
  }
  const TensorEntry& Find(const std::string& name) const {
    for (const TensorEntry& t : reader.manifest().files[0].tensors) {
      if (t.name == name) return t;
    }
    FAIL("no tensor " << name);
    return reader.manifest().files[0].tensors[0];
  }
  Reader reader;
  CountingSource* counting = nullptr;
};

TEST_CASE("partial apply equals the slice of a full apply and reads only what it needs") {
  TempDir dir;
  std::mt19937_64 rng(3);
  MakeMixedPair(dir / "prev.safetensors", dir / "next.safetensors", &rng);
  REQUIRE_OK(
      Diff(dir / "prev.safetensors", dir / "next.safetensors", dir / "d.a3d", Threads(2), nullptr));
  safetensors::File next;
  REQUIRE_OK(safetensors::File::Open(dir / "next.safetensors", &next));

  // Library call: rows of the multi-piece BF16 tensor, straddling a piece boundary.
  Checkpoint base;
  REQUIRE_OK(Checkpoint::Open(dir / "prev.safetensors", &base));
  const CountedDelta delta(dir / "d.a3d");
  const TensorEntry& big = delta.Find("t0.BF16");
  const uint64_t boundary = big.pieces[1].row_begin;
  const uint64_t rb = boundary - 5, re = boundary + 7;
  const uint64_t after_open = delta.counting->read_;
  std::vector<uint8_t> rows((re - rb) * big.row_bytes());
  REQUIRE_OK(ApplyRows(base, delta.reader, big, rb, re, rows.data(), 2));
  const safetensors::TensorInfo* info = next.Find("t0.BF16");
  CHECK(std::memcmp(rows.data(), next.data(*info) + rb * big.row_bytes(), rows.size()) == 0);
  // Exactly the two overlapping pieces were fetched.
  CHECK(delta.counting->read_ - after_open == big.pieces[0].size + big.pieces[1].size);

  // The CLI's form: a regex and a row range into a new safetensors file.
  RunReport report;
  REQUIRE_OK(ApplyPartial(dir / "prev.safetensors", dir / "d.a3d", "t[0-3]\\..*|added", 10, 40,
                          dir / "part.safetensors", Threads(2), &report));
  CheckRowSlices(dir / "part.safetensors", next, 10, 40, 5);
  CHECK(ApplyPartial(dir / "prev.safetensors", dir / "d.a3d", "nothing", 0, 5,
                     dir / "p2.safetensors", Threads(1), nullptr)
            .code() == ErrorCode::kInvalidArgument);
  CHECK(ApplyPartial(dir / "prev.safetensors", dir / "d.a3d", "([", 0, 5, dir / "p2.safetensors",
                     Threads(1), nullptr)
            .code() == ErrorCode::kInvalidArgument);
  CHECK(!fs::exists(dir / "p2.safetensors"));
}

TEST_CASE("a wrong or incomplete base is refused, naming the tensor, and nothing is written") {
  TempDir dir;
  std::mt19937_64 rng(4);
  MakeMixedPair(dir / "prev.safetensors", dir / "next.safetensors", &rng);
  REQUIRE_OK(
      Diff(dir / "prev.safetensors", dir / "next.safetensors", dir / "d.a3d", Threads(2), nullptr));
  // One bit of one element of one tensor.
  WriteWrongBase(dir, "t1.F32", 17, 0x04);
  CheckWrongBaseRefused(dir, "t1.F32", "out.safetensors");
  // The target itself is not a base either.
  CHECK(Verify(dir / "next.safetensors", dir / "d.a3d", Threads(2), nullptr).code() ==
        ErrorCode::kChecksumMismatch);

  // A base lacking a tensor.
  std::vector<Tensor> few = {Random("t1.F32", "F32", {300, 70}, &rng)};
  WriteSafetensors(dir / "few.safetensors", few);
  Status s =
      Apply(dir / "few.safetensors", dir / "d.a3d", dir / "out.safetensors", Threads(2), nullptr);
  CHECK(s.code() == ErrorCode::kChecksumMismatch);
  CHECK(s.message().find("missing") != std::string::npos);
  // A base with the tensor in another shape.
  std::vector<Tensor> shaped = {Random("t0.BF16", "BF16", {2000, 2500}, &rng)};
  WriteSafetensors(dir / "shaped.safetensors", shaped);
  s = Apply(dir / "shaped.safetensors", dir / "d.a3d", dir / "out.safetensors", Threads(2),
            nullptr);
  CHECK(s.code() == ErrorCode::kChecksumMismatch);
  CHECK(s.message().find("t0.BF16") != std::string::npos);
  CHECK(!fs::exists(dir / "out.safetensors"));
  // Missing or malformed inputs.
  CHECK(Apply(dir / "absent", dir / "d.a3d", dir / "out.safetensors", Threads(1), nullptr).code() ==
        ErrorCode::kInvalidArgument);
  CHECK(Apply(dir / "prev.safetensors", dir / "absent.a3d", dir / "out.safetensors", Threads(1),
              nullptr)
            .code() == ErrorCode::kIoError);
  CHECK(Apply(dir / "prev.safetensors", dir / "prev.safetensors", dir / "out.safetensors",
              Threads(1), nullptr)
            .code() == ErrorCode::kBadMagic);
}

TEST_CASE("corrupt and truncated deltas always give a clean error and write nothing") {
  TempDir dir;
  std::mt19937_64 rng(5);
  std::vector<Tensor> a = {Random("w", "BF16", {64, 48}, &rng), Random("b", "F32", {48}, &rng),
                           Random("mask", "BOOL", {17}, &rng)};
  std::vector<Tensor> b;
  for (const Tensor& t : a) b.push_back(Step(t, 0.05, &rng));
  b.push_back(Random("new", "I32", {9}, &rng));
  WriteSafetensors(dir / "prev.safetensors", a);
  WriteSafetensors(dir / "next.safetensors", b);
  REQUIRE_OK(
      Diff(dir / "prev.safetensors", dir / "next.safetensors", dir / "d.a3d", Threads(1), nullptr));
  const std::vector<uint8_t> good = ReadFile(dir / "d.a3d");
  REQUIRE(good.size() > kHeaderSize);
  const std::string bad = dir / "bad.a3d", out = dir / "out.safetensors";

  // Every byte is covered by a checksum: a flip anywhere is an error.
  size_t flips = 0;
  for (size_t at = 0; at < good.size(); at += (at < 2048 ? 1 : 3)) {
    std::vector<uint8_t> corrupt = good;
    corrupt[at] ^= static_cast<uint8_t>(1u << (at % 8));
    WriteFile(bad, corrupt);
    const Status s = Apply(dir / "prev.safetensors", bad, out, Threads(1), nullptr);
    CAPTURE(at);
    REQUIRE(!s.ok());
    CHECK(s.code() != ErrorCode::kInternal);
    CHECK(!fs::exists(out));
    ++flips;
  }
  CHECK(flips > 500);
  for (size_t len = 0; len < good.size(); len += (len < 200 ? 1 : 37)) {
    WriteFile(bad, std::vector<uint8_t>(good.begin(), good.begin() + len));
    const Status s = Apply(dir / "prev.safetensors", bad, out, Threads(1), nullptr);
    CAPTURE(len);
    REQUIRE(!s.ok());
    CHECK(!fs::exists(out));
  }
  // Trailing garbage is not silently accepted either.
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  WriteFile(bad, longer);
  CHECK(Apply(dir / "prev.safetensors", bad, out, Threads(1), nullptr).code() ==
        ErrorCode::kCorruptHeader);
  // A manifest that is valid JSON with a valid checksum but an inconsistent field.
  std::unique_ptr<MappedFile> file;
  REQUIRE_OK(MappedFile::Open(dir / "d.a3d", &file));
  Reader reader;
  REQUIRE_OK(Reader::Open(std::move(file), &reader));
  Manifest m = reader.manifest();
  const uint64_t data_size = good.size() - reader.data_start();
  REQUIRE(!m.files[0].tensors[1].grouped());
  m.files[0].tensors[1].pieces[0].row_end += 1;  // rows no longer match the shape
  std::vector<uint8_t> head = SerializeHeaderAndManifest(m, data_size);
  head.insert(head.end(), good.begin() + reader.data_start(), good.end());
  WriteFile(bad, head);
  Status s = Apply(dir / "prev.safetensors", bad, out, Threads(1), nullptr);
  CHECK(s.code() == ErrorCode::kCorruptHeader);
  // A removed file outside the checkpoint directory, or one the delta writes, is refused:
  // an in-place apply deletes removed files.
  for (const std::string& name : {std::string("../victim"), m.files[0].name}) {
    Manifest evil = reader.manifest();
    evil.directory = true;
    evil.removed_files = {name};
    head = SerializeHeaderAndManifest(evil, data_size);
    head.insert(head.end(), good.begin() + reader.data_start(), good.end());
    WriteFile(bad, head);
    std::unique_ptr<MappedFile> evil_file;
    REQUIRE_OK(MappedFile::Open(bad, &evil_file));
    Reader evil_reader;
    s = Reader::Open(std::move(evil_file), &evil_reader);
    CHECK(s.code() == ErrorCode::kCorruptHeader);
    CHECK(s.message().find(name) != std::string::npos);
  }
  // Reserved flags.
  std::vector<uint8_t> flagged = good;
  flagged[6] = 1;
  const uint64_t h = Hash(flagged.data(), 32);
  for (int i = 0; i < 8; ++i) flagged[32 + i] = static_cast<uint8_t>(h >> (8 * i));
  WriteFile(bad, flagged);
  CHECK(Apply(dir / "prev.safetensors", bad, out, Threads(1), nullptr).code() ==
        ErrorCode::kReservedBitsSet);
  CHECK(!fs::exists(out));
}

// Many small BF16 tensors (norms, biases, small layers), one tensor too big to group, one
// small tensor with too many changes to group (delta_worth_grouping), a U8 tensor that
// leaves the next BF16 tensors at odd offsets, and an F32 tensor.
void MakeSmallTensorPair(const std::string& prev, const std::string& next, std::mt19937_64* rng) {
  std::vector<Tensor> a, b;
  for (int i = 0; i < 30; ++i) {
    a.push_back(
        Random("norm." + std::to_string(i), "BF16", {static_cast<uint64_t>(64 + 8 * i)}, rng));
    if (i == 10) a.push_back(Random("flags", "U8", {7}, rng));
    if (i == 20) a.push_back(Random("scale", "F32", {16}, rng));
  }
  a.push_back(Random("proj", "BF16", {96, 40}, rng));
  a.push_back(Random("dense", "BF16", {250, 100}, rng));  // ~22,500 changes: a piece of its own
  a.push_back(Random("big", "BF16", {1024, 1024}, rng));  // 2^20 elements: pieces of its own
  // Three tensors just under the limit (with ~5,000 changes each, under
  // kGroupMaxChanges): 3 x 1M elements need two groups of at most 2^21.
  for (int i = 0; i < 3; ++i)
    a.push_back(Random("mid." + std::to_string(i), "BF16", {1000, 1000}, rng));
  for (const Tensor& t : a) {
    const double density = t.name == "dense" ? 0.9 : t.name.rfind("mid.", 0) == 0 ? 0.005 : 0.01;
    b.push_back(Step(t, density, rng));
  }
  WriteSafetensors(prev, a);
  WriteSafetensors(next, b);
}

Manifest ReadManifest(const std::string& path) {
  std::unique_ptr<MappedFile> file;
  REQUIRE_OK(MappedFile::Open(path, &file));
  Reader reader;
  REQUIRE_OK(Reader::Open(std::move(file), &reader));
  return reader.manifest();
}

TEST_CASE("small BF16 tensors are grouped (container version 2): exact, smaller, partial pulls") {
  TempDir dir;
  std::mt19937_64 rng(21);
  MakeSmallTensorPair(dir / "prev.safetensors", dir / "next.safetensors", &rng);
  RunOptions ungrouped = Threads(2);
  ungrouped.group = false;
  REQUIRE_OK(
      Diff(dir / "prev.safetensors", dir / "next.safetensors", dir / "v1.a3d", ungrouped, nullptr));
  for (int threads : {1, 2}) {
    REQUIRE_OK(Diff(dir / "prev.safetensors", dir / "next.safetensors", dir / "d.a3d",
                    Threads(threads), nullptr));
    REQUIRE_OK(Apply(dir / "prev.safetensors", dir / "d.a3d", dir / "out.safetensors",
                     Threads(threads), nullptr));
    CHECK(ReadFile(dir / "out.safetensors") == ReadFile(dir / "next.safetensors"));
  }
  const std::vector<uint8_t> grouped_bytes = ReadFile(dir / "d.a3d");
  const std::vector<uint8_t> v1_bytes = ReadFile(dir / "v1.a3d");
  // Version 2 only when there are groups; version 1 otherwise (older readers read it).
  CHECK(grouped_bytes[4] == 2);
  CHECK(v1_bytes[4] == 1);
  CHECK(ReadManifest(dir / "v1.a3d").files[0].groups.empty());
  REQUIRE_OK(Apply(dir / "prev.safetensors", dir / "v1.a3d", dir / "out1.safetensors", Threads(2),
                   nullptr));
  CHECK(ReadFile(dir / "out1.safetensors") == ReadFile(dir / "next.safetensors"));
  // 31 small tensors in one payload instead of 31: a smaller delta file.
  CAPTURE(grouped_bytes.size());
  CAPTURE(v1_bytes.size());
  CHECK(grouped_bytes.size() < v1_bytes.size());

  const Manifest m = ReadManifest(dir / "d.a3d");
  const FileEntry& f = m.files[0];
  std::map<std::string, const TensorEntry*> by_name;
  for (const TensorEntry& t : f.tensors) by_name[t.name] = &t;
  CHECK(!by_name.at("big")->grouped());
  CHECK(!by_name.at("dense")->grouped());
  CHECK(!by_name.at("scale")->grouped());
  CHECK(!by_name.at("flags")->grouped());
  REQUIRE(by_name.at("norm.0")->grouped());
  CHECK(by_name.at("norm.29")->group == by_name.at("norm.0")->group);
  CHECK(by_name.at("proj")->group == by_name.at("norm.0")->group);
  // Groups hold at most kPieceElements elements: the third 1M-element tensor starts a
  // second group.
  CHECK(f.groups.size() == 2);
  for (const Group& g : f.groups) CHECK(g.elements <= kPieceElements);
  CHECK(by_name.at("mid.1")->group == by_name.at("norm.0")->group);
  CHECK(by_name.at("mid.2")->group != by_name.at("norm.0")->group);

  // Partial pulls of grouped tensors equal the slice of the full apply.
  safetensors::File next;
  REQUIRE_OK(safetensors::File::Open(dir / "next.safetensors", &next));
  REQUIRE_OK(ApplyPartial(dir / "prev.safetensors", dir / "d.a3d", "norm\\.1[0-9]|proj|mid\\.1", 3,
                          70, dir / "part.safetensors", Threads(2), nullptr));
  CheckRowSlices(dir / "part.safetensors", next, 3, 70, 12);
  CHECK(Verify(dir / "prev.safetensors", dir / "d.a3d", Threads(2), nullptr).ok());
  // The library call reads exactly the tensor's group.
  Checkpoint base;
  REQUIRE_OK(Checkpoint::Open(dir / "prev.safetensors", &base));
  const CountedDelta delta(dir / "d.a3d");
  const TensorEntry& proj = delta.Find("proj");
  const uint64_t after_open = delta.counting->read_;
  std::vector<uint8_t> rows(10 * proj.row_bytes());
  REQUIRE_OK(ApplyRows(base, delta.reader, proj, 50, 60, rows.data(), 1));
  CHECK(std::memcmp(rows.data(), next.data(*next.Find("proj")) + 50 * proj.row_bytes(),
                    rows.size()) == 0);
  CHECK(delta.counting->read_ - after_open ==
        delta.reader.manifest().files[0].groups[proj.group].size);

  // A wrong base under a group names the tensor, in apply, verify and partial pulls of
  // another member of its group; nothing is written.
  WriteWrongBase(dir, "norm.12", 3, 0x01);
  CheckWrongBaseRefused(dir, "norm.12", "out2.safetensors");
  Status s = ApplyPartial(dir / "wrong.safetensors", dir / "d.a3d", "norm\\.3", 0, UINT64_MAX,
                          dir / "part2.safetensors", Threads(1), nullptr);
  CHECK(s.code() == ErrorCode::kChecksumMismatch);
  CHECK(s.message().find("norm.12") != std::string::npos);
  CHECK(s.message().find("norm.3") != std::string::npos);
  CHECK(!fs::exists(dir / "part2.safetensors"));
  // A base that lacks one member.
  std::vector<Tensor> few = {Random("norm.3", "BF16", {88}, &rng)};
  WriteSafetensors(dir / "few.safetensors", few);
  s = ApplyPartial(dir / "few.safetensors", dir / "d.a3d", "norm\\.3", 0, UINT64_MAX,
                   dir / "part2.safetensors", Threads(1), nullptr);
  CHECK(s.code() == ErrorCode::kChecksumMismatch);
  CHECK(s.message().find("missing") != std::string::npos);
}

// Writes `m` over the data section of `good` (a container whose manifest was `m`'s source).
std::vector<uint8_t> WithManifest(const Manifest& m, const std::vector<uint8_t>& good,
                                  uint64_t data_start) {
  std::vector<uint8_t> out = SerializeHeaderAndManifest(m, good.size() - data_start);
  out.insert(out.end(), good.begin() + data_start, good.end());
  return out;
}

TEST_CASE("inconsistent groups are refused before anything is written") {
  TempDir dir;
  std::mt19937_64 rng(22);
  std::vector<Tensor> a = {Random("a", "BF16", {300}, &rng), Random("b", "BF16", {50, 4}, &rng),
                           Random("c", "F32", {9}, &rng), Random("d", "BF16", {70}, &rng)};
  std::vector<Tensor> b;
  for (const Tensor& t : a) b.push_back(Step(t, 0.05, &rng));
  WriteSafetensors(dir / "prev.safetensors", a);
  WriteSafetensors(dir / "next.safetensors", b);
  REQUIRE_OK(
      Diff(dir / "prev.safetensors", dir / "next.safetensors", dir / "d.a3d", Threads(1), nullptr));
  const std::vector<uint8_t> good = ReadFile(dir / "d.a3d");
  std::unique_ptr<MappedFile> file;
  REQUIRE_OK(MappedFile::Open(dir / "d.a3d", &file));
  Reader reader;
  REQUIRE_OK(Reader::Open(std::move(file), &reader));
  const Manifest& m = reader.manifest();
  REQUIRE(m.files[0].groups.size() == 1);
  REQUIRE(m.files[0].groups[0].members == std::vector<size_t>{0, 1, 3});
  const std::string bad = dir / "bad.a3d", out = dir / "out.safetensors";
  const auto apply_code = [&](const Manifest& edited) {
    WriteFile(bad, WithManifest(edited, good, reader.data_start()));
    const Status s = Apply(dir / "prev.safetensors", bad, out, Threads(1), nullptr);
    CHECK(!fs::exists(out));
    INFO(s.ToString());
    return s.code();
  };
  Manifest e = m;
  e.files[0].tensors[1].group = 1;  // no such group
  CHECK(apply_code(e) == ErrorCode::kCorruptHeader);
  e = m;
  e.files[0].groups.emplace_back();  // a group without members
  CHECK(apply_code(e) == ErrorCode::kCorruptHeader);
  e = m;
  e.files[0].tensors[2].group = 0;  // an F32 tensor in a group
  e.files[0].tensors[2].pieces.clear();
  CHECK(apply_code(e) == ErrorCode::kCorruptHeader);
  e = m;
  e.files[0].groups.clear();  // "group" fields in a version-1 manifest
  CHECK(apply_code(e) == ErrorCode::kCorruptHeader);
  e = m;
  e.files[0].groups[0].offset = good.size();  // bytes beyond the data section
  CHECK(apply_code(e) == ErrorCode::kCorruptHeader);
  // A member list that disagrees with the payload's own: caught when decoding.
  e = m;
  std::swap(e.files[0].tensors[0], e.files[0].tensors[1]);
  std::swap(e.files[0].tensors[0].data_offset, e.files[0].tensors[1].data_offset);
  CHECK(apply_code(e) != ErrorCode::kOk);
  e = m;
  e.files[0].tensors[3].group = TensorEntry::kNoGroup;  // d leaves the group: no pieces
  CHECK(apply_code(e) == ErrorCode::kCorruptHeader);
  e = m;
  e.files[0].groups[0].target_xxh3 ^= 1;
  CHECK(apply_code(e) == ErrorCode::kCorruptChunk);
}

// `file` (a container) with its manifest recompressed by zstd, its content size stated
// or not, and the header's sizes and checksums made to match.
std::vector<uint8_t> WithRecompressedManifest(const std::vector<uint8_t>& file, bool content_size) {
  const auto get64 = [&](size_t at) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | file[at + i];
    return v;
  };
  const uint64_t manifest_size = get64(8);
  const uint8_t* manifest = file.data() + kHeaderSize;
  std::string json(ZSTD_getFrameContentSize(manifest, manifest_size), '\0');
  REQUIRE(ZSTD_decompress(json.data(), json.size(), manifest, manifest_size) == json.size());
  std::vector<uint8_t> packed(ZSTD_compressBound(json.size()));
  ZSTD_CCtx* ctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(ctx, ZSTD_c_contentSizeFlag, content_size ? 1 : 0);
  const size_t n = ZSTD_compress2(ctx, packed.data(), packed.size(), json.data(), json.size());
  ZSTD_freeCCtx(ctx);
  REQUIRE(!ZSTD_isError(n));
  packed.resize(n);
  std::vector<uint8_t> out(file.begin(), file.begin() + kHeaderSize);
  const auto put64 = [&](size_t at, uint64_t v) {
    for (int i = 0; i < 8; ++i) out[at + i] = static_cast<uint8_t>(v >> (8 * i));
  };
  put64(8, packed.size());
  put64(16, Hash(packed.data(), packed.size()));
  put64(32, Hash(out.data(), 32));
  out.insert(out.end(), packed.begin(), packed.end());
  out.insert(out.end(), file.begin() + kHeaderSize + manifest_size, file.end());
  return out;
}

TEST_CASE("the manifest's zstd frame must state its content size") {
  const std::vector<uint8_t> good = ReadFile("tests/golden/container/v2.a3d");
  REQUIRE(!good.empty());
  const auto open = [](const std::vector<uint8_t>& bytes) {
    Reader reader;
    return Reader::Open(std::make_unique<MemorySource>(bytes), &reader).code();
  };
  CHECK(open(good) == ErrorCode::kOk);
  CHECK(open(WithRecompressedManifest(good, true)) == ErrorCode::kOk);  // another frame, same JSON
  CHECK(open(WithRecompressedManifest(good, false)) == ErrorCode::kCorruptHeader);
}

TEST_CASE("committed delta files of every container version still apply exactly") {
  // tests/golden/container: prev/next made by make_checkpoints.py; v1.a3d written by
  // `arc_v3 diff --no-group` (container version 1), v2.a3d by `arc_v3 diff` (groups,
  // version 2), both with payloads of format version 16.
  const std::string golden = "tests/golden/container/";
  const std::vector<uint8_t> next = ReadFile(golden + "next.safetensors");
  REQUIRE(!next.empty());
  TempDir dir;
  for (int version : {1, 2}) {
    CAPTURE(version);
    const std::string delta = golden + "v" + std::to_string(version) + ".a3d";
    CHECK(ReadFile(delta)[4] == version);
    REQUIRE_OK(Verify(golden + "prev.safetensors", delta, Threads(2), nullptr));
    REQUIRE_OK(
        Apply(golden + "prev.safetensors", delta, dir / "out.safetensors", Threads(2), nullptr));
    CHECK(ReadFile(dir / "out.safetensors") == next);
    // And the wrong base is refused.
    CHECK(Apply(golden + "next.safetensors", delta, dir / "x.safetensors", Threads(1), nullptr)
              .code() == ErrorCode::kChecksumMismatch);
  }
}

// Runs an in-place apply in a child that SIGKILLs itself at the given stage.
void ApplyAndDie(const std::string& prev, const std::string& delta, const std::string& out,
                 const char* stage, int after) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    RunOptions o;
    o.threads = 2;
    std::atomic<int> calls{0};
    o.hook = [&](const char* at) {
      if (std::strcmp(at, stage) == 0 && calls++ >= after) raise(SIGKILL);
      return Status::Ok();
    };
    (void)Apply(prev, delta, out, o, nullptr);  // killed by the hook first
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
}

TEST_CASE("an apply killed or failing midway leaves the old checkpoint intact") {
  TempDir dir;
  std::mt19937_64 rng(6);
  MakeShardedPair(dir / "prev", dir / "next", &rng);
  REQUIRE_OK(Diff(dir / "prev", dir / "next", dir / "d.a3d", Threads(2), nullptr));
  const auto before = Snapshot(dir / "prev");
  fs::copy(dir / "prev", dir / "work");

  for (int after : {0, 1}) {  // of 3 tasks: 2 groups (the 6 layers) and the norm
    ApplyAndDie(dir / "work", dir / "d.a3d", dir / "work", "piece", after);
    // Old shards untouched; the new shard names do not exist (only hidden temp files may).
    for (const auto& [name, bytes] : before) CHECK(ReadFile(dir / ("work/" + name)) == bytes);
    CHECK(!fs::exists(dir / "work/model-00001-of-00002.safetensors"));
  }
  ApplyAndDie(dir / "work", dir / "d.a3d", dir / "work", "rename", 0);
  for (const auto& [name, bytes] : before) CHECK(ReadFile(dir / ("work/" + name)) == bytes);
  // Into a fresh directory: no final file appears.
  ApplyAndDie(dir / "prev", dir / "d.a3d", dir / "fresh", "piece", 1);
  for (const auto& e : fs::directory_iterator(dir / "fresh")) {
    CHECK(e.path().filename().string()[0] == '.');  // only temp files of the dead process
  }

  // An error (not a kill) also cleans up its temp files.
  fs::remove_all(dir / "work");
  fs::copy(dir / "prev", dir / "work");
  RunOptions o;
  o.threads = 2;
  o.hook = [](const char* stage) {
    return std::strcmp(stage, "rename") == 0 ? Status(ErrorCode::kInternal, "injected")
                                             : Status::Ok();
  };
  CHECK(Apply(dir / "work", dir / "d.a3d", dir / "work", o, nullptr).code() ==
        ErrorCode::kInternal);
  CHECK(Snapshot(dir / "work") == before);
  // And the interrupted checkpoint can still be updated afterwards.
  REQUIRE_OK(Apply(dir / "work", dir / "d.a3d", dir / "work", Threads(2), nullptr));
  CHECK(Snapshot(dir / "work") == Snapshot(dir / "next"));
}

// Bytes of mapped files resident in this process's page tables (RssFile of
// /proc/self/status); 0 where the kernel does not say.
uint64_t ResidentFileBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssFile:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  }
  return 0;
}

TEST_CASE("diff and apply keep only the pieces in flight of the mapped checkpoints resident") {
  if (ResidentFileBytes() == 0) return;  // no /proc: nothing to measure with
  TempDir dir;
  std::mt19937_64 rng(8);
  const Tensor prev = Random("w", "BF16", {4096, 8192}, &rng);  // 64 MiB: 16 pieces
  WriteSafetensors(dir / "prev.safetensors", {prev});
  WriteSafetensors(dir / "next.safetensors", {Step(prev, 0.01, &rng)});
  // Mapped whole, diff would hold 128 MiB and apply 64 MiB; two workers hold at most a
  // piece of each input at a time, 2 x 2 x 8 MiB (reached when the hook catches both
  // workers mid-piece), plus what the kernel reads ahead.
  const uint64_t limit = (uint64_t{32} + 4) << 20;
  std::mutex mutex;
  uint64_t before = 0, peak = 0;
  RunOptions o = Threads(2);
  o.sync = false;
  o.hook = [&](const char*) {
    std::lock_guard<std::mutex> lock(mutex);
    peak = std::max(peak, ResidentFileBytes());
    return Status::Ok();
  };
  before = peak = ResidentFileBytes();
  REQUIRE_OK(Diff(dir / "prev.safetensors", dir / "next.safetensors", dir / "d.a3d", o, nullptr));
  CHECK(peak - before < limit);
  before = peak = ResidentFileBytes();
  REQUIRE_OK(Apply(dir / "prev.safetensors", dir / "d.a3d", dir / "out.safetensors", o, nullptr));
  CHECK(peak - before < limit);
  CHECK(ReadFile(dir / "out.safetensors") == ReadFile(dir / "next.safetensors"));

  // The same for 64 small tensors coded in 16 groups.
  std::vector<Tensor> small_prev, small_next;
  for (int i = 0; i < 64; ++i) {
    small_prev.push_back(Random("w." + std::to_string(i), "BF16", {512, 1024}, &rng));
    small_next.push_back(Step(small_prev.back(), 0.01, &rng));
  }
  WriteSafetensors(dir / "small_prev.safetensors", small_prev);
  WriteSafetensors(dir / "small_next.safetensors", small_next);
  before = peak = ResidentFileBytes();
  REQUIRE_OK(Diff(dir / "small_prev.safetensors", dir / "small_next.safetensors", dir / "s.a3d", o,
                  nullptr));
  CHECK(peak - before < limit);
  CHECK(ReadManifest(dir / "s.a3d").files[0].groups.size() == 16);
  before = peak = ResidentFileBytes();
  REQUIRE_OK(
      Apply(dir / "small_prev.safetensors", dir / "s.a3d", dir / "s_out.safetensors", o, nullptr));
  CHECK(peak - before < limit);
  CHECK(ReadFile(dir / "s_out.safetensors") == ReadFile(dir / "small_next.safetensors"));
}

}  // namespace
}  // namespace checkpoint
}  // namespace arc_v3
