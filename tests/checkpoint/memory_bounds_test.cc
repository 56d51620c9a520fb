// Decoders allocate by evidence: crafted inputs that claim enormous sizes get a clear
// error, within a memory limit, instead of a huge allocation or std::terminate. Each case
// runs in a child process whose address space may grow only by a set amount (not under
// ASan, which reserves terabytes: there only the result is checked).
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#define ZSTD_STATIC_LINKING_ONLY  // magicless frames, as the payload streams use
#include <zstd.h>

#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "arc_v3.hpp"
#include "src/checkpoint/checkpoint_delta.h"
#include "src/checkpoint/container.h"
#include "src/codec/format.h"
#include "src/common/parallel.h"

namespace arc_v3 {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kLimitMemory = false;
#else
constexpr bool kLimitMemory = true;
#endif

constexpr uint64_t kMiB = uint64_t{1} << 20;

uint64_t AddressSpaceBytes() {
  unsigned long pages = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f != nullptr) {
    if (std::fscanf(f, "%lu", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// Runs body() in a child whose address space may grow by `extra` bytes; returns its exit
// status (body's result; 100 if it threw), or 128 + the signal that ended it
// (std::terminate: 134).
int RunLimited(uint64_t extra, const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    mallopt(M_ARENA_MAX, 1);  // threads share one heap: no 64 MiB arena reservations each
    if (kLimitMemory) {
      const rlimit limit = {AddressSpaceBytes() + extra, RLIM_INFINITY};
      setrlimit(RLIMIT_AS, &limit);
    }
    int rc = 100;  // what body() throws: never back into the test runner
    try {
      rc = body();
    } catch (...) {}
    _exit(rc);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The child's verdict: 0 if `status` has `code`, else 1 (and the status on stderr).
int Expect(const Status& status, ErrorCode code) {
  if (status.code() == code) return 0;
  std::fprintf(stderr, "expected code %d, got %s\n", static_cast<int>(code),
               status.ToString().c_str());
  return 1;
}

// A one-tensor frame of the current version: `chunks` chunks of 2^chunk_log elements.
std::vector<uint8_t> Frame(int chunk_log, const std::vector<std::vector<uint8_t>>& chunks) {
  std::vector<uint8_t> out(kMagic, kMagic + sizeof(kMagic));
  out.push_back(kFormatVersion);
  out.push_back(0);  // flags
  PutVarint(uint64_t{chunks.size()} << chunk_log, &out);
  out.push_back(static_cast<uint8_t>(chunk_log));
  for (size_t c = 0; c + 1 < chunks.size(); ++c) PutVarint(chunks[c].size(), &out);
  for (const auto& chunk : chunks) out.insert(out.end(), chunk.begin(), chunk.end());
  return out;
}

// An XOR-stream chunk's head: n changes, none of the sign or exponent, gap positions.
std::vector<uint8_t> XorChunkHead(uint64_t n) {
  std::vector<uint8_t> out = {kChunkXorStreams};
  PutVarint(n, &out);
  PutVarint(0, &out);
  out.push_back(kPositionsGaps);
  return out;
}

// A stream record of `raw` bytes of `fill`, as one magicless zstd frame.
void PutZstdStream(size_t raw, uint8_t fill, std::vector<uint8_t>* out) {
  const std::vector<uint8_t> bytes(raw, fill);
  std::vector<uint8_t> packed(ZSTD_compressBound(raw));
  ZSTD_CCtx* ctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(ctx, ZSTD_c_format, ZSTD_f_zstd1_magicless);
  ZSTD_CCtx_setParameter(ctx, ZSTD_c_contentSizeFlag, 0);
  ZSTD_CCtx_setParameter(ctx, ZSTD_c_compressionLevel, 19);
  const size_t n = ZSTD_compress2(ctx, packed.data(), packed.size(), bytes.data(), raw);
  ZSTD_freeCCtx(ctx);
  REQUIRE(!ZSTD_isError(n));
  out->push_back(kCodecZstd);
  PutVarint(raw, out);
  PutVarint(n, out);
  out->insert(out->end(), packed.begin(), packed.begin() + static_cast<std::ptrdiff_t>(n));
}

TEST_CASE("ParallelFor hands a worker's exception to the caller") {
  const int rc = RunLimited(uint64_t{1} << 40, [] {
    try {
      ParallelFor(64, 4, [](size_t task, size_t) {
        if (task == 5) throw std::bad_alloc();
      });
    } catch (const std::bad_alloc&) {
      const Status s = TryParallelFor(8, 2, [](size_t, size_t) { throw std::bad_alloc(); });
      return Expect(s, ErrorCode::kOutOfMemory);
    }
    return 2;
  });
  CHECK(rc == 0);
}

TEST_CASE("delta_stats: a claimed change count allocates nothing its streams do not back") {
  // Each chunk claims 2^24 changes (96 MiB of change lists); its streams are missing, or
  // claim more than zstd can make of their bytes.
  std::vector<uint8_t> missing = XorChunkHead(uint64_t{1} << 24);
  std::vector<uint8_t> overclaimed = XorChunkHead(uint64_t{1} << 24);
  overclaimed.push_back(kCodecZstd);
  PutVarint(uint64_t{1} << 26, &overclaimed);
  PutVarint(4, &overclaimed);
  overclaimed.insert(overclaimed.end(), {0, 0, 0, 0});
  const std::vector<uint8_t> payloads[] = {Frame(24, {missing, missing, missing, missing}),
                                           Frame(24, {overclaimed, overclaimed})};
  const ErrorCode codes[] = {ErrorCode::kTruncated, ErrorCode::kCodecFailure};
  for (int k = 0; k < 2; ++k) {
    CAPTURE(k);
    CHECK(payloads[k].size() < 100);
    const int rc = RunLimited(48 * kMiB, [&] {
      PayloadStats stats;
      return Expect(delta_stats(payloads[k].data(), payloads[k].size(), &stats), codes[k]);
    });
    CHECK(rc == 0);
  }
}

TEST_CASE("delta_stats without a base holds one chunk's changes per worker, not the payload's") {
  // 64 chunks of 2^22 elements, every element changed (gaps 0, mantissa XORs 0x7F): 24 MiB
  // of change lists per chunk from about 1 KB of zstd streams.
  constexpr int kChunkLog = 22;
  constexpr size_t kChunks = 64;
  constexpr size_t n = size_t{1} << kChunkLog;
  std::vector<uint8_t> chunk = XorChunkHead(n);
  PutZstdStream(n, 0, &chunk);             // gaps
  PutZstdStream(n * 7 / 8, 0xFF, &chunk);  // packed 7-bit mantissa XORs
  const std::vector<uint8_t> payload =
      Frame(kChunkLog, std::vector<std::vector<uint8_t>>(kChunks, chunk));
  MESSAGE("payload bytes: ", payload.size());
  CHECK(payload.size() < 64 * 1024);
  const uint64_t workers = WorkerCount(0, kChunks);
  const int rc = RunLimited(workers * 48 * kMiB + 128 * kMiB, [&] {
    PayloadStats stats;
    const Status s = delta_stats(payload.data(), payload.size(), &stats);
    if (!s.ok()) return Expect(s, ErrorCode::kOk);
    return stats.changed == kChunks * n && stats.counts_known ? 0 : 3;
  });
  CHECK(rc == 0);
}

// A container of `manifest` (its bytes as they are) and an empty data section.
std::vector<uint8_t> Container(const std::vector<uint8_t>& manifest) {
  std::vector<uint8_t> out(checkpoint::kHeaderSize, 0);
  std::memcpy(out.data(), checkpoint::kMagic, 4);
  out[4] = static_cast<uint8_t>(checkpoint::kVersion);
  const auto put64 = [&](size_t at, uint64_t v) {
    for (int i = 0; i < 8; ++i) out[at + i] = static_cast<uint8_t>(v >> (8 * i));
  };
  put64(8, manifest.size());
  put64(16, checkpoint::Hash(manifest.data(), manifest.size()));
  put64(24, 0);
  put64(32, checkpoint::Hash(out.data(), 32));
  out.insert(out.end(), manifest.begin(), manifest.end());
  return out;
}

TEST_CASE("container: the manifest buffer grows as its frame decodes, not by its content size") {
  // A zstd frame whose header claims 1 GiB of content and holds two bytes.
  std::vector<uint8_t> frame = {0x28, 0xB5, 0x2F, 0xFD, 0xE0};  // single segment, 8-byte size
  for (int i = 0; i < 8; ++i) frame.push_back(static_cast<uint8_t>((uint64_t{1} << 30) >> (8 * i)));
  frame.insert(frame.end(), {0x11, 0x00, 0x00, '{', '}'});  // last raw block of 2 bytes
  const std::vector<uint8_t> bytes = Container(frame);
  CHECK(bytes.size() < 100);
  const int rc = RunLimited(256 * kMiB, [&] {
    checkpoint::Reader reader;
    return Expect(
        checkpoint::Reader::Open(std::make_unique<checkpoint::MemorySource>(bytes), &reader),
        ErrorCode::kCorruptHeader);
  });
  CHECK(rc == 0);
}

// A one-file manifest with one tensor of `dtype` [rows] in one piece of `coder`, 16 stored
// bytes, and the container holding it.
std::vector<uint8_t> OneTensorContainer(checkpoint::TensorKind kind, const char* dtype,
                                        uint64_t rows, checkpoint::Coder coder) {
  using namespace checkpoint;
  const std::vector<uint8_t> data(16 + 16, 0);
  Manifest m;
  FileEntry f;
  f.name = "model.safetensors";
  f.header.row_end = 16;
  f.header.size = 16;
  f.header.xxh3 = Hash(data.data(), 16);
  f.data_start = 16;
  TensorEntry t;
  t.name = "w";
  t.dtype = dtype;
  t.shape = {rows};
  t.kind = kind;
  Piece p;
  p.row_end = rows;
  p.offset = 16;
  p.size = 16;
  p.coder = coder;
  p.xxh3 = Hash(data.data() + 16, 16);
  t.pieces = {p};
  t.base_xxh3 = CombineHashes({p.base_xxh3});
  t.target_xxh3 = CombineHashes({p.target_xxh3});
  f.size = 16 + t.bytes();
  f.tensors = {t};
  m.files = {f};
  std::vector<uint8_t> out = SerializeHeaderAndManifest(m, data.size());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

TEST_CASE("container: a piece without a base must be backed by its stored bytes") {
  using checkpoint::Coder;
  using checkpoint::TensorKind;
  struct Case {
    Coder coder;
    uint64_t rows;  // of F32
    bool ok;
  } cases[] = {{Coder::kStored, 4, true},
               {Coder::kStored, 5, false},
               {Coder::kZstd, 16 * 8192, true},
               {Coder::kZstd, 16 * 8192 + 1, false},
               {Coder::kZstdPlanes, uint64_t{1} << 40, false}};
  for (const Case& c : cases) {
    CAPTURE(c.rows);
    const std::vector<uint8_t> bytes =
        OneTensorContainer(TensorKind::kAdded, "F32", c.rows, c.coder);
    checkpoint::Reader reader;
    const Status s =
        checkpoint::Reader::Open(std::make_unique<checkpoint::MemorySource>(bytes), &reader);
    INFO(s.ToString());
    CHECK(s.code() == (c.ok ? ErrorCode::kOk : ErrorCode::kCorruptHeader));
  }
}

TEST_CASE("partial apply sizes its output by the base before creating it") {
  // A delta tensor of 2^61 bytes with no base: refused as a wrong base, not by a failed
  // attempt to reserve 2 EiB of disk.
  namespace fs = std::filesystem;
  const std::vector<uint8_t> bytes = OneTensorContainer(
      checkpoint::TensorKind::kDelta, "BF16", uint64_t{1} << 60, checkpoint::Coder::kArcV3);
  char name[] = "/tmp/arc_v3_memory_bounds_XXXXXX";
  const std::string dir = mkdtemp(name);
  const std::string delta = dir + "/delta.a3d", out = dir + "/out.safetensors";
  std::ofstream(delta, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  const int rc = RunLimited(256 * kMiB, [&] {
    checkpoint::RunOptions options;
    checkpoint::RunReport report;
    return Expect(checkpoint::ApplyPartial("", delta, ".*", 0, UINT64_MAX, out, options, &report),
                  ErrorCode::kChecksumMismatch);
  });
  CHECK(rc == 0);
  CHECK(!fs::exists(out));
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace arc_v3
