// Measures the modelled chunk coder on corpus runs: for each folder of consecutive
// step_NNN.safetensors snapshots, every consecutive pair's BF16 tensors are coded one
// chunk per 2^20 elements and decoded again (checked), and the payload is compared with
// ARCv3 as published (delta_compress, Format::kPublished, per tensor) and with the entropy
// bound (b2) the corpus' stats.json records for that pair.
//
// Usage: model_coder_measure [--block=LOG2] [--reps=N] [--verbose] [--history]
//                            [--coder=rans|best] DIR...
// (--verbose adds a line per tensor; --history codes each run as one session, the first
// pair without history and every later one with the history of the pairs before.)
// Prints one line per pair and a pooled line per run. Speeds are single-thread GB/s of
// BF16 input (2 bytes per element), thread CPU time, best of N runs (--reps, default 3;
// more steadies the figures on a shared machine).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "arc_v3.hpp"
#include "src/codec/kernels.h"
#include "src/codec/model_coder.h"
#include "src/codec/rans_coder.h"
#include "src/checkpoint/safetensors.h"

namespace {

int g_reps = 3;
// Which chunk coder: the adaptive modelled coder, the rANS coder, or per chunk the
// smaller of the two (as the frame encoder's race does).
enum class Coder { kModelled, kRans, kBest };
Coder g_coder = Coder::kModelled;

// Codes one chunk with the chosen coder; the first byte says which (the frame's mode).
arc_v3::Status EncodeChunk(const uint16_t* src, const uint16_t* dst, size_t len, int block_log,
                           const uint8_t* history, std::vector<uint8_t>* out) {
  out->clear();
  arc_v3::Status s = arc_v3::Status::Ok();
  if (g_coder != Coder::kRans) {
    out->push_back(2);
    s = block_log > 0 ? arc_v3::EncodeChunkModelledWithBlock(src, dst, len, block_log, out, history)
                      : arc_v3::EncodeChunkModelled(src, dst, len, out, history);
    if (!s.ok() || g_coder == Coder::kModelled) return s;
  }
  const size_t changes = arc_v3::ClassifyChanges(src, dst, len).changed;
  if (changes == 0) return s;
  std::vector<uint32_t> positions(changes);
  std::vector<uint16_t> xors(changes);
  arc_v3::CompactChanges(src, dst, len, positions.data(), xors.data());
  // With a history, the rANS coding may use it (the frame's Chunk_Mode 4).
  std::vector<uint8_t> rans = {3};
  static arc_v3::RansScratch scratch;  // as the frame encoder's, reused
  bool with_history = false;
  s = arc_v3::EncodeChunkRans(src, dst, len, positions.data(), changes, &rans, &scratch, history,
                              &with_history);
  if (with_history) rans[0] = 4;
  if (s.ok() && (out->empty() || rans.size() < out->size())) out->swap(rans);
  return s;
}

arc_v3::Status DecodeChunk(const uint16_t* src, size_t len, const std::vector<uint8_t>& chunk,
                           const uint8_t* history, std::vector<uint32_t>* positions,
                           std::vector<uint16_t>* xors) {
  if (chunk.empty()) {
    positions->clear();
    xors->clear();
    return arc_v3::Status::Ok();
  }
  return chunk[0] >= 3 ? arc_v3::DecodeChunkRans(src, len, chunk.data() + 1, chunk.size() - 1,
                                                 positions, xors, chunk[0] == 4 ? history : nullptr)
                       : arc_v3::DecodeChunkModelled(src, len, chunk.data() + 1, chunk.size() - 1,
                                                     positions, xors, history);
}

// Thread CPU time: the shared build machine is loaded, and time spent descheduled is not
// the coder's.
struct Clock {
  using time_point = double;
  static double now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
};

struct Totals {
  uint64_t elements = 0, changed = 0, model_bytes = 0, arc_bytes = 0;
  double b2_bits = 0, encode_s = 0, decode_s = 0;
};

double Seconds(double a, double b) { return b - a; }

// Codes one tensor pair; returns false on a round-trip failure.
bool MeasureTensor(const uint16_t* src, const uint16_t* dst, size_t n, int block_log,
                   const uint8_t* history, Totals* totals) {
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<std::vector<uint8_t>> chunks;
  double best_encode = 1e30, best_decode = 1e30;
  for (int rep = 0; rep < g_reps; ++rep) {
    chunks.clear();
    const auto t0 = Clock::now();
    for (size_t begin = 0; begin < n; begin += kChunk) {
      const size_t len = std::min(kChunk, n - begin);
      chunks.emplace_back();
      const arc_v3::Status s = EncodeChunk(src + begin, dst + begin, len, block_log,
                                           history ? history + begin : nullptr, &chunks.back());
      if (!s.ok()) {
        std::fprintf(stderr, "encode: %s\n", s.ToString().c_str());
        return false;
      }
    }
    best_encode = std::min(best_encode, Seconds(t0, Clock::now()));
  }
  std::vector<uint32_t> positions;
  std::vector<uint16_t> xors;
  for (int rep = 0; rep < g_reps; ++rep) {
    const auto t0 = Clock::now();
    size_t c = 0;
    for (size_t begin = 0; begin < n; begin += kChunk, ++c) {
      const size_t len = std::min(kChunk, n - begin);
      const arc_v3::Status s = DecodeChunk(src + begin, len, chunks[c],
                                           history ? history + begin : nullptr, &positions, &xors);
      if (!s.ok()) {
        std::fprintf(stderr, "decode: %s\n", s.ToString().c_str());
        return false;
      }
      if (rep == 0) {  // verify outside the timed runs' interest: once is enough
        size_t k = 0;
        for (size_t i = 0; i < len; ++i) {
          const uint16_t x = src[begin + i] ^ dst[begin + i];
          if (x == 0) continue;
          if (k >= positions.size() || positions[k] != i || xors[k] != x) {
            std::fprintf(stderr, "round trip mismatch at %zu\n", begin + i);
            return false;
          }
          ++k;
        }
        if (k != positions.size()) {
          std::fprintf(stderr, "round trip: extra positions\n");
          return false;
        }
      }
    }
    best_decode = std::min(best_decode, Seconds(t0, Clock::now()));
  }
  // The leading byte stands for the frame's Chunk_Mode.
  for (const auto& chunk : chunks) totals->model_bytes += chunk.size();
  totals->encode_s += best_encode;
  totals->decode_s += best_decode;
  totals->elements += n;
  for (size_t i = 0; i < n; ++i) totals->changed += src[i] != dst[i];

  arc_v3::Options options;
  options.format = arc_v3::Format::kPublished;
  options.threads = 1;
  arc_v3::Delta delta;
  const arc_v3::Status s = arc_v3::delta_compress(src, dst, n, &delta, options);
  if (!s.ok()) {
    std::fprintf(stderr, "arc_v3: %s\n", s.ToString().c_str());
    return false;
  }
  totals->arc_bytes += delta.bytes.size();
  return true;
}

void Print(const char* label, const Totals& t) {
  const double bf16 = 2.0 * static_cast<double>(t.elements);
  const double model_pct = 100.0 * t.model_bytes / bf16;
  const double arc_pct = 100.0 * t.arc_bytes / bf16;
  const double b2_pct = 100.0 * (t.b2_bits / 8.0) / bf16;
  std::printf(
      "%-28s changed %.3f%%  model %.4f%%  arcv3 %.4f%%  b2 %.4f%%  model/arcv3 %.3f  "
      "model/b2 %.3f  bits/change %.2f  enc %.2f GB/s  dec %.2f GB/s\n",
      label, 100.0 * t.changed / t.elements, model_pct, arc_pct, b2_pct,
      static_cast<double>(t.model_bytes) / t.arc_bytes, b2_pct > 0 ? model_pct / b2_pct : 0.0,
      8.0 * t.model_bytes / std::max<uint64_t>(t.changed, 1), bf16 / t.encode_s / 1e9,
      bf16 / t.decode_s / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  int block_log = 0;
  bool verbose = false;
  bool sessions = false;
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--verbose") == 0) {
      verbose = true;
    } else if (std::strcmp(argv[i], "--history") == 0) {
      sessions = true;
    } else if (std::strcmp(argv[i], "--coder=rans") == 0) {
      g_coder = Coder::kRans;
    } else if (std::strcmp(argv[i], "--coder=best") == 0) {
      g_coder = Coder::kBest;
    } else if (std::strncmp(argv[i], "--reps=", 7) == 0) {
      g_reps = std::max(1, std::atoi(argv[i] + 7));
    } else if (std::strncmp(argv[i], "--block=", 8) == 0) {
      block_log = std::atoi(argv[i] + 8);
    } else {
      dirs.push_back(argv[i]);
    }
  }
  if (dirs.empty()) {
    std::fprintf(stderr,
                 "usage: %s [--block=LOG2] [--reps=N] [--verbose] [--history] "
                 "[--coder=rans|best] CORPUS_DIR...\n",
                 argv[0]);
    return 2;
  }
  for (const std::string& dir : dirs) {
    // Bound (b2) per pair, keyed by the pair's first file.
    std::map<std::string, double> b2_bits;
    std::ifstream stats_file(dir + "/stats.json");
    if (stats_file) {
      const nlohmann::json stats = nlohmann::json::parse(stats_file, nullptr, false);
      if (!stats.is_discarded() && stats.contains("pairs")) {
        for (const auto& pair : stats["pairs"]) {
          b2_bits[pair["files"][0].get<std::string>()] =
              pair["bits"]["b2_exp_per_tensor_value_given_exp"].get<double>();
        }
      }
    }
    std::vector<std::string> files;
    for (int step = 0; step < 1000; ++step) {
      char name[64];
      std::snprintf(name, sizeof(name), "step_%03d.safetensors", step);
      if (!std::ifstream(dir + "/" + name)) break;
      files.push_back(name);
    }
    Totals run;
    std::map<std::string, std::vector<uint8_t>> histories;  // per tensor, with --history
    for (size_t p = 0; p + 1 < files.size(); ++p) {
      arc_v3::safetensors::File a, b;
      arc_v3::Status s = arc_v3::safetensors::File::Open(dir + "/" + files[p], &a);
      if (s.ok()) s = arc_v3::safetensors::File::Open(dir + "/" + files[p + 1], &b);
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
      Totals pair;
      for (const auto& tensor : a.tensors()) {
        if (tensor.dtype != "BF16") continue;
        const auto* other = b.Find(tensor.name);
        if (other == nullptr || other->size() != tensor.size()) continue;
        std::vector<uint16_t> src(tensor.size() / 2), dst(tensor.size() / 2);
        std::memcpy(src.data(), a.data(tensor), tensor.size());
        std::memcpy(dst.data(), b.data(*other), other->size());
        const uint64_t before = pair.model_bytes;
        std::vector<uint8_t>* history = nullptr;
        if (sessions) {
          history = &histories[tensor.name];
          history->resize(src.size(), 0);
        }
        if (!MeasureTensor(src.data(), dst.data(), src.size(), block_log,
                           history ? history->data() : nullptr, &pair)) {
          return 1;
        }
        if (history) arc_v3::AdvanceHistory(src.data(), dst.data(), src.size(), history->data());
        if (verbose) {
          size_t changed = 0;
          for (size_t i = 0; i < src.size(); ++i) changed += src[i] != dst[i];
          std::printf("    %-32s n %9zu changed %7zu bits %9llu\n", tensor.name.c_str(), src.size(),
                      changed, static_cast<unsigned long long>(8 * (pair.model_bytes - before)));
        }
      }
      const auto it = b2_bits.find(files[p]);
      pair.b2_bits = it == b2_bits.end() ? 0 : it->second;
      Print((dir.substr(dir.find_last_of('/') + 1) + " " + files[p].substr(5, 3)).c_str(), pair);
      run.elements += pair.elements;
      run.changed += pair.changed;
      run.model_bytes += pair.model_bytes;
      run.arc_bytes += pair.arc_bytes;
      run.b2_bits += pair.b2_bits;
      run.encode_s += pair.encode_s;
      run.decode_s += pair.decode_s;
    }
    Print((dir.substr(dir.find_last_of('/') + 1) + " ALL").c_str(), run);
  }
  return 0;
}
