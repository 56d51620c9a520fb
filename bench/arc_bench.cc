// arc_bench: arc_v3 against the published competitors on realistic data, side by side with
// the entropy bounds of the data and the memory-bandwidth ceiling of the kernels.
//
// For each dataset (consecutive checkpoints given by --dir, and/or the built-in generator
// at three densities) and each codec: payload as % of the BF16 bytes, bits per changed
// element, the ratio to bound (b2), and compress / decompress throughput (GB/s of BF16
// input, median of several runs, one thread and all threads). Every round trip is checked
// bit-exact. Then, per dataset and step pair, against each pair's bound (b2): the small
// tensors grouped in one payload (delta_compress_tensors) and session mode
// (arc_v3::Session over the run's steps); then memcpy bandwidth and each kernel's speed per
// Highway target; last, the headline table (the README's: arc_v3 against ARCv3 as
// published, the smallest other codec, bound (b2) and slime_zstd's speed).
//
// Run `arc_bench --help` for the flags.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "arc_v3.hpp"
#include "bench/codec.h"
#include "bench/dataset.h"
#include "bench/delta_stats.h"
#include "bench/generator.h"
#include "bench/timing.h"
#include "hwy/targets.h"
#include "src/codec/kernels.h"
#include "src/common/parallel.h"
#include "src/common/xxh3.h"

namespace arc_v3 {
namespace bench {
namespace {

constexpr char kUsage[] =
    R"(arc_bench: arc_v3 vs. published BF16-delta codecs, with entropy bounds and bandwidth limits.

Usage: arc_bench [flags]
  --generated        benchmark the built-in generator's three regimes (0.2%, 2%, 10% changed);
                     the default when no --dir is given
  --params N         generator model size in parameters (default 2000000)
  --deltas N         generator step pairs per regime (default 3)
  --dir PATH         a run directory of consecutive checkpoints (step_*.safetensors, or one
                     subdirectory per sharded checkpoint); repeatable
  --codecs a,b,c     only these codecs (names as in the table, see Codecs below; default all)
  --quick            fewer repetitions, smaller kernel buffers
  --threads N        "all threads" means N (default: hardware threads)
  --no-kernels       skip the memcpy / kernel speed section
  --no-session       skip the per-step table (grouped tensors and arc_v3::Session over each run's steps)
  --step-effort N    effort (0-3) of the per-step table's payloads (default: the library's, 2);
                     3 also races the adaptive coder on dense session chunks
  --json FILE        write all results as JSON
  --csv FILE         write the codec table as CSV
  --chart FILE.png   plot payload % vs density per codec (needs gnuplot; writes FILE.png only)
  --regimes a,b      only these generator regimes: low, mid, high (default all three)
  --save-generated DIR  also write each generated regime as DIR/<regime>/step_NNN.safetensors
  --generate-only    with --save-generated: write the checkpoints and stop (e.g. a >= 1 GB
                     pair for checkpoint_bench: --params 540000000 --deltas 1 --regimes low)
  --help             this text

Codecs (one row each, payload = all a receiver needs besides prev and the shapes):
  arc_v3             the library's default (Format::kDefault, effort 2): the README's arc_v3
  arc_v3_e0, _e1, _e3  the same format at effort 0, 1, 3
  arc_v3_published    ARCv3 as published (Format::kPublished), effort 2; arc_v3_published_e0,
                     _e1, _e3 at the other efforts
  trl_draft, trl_gap, pulsesync, arcv2_like, slime_zstd, zstd19_xor, lz4_xor
                     the published competitors, re-implemented (bench/baselines/)
  Release 1.0.0 (and its bench/results/) named ARCv3 as published arc_v3_e0..e3 and the
  default arc_default_e0..e3: arc_default_e2 is arc_v3, arc_v3_e2 is arc_v3_published, and
  arc_v3_e0, _e1, _e3 now mean the default format.

The output ends with the headline table (the README's): per dataset, arc_v3's payload %
of the BF16 bytes, ARCv3 as published's, the smallest other codec's, bound (b2), arc_v3 /
(b2), and one-thread decode and encode GB/s of arc_v3 against slime_zstd.

Throughput is GB/s of BF16 input (the `next` checkpoint's bytes), the median of up to 5 runs
(3 with --quick). "nT" runs the tensors of a step in parallel on all threads.
Bounds (plug-in entropies, see bench/delta_stats.h): (a) positions i.i.d. per tensor + H(d);
(b) P(change | exponent) per tensor + H(d); (b2) as (b) with d also conditioned on the
exponent; (b2 learned) the contexts of (b2) with probabilities learned on the way (what
they cost a coder that is not told them); (c), for pairs with a previous pair, P(change |
exponent, the element's previous-step state: unchanged, up, down) per tensor + H(d | that
state): what a session's history can use. x(b), x(b2) and x(c) are payload / bound.
)";

struct Flags {
  bool generated = false;
  uint64_t params = 2'000'000;
  int deltas = 3;
  std::vector<std::string> dirs;
  std::set<std::string> codecs;
  bool quick = false;
  int threads = 0;
  bool kernels = true;
  bool session = true;
  int step_effort = Options().effort;
  std::string json, csv, chart, save_generated;
  std::set<std::string> regimes{"low", "mid", "high"};
  bool generate_only = false;
};

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "arc_bench: %s needs a value\n", arg.c_str());
        return false;
      }
      *out = argv[++i];
      return true;
    };
    auto number = [&](uint64_t* out, uint64_t min) {
      std::string text;
      if (!value(&text)) return false;
      char* end = nullptr;
      const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || v < min) {
        std::fprintf(stderr, "arc_bench: %s: bad value '%s'\n", arg.c_str(), text.c_str());
        return false;
      }
      *out = v;
      return true;
    };
    std::string text;
    uint64_t n = 0;
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (arg == "--generated") {
      flags->generated = true;
    } else if (arg == "--params") {
      if (!number(&flags->params, 10000)) return false;
    } else if (arg == "--deltas") {
      if (!number(&n, 1) || n > 100) return false;
      flags->deltas = static_cast<int>(n);
    } else if (arg == "--dir") {
      if (!value(&text)) return false;
      flags->dirs.push_back(text);
    } else if (arg == "--codecs") {
      if (!value(&text)) return false;
      std::stringstream list(text);
      for (std::string name; std::getline(list, name, ',');) {
        if (!name.empty()) flags->codecs.insert(name);
      }
    } else if (arg == "--quick") {
      flags->quick = true;
    } else if (arg == "--threads") {
      if (!number(&n, 1) || n > 1024) return false;
      flags->threads = static_cast<int>(n);
    } else if (arg == "--no-kernels") {
      flags->kernels = false;
    } else if (arg == "--no-session") {
      flags->session = false;
    } else if (arg == "--step-effort") {
      if (!number(&n, 0) || n > 3) return false;
      flags->step_effort = static_cast<int>(n);
    } else if (arg == "--json") {
      if (!value(&flags->json)) return false;
    } else if (arg == "--csv") {
      if (!value(&flags->csv)) return false;
    } else if (arg == "--chart") {
      if (!value(&flags->chart)) return false;
    } else if (arg == "--save-generated") {
      if (!value(&flags->save_generated)) return false;
    } else if (arg == "--regimes") {
      if (!value(&text)) return false;
      flags->regimes.clear();
      std::stringstream list(text);
      for (std::string name; std::getline(list, name, ',');) {
        if (name != "low" && name != "mid" && name != "high") {
          std::fprintf(stderr, "arc_bench: --regimes: unknown regime '%s'\n", name.c_str());
          return false;
        }
        flags->regimes.insert(name);
      }
    } else if (arg == "--generate-only") {
      flags->generate_only = true;
    } else {
      std::fprintf(stderr, "arc_bench: unknown flag '%s' (see --help)\n", arg.c_str());
      return false;
    }
  }
  if (flags->dirs.empty()) flags->generated = true;
  if (flags->generate_only && (flags->save_generated.empty() || !flags->dirs.empty())) {
    std::fprintf(stderr, "arc_bench: --generate-only needs --save-generated and no --dir\n");
    return false;
  }
  return true;
}

// Progress on stderr: one rewritten line on a terminal, plain lines otherwise.
void Progress(const std::string& text) {
  static const bool tty = isatty(2);
  if (tty) {
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  std::fflush(stderr);
}

void ProgressDone() {
  if (isatty(2)) std::fprintf(stderr, "\r\033[K");
}

// Output files may name folders that do not exist yet.
void CreateParentDirectory(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
}

std::string Format(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, value);
  return buffer;
}

// " (renamed: ...)" for a codec name of release 1.0.0 that is gone, else "".
std::string RenamedCodecHint(const std::string& name) {
  const std::string old_default = "arc_default_e";
  if (name.rfind(old_default, 0) == 0 && name.size() == old_default.size() + 1) {
    const std::string effort = name.substr(old_default.size());
    return " (renamed: the default format is now " +
           std::string(effort == "2" ? kDefaultCodec : kDefaultCodec + ("_e" + effort)) + ")";
  }
  if (name == "arc_v3_e2") {
    return std::string(" (renamed: ARCv3 as published at effort 2 is now ") + kPublishedCodec +
           ", the default format at effort 2 " + kDefaultCodec + ")";
  }
  return "";
}

// ---------------------------------------------------------------------------- codecs

struct CodecResult {
  std::string codec;
  bool ok = true;
  std::string error;
  uint64_t payload_bytes = 0;
  double compress_1t = 0, compress_nt = 0, decompress_1t = 0, decompress_nt = 0;  // GB/s
};

// Session mode, per step pair: the same tensors through arc_v3::Session, so that step k is
// coded with the history of steps 0..k-1, beside the stateless default (delta_compress).
// Both payloads count frames and the 8-byte checksum, as in the codec table.
// "grouped": the step's tensors that delta_worth_grouping picks (under
// kGroupBelowElements elements, under kGroupMaxChanges changed) share one stateless
// payload (delta_compress_tensors), as in `arc_v3 diff`; the others have their own.
// "grp sess": one Session over the tensors under kGroupBelowElements (a session's group
// cannot depend on a step's changes), bigger ones a Session each.

struct SessionStep {
  uint64_t elements = 0, changed = 0;
  double bits_b2 = 0;  // bound (b2) of this pair
  double bits_b2_learned = 0;
  uint64_t pairs = 0, pairs_with_history = 0;  // (c) only where every pair has a previous one
  double bits_c = 0;
  uint64_t stateless_bytes = 0, grouped_bytes = 0, session_bytes = 0;
  uint64_t grouped_session_bytes = 0;  // one Session over the grouped tensors
  // Per tensor of the pair: coded in the grouped stateless payload (RunGrouped decides).
  std::vector<bool> in_group;
};

struct SessionResult {
  bool ran = false;
  bool ok = true;
  std::string error;
  std::vector<SessionStep> steps;
  double compress_seconds = 0, decompress_seconds = 0;  // session, 1 thread, one pass
  double grouped_compress_seconds = 0, grouped_decompress_seconds = 0;  // the group calls
  double grouped_session_compress_seconds = 0, grouped_session_decompress_seconds = 0;
  uint64_t grouped_elements = 0, grouped_session_elements = 0;  // in those calls
  // The same for the steps with a history (after the first, which also allocates it).
  double history_compress_seconds = 0, history_decompress_seconds = 0;
  double grouped_history_compress_seconds = 0, grouped_history_decompress_seconds = 0;
  uint64_t history_elements = 0, grouped_history_elements = 0;
  int effort = 0;  // of every payload of the table
};

// A group's tensors and where the receiver rebuilds them: one buffer, back to back as
// in a safetensors file (scattered outputs would cost the library a copy).
struct GroupBuffers {
  std::vector<TensorDelta> tensors;
  std::vector<TensorOut> slots;
  std::vector<uint16_t> out;
  size_t elements = 0;

  void Add(const TensorPair& tensor) {
    tensors.push_back({tensor.prev, tensor.next, tensor.count});
    elements += tensor.count;
  }
  // After the last Add: the slots, their outputs zeroed.
  void Prepare() {
    out.assign(elements, 0);
    slots.clear();
    size_t at = 0;
    for (const TensorDelta& tensor : tensors) {
      slots.push_back({tensor.src, out.data() + at, tensor.count});
      at += tensor.count;
    }
  }
  bool Exact() const {
    for (size_t t = 0; t < tensors.size(); ++t) {
      if (std::memcmp(slots[t].out, tensors[t].dst, 2 * tensors[t].count) != 0) return false;
    }
    return true;
  }
};

// Codes each step's grouped tensors as one stateless payload and the small ones through
// one Session (see above), checks the round trips and adds the payloads to grouped_bytes
// and grouped_session_bytes (the other tensors' payloads are added by RunSessions).
bool RunGrouped(const Dataset& dataset, int effort, SessionResult* result) {
  Options options;
  options.threads = 1;
  options.effort = effort;
  Session sender(options), receiver(options);
  for (size_t p = 0; p < dataset.pairs.size(); ++p) {
    GroupBuffers group, session_group;
    std::vector<bool>& in_group = result->steps[p].in_group;
    for (const TensorPair& tensor : dataset.pairs[p].tensors) {
      in_group.push_back(delta_worth_grouping(tensor.prev, tensor.next, tensor.count));
      if (in_group.back()) group.Add(tensor);
      if (tensor.count < kGroupBelowElements) session_group.Add(tensor);
    }
    if (!group.tensors.empty()) {
      result->grouped_elements += group.elements;
      group.Prepare();
      Delta delta;
      double t0 = NowSeconds();
      const Status compressed =
          delta_compress_tensors(group.tensors.data(), group.tensors.size(), &delta, options);
      result->grouped_compress_seconds += NowSeconds() - t0;
      t0 = NowSeconds();
      const Status decompressed =
          compressed.ok()
              ? delta_decompress_tensors(group.slots.data(), group.slots.size(), delta.bytes.data(),
                                         delta.bytes.size(), delta.checksum, 1)
              : compressed;
      result->grouped_decompress_seconds += NowSeconds() - t0;
      if (!decompressed.ok() || !group.Exact()) {
        result->ok = false;
        result->error = "grouped round trip failed (step pair " + std::to_string(p) +
                        "): " + decompressed.ToString();
        return false;
      }
      result->steps[p].grouped_bytes += delta.bytes.size() + sizeof(delta.checksum);
    }

    if (session_group.tensors.empty()) continue;  // only big tensors: a Session each
    result->grouped_session_elements += session_group.elements;
    session_group.Prepare();
    Delta session_delta;
    double t0 = NowSeconds();
    Status session_status = sender.CompressTensors(session_group.tensors.data(),
                                                   session_group.tensors.size(), &session_delta);
    const double compress_seconds = NowSeconds() - t0;
    result->grouped_session_compress_seconds += compress_seconds;
    if (session_status.ok()) {
      t0 = NowSeconds();
      session_status = receiver.DecompressTensors(
          session_group.slots.data(), session_group.slots.size(), session_delta.bytes.data(),
          session_delta.bytes.size(), session_delta.checksum);
      const double decompress_seconds = NowSeconds() - t0;
      result->grouped_session_decompress_seconds += decompress_seconds;
      if (p > 0) {
        result->grouped_history_compress_seconds += compress_seconds;
        result->grouped_history_decompress_seconds += decompress_seconds;
        result->grouped_history_elements += session_group.elements;
      }
    }
    if (session_status.ok() && !session_group.Exact()) {
      session_status = Status(ErrorCode::kInternal, "wrong weights");
    }
    if (!session_status.ok()) {
      result->ok = false;
      result->error = "grouped session round trip failed (step pair " + std::to_string(p) +
                      "): " + session_status.ToString();
      return false;
    }
    result->steps[p].grouped_session_bytes +=
        session_delta.bytes.size() + sizeof(session_delta.checksum);
  }
  return true;
}

struct DatasetResult {
  std::string name;
  uint64_t params = 0;  // elements per checkpoint
  DeltaStats stats;
  std::vector<CodecResult> codecs;
  SessionResult session;
};

// One (pair, tensor) unit of work.
struct Task {
  size_t pair, tensor;
  size_t out_offset;  // into the pair's output buffer
};

// Saves a failing tensor so the failure can be replayed: its element count (uint64), then
// prev and next as raw BF16 bits, under /tmp/bench_out/.
std::string SaveReproducer(const std::string& codec, const std::string& dataset,
                           const TensorPair& t) {
  std::string name = "repro_" + codec + "_" + dataset + "_" + t.name + ".bin";
  std::replace(name.begin(), name.end(), '/', '_');
  std::error_code ec;
  std::filesystem::create_directories("/tmp/bench_out", ec);
  const std::string path = "/tmp/bench_out/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return "(could not write " + path + ")";
  const uint64_t count = t.count;
  bool ok = std::fwrite(&count, sizeof(count), 1, f) == 1;
  ok = ok && std::fwrite(t.prev, 2, t.count, f) == t.count;
  ok = ok && std::fwrite(t.next, 2, t.count, f) == t.count;
  ok = (std::fclose(f) == 0) && ok;
  return ok ? path + " (uint64 count, prev[count], next[count])" : "(could not write " + path + ")";
}

CodecResult RunCodec(const Codec& codec, const Dataset& dataset, const Flags& flags,
                     size_t workers) {
  CodecResult result;
  result.codec = codec.Name();
  std::vector<Task> tasks;
  std::vector<std::vector<uint16_t>> outputs(dataset.pairs.size());
  uint64_t input_bytes = 0;
  for (size_t p = 0; p < dataset.pairs.size(); ++p) {
    size_t offset = 0;
    for (size_t t = 0; t < dataset.pairs[p].tensors.size(); ++t) {
      tasks.push_back(Task{p, t, offset});
      offset += dataset.pairs[p].tensors[t].count;
    }
    outputs[p].resize(offset);
    input_bytes += 2 * offset;
  }
  // Largest first, so that the parallel runs balance.
  std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& a, const Task& b) {
    return dataset.pairs[a.pair].tensors[a.tensor].count >
           dataset.pairs[b.pair].tensors[b.tensor].count;
  });
  auto view = [&](const Task& task) {
    const TensorPair& t = dataset.pairs[task.pair].tensors[task.tensor];
    return TensorView{t.prev, t.next, t.count, t.rows, t.cols};
  };
  auto tensor_of = [&](const Task& task) -> const TensorPair& {
    return dataset.pairs[task.pair].tensors[task.tensor];
  };

  // Reference pass: payloads, sizes and a bit-exact check of every round trip. It is
  // timed too: a codec slower than the time budget is not run again single-threaded.
  std::vector<std::vector<uint8_t>> payloads(tasks.size());
  const double compress_start = NowSeconds();
  for (size_t k = 0; k < tasks.size(); ++k) {
    if (!codec.Compress(view(tasks[k]), &payloads[k])) {
      result.ok = false;
      result.error = "compress failed on " + tensor_of(tasks[k]).name;
      return result;
    }
    result.payload_bytes += payloads[k].size();
  }
  const double reference_compress = NowSeconds() - compress_start;
  auto decompress_task = [&](size_t k) {
    TensorView v = view(tasks[k]);
    v.next = nullptr;
    return codec.Decompress(v, payloads[k].data(), payloads[k].size(),
                            outputs[tasks[k].pair].data() + tasks[k].out_offset);
  };
  auto verify = [&](const char* when) {
    for (size_t k = 0; k < tasks.size(); ++k) {
      const TensorPair& t = tensor_of(tasks[k]);
      if (std::memcmp(outputs[tasks[k].pair].data() + tasks[k].out_offset, t.next, 2 * t.count) !=
          0) {
        result.ok = false;
        result.error = std::string("round trip not bit-exact (") + when + ") on " + t.name +
                       "; reproducer: " + SaveReproducer(codec.Name(), dataset.name, t);
        return false;
      }
    }
    return true;
  };
  const double decompress_start = NowSeconds();
  for (size_t k = 0; k < tasks.size(); ++k) {
    if (!decompress_task(k)) {
      result.ok = false;
      result.error = "decompress failed on " + tensor_of(tasks[k]).name + "; reproducer: " +
                     SaveReproducer(codec.Name(), dataset.name, tensor_of(tasks[k]));
      return result;
    }
  }
  const double reference_decompress = NowSeconds() - decompress_start;
  if (!verify("first pass")) return result;

  const int reps = flags.quick ? 3 : 5;
  const double budget = flags.quick ? 0.3 : 1.0;
  auto median_1t = [&](double reference, const auto& func) {
    return reference > budget ? reference : MedianSeconds(reps, budget, func);
  };
  auto gbps = [&](double seconds) { return seconds > 0 ? input_bytes / seconds * 1e-9 : 0; };
  std::vector<std::vector<uint8_t>> scratch(workers);
  auto compress_all = [&](size_t num_workers) {
    ParallelFor(tasks.size(), num_workers,
                [&](size_t k, size_t worker) { codec.Compress(view(tasks[k]), &scratch[worker]); });
  };
  std::atomic<bool> decompress_ok{true};
  auto decompress_all = [&](size_t num_workers) {
    ParallelFor(tasks.size(), num_workers, [&](size_t k, size_t) {
      if (!decompress_task(k)) decompress_ok = false;
    });
  };
  result.compress_1t = gbps(median_1t(reference_compress, [&] { compress_all(1); }));
  result.compress_nt = gbps(MedianSeconds(reps, budget, [&] { compress_all(workers); }));
  result.decompress_1t = gbps(median_1t(reference_decompress, [&] { decompress_all(1); }));
  if (!decompress_ok || !verify("timed 1 thread")) return result;
  for (auto& out : outputs) std::fill(out.begin(), out.end(), uint16_t{0});
  result.decompress_nt = gbps(MedianSeconds(reps, budget, [&] { decompress_all(workers); }));
  if (!decompress_ok || !verify("timed all threads")) return result;
  return result;
}

// Each tensor's steps go, in order, through one sender and one receiver Session (default
// format and effort, one thread); every rebuilt tensor is checked bit-exact.
// `pair_stats`: each pair's statistics (AnalyzeDataset), for its bound.
SessionResult RunSessions(const Dataset& dataset, const std::vector<DeltaStats>& pair_stats,
                          int effort) {
  SessionResult result;
  result.ran = true;
  result.steps.resize(dataset.pairs.size());
  for (size_t p = 0; p < dataset.pairs.size(); ++p) {
    result.steps[p].elements = pair_stats[p].elements;
    result.steps[p].changed = pair_stats[p].changed;
    result.steps[p].bits_b2 = pair_stats[p].bits_b2;
    result.steps[p].bits_b2_learned = pair_stats[p].bits_b2_learned;
    result.steps[p].pairs = 1;
    result.steps[p].pairs_with_history = pair_stats[p].pairs_with_history;
    result.steps[p].bits_c = pair_stats[p].bits_c;
  }
  Options options;
  options.threads = 1;
  options.effort = effort;
  result.effort = effort;
  if (!RunGrouped(dataset, effort, &result)) return result;
  std::vector<uint16_t> out;
  const size_t num_tensors = dataset.pairs.front().tensors.size();
  for (size_t t = 0; t < num_tensors; ++t) {
    Session sender(options), receiver(options);
    for (size_t p = 0; p < dataset.pairs.size(); ++p) {
      const std::vector<TensorPair>& tensors = dataset.pairs[p].tensors;
      if (tensors.size() != num_tensors || tensors[t].name != dataset.pairs[0].tensors[t].name) {
        result.ok = false;
        result.error = "the step pairs do not hold the same tensors";
        return result;
      }
      const TensorPair& tensor = tensors[t];
      Delta stateless, delta;
      if (!delta_compress(tensor.prev, tensor.next, tensor.count, &stateless, options).ok()) {
        result.ok = false;
        result.error = "delta_compress failed on " + tensor.name;
        return result;
      }
      double t0 = NowSeconds();
      const Status compressed = sender.Compress(tensor.prev, tensor.next, tensor.count, &delta);
      const double compress_seconds = NowSeconds() - t0;
      result.compress_seconds += compress_seconds;
      out.assign(tensor.count, 0);
      t0 = NowSeconds();
      const Status decompressed =
          compressed.ok() ? receiver.Decompress(tensor.prev, tensor.count, delta.bytes.data(),
                                                delta.bytes.size(), delta.checksum, out.data())
                          : compressed;
      const double decompress_seconds = NowSeconds() - t0;
      result.decompress_seconds += decompress_seconds;
      if (p > 0) {
        result.history_compress_seconds += compress_seconds;
        result.history_decompress_seconds += decompress_seconds;
        result.history_elements += tensor.count;
      }
      if (!decompressed.ok() || std::memcmp(out.data(), tensor.next, 2 * tensor.count) != 0) {
        result.ok = false;
        result.error = "session round trip failed on " + tensor.name + " (step pair " +
                       std::to_string(p) + "): " + decompressed.ToString();
        return result;
      }
      result.steps[p].stateless_bytes += stateless.bytes.size() + sizeof(stateless.checksum);
      if (!result.steps[p].in_group[t]) {
        result.steps[p].grouped_bytes += stateless.bytes.size() + sizeof(stateless.checksum);
      }
      if (tensor.count >= kGroupBelowElements) {
        result.steps[p].grouped_session_bytes += delta.bytes.size() + sizeof(delta.checksum);
      }
      result.steps[p].session_bytes += delta.bytes.size() + sizeof(delta.checksum);
    }
  }
  return result;
}

// ---------------------------------------------------------------------------- kernels

struct KernelResult {
  std::string target;
  std::string kernel;
  double gbps_1t = 0, gbps_nt = 0;
  double of_memcpy_1t = 0, of_memcpy_nt = 0;
};

// Contiguous BF16 buffers for the kernel runs: the first pair of the first dataset,
// repeated up to `elements`.
struct KernelInput {
  std::vector<uint16_t> prev, next;
};

KernelInput MakeKernelInput(const Dataset& dataset, size_t elements) {
  KernelInput in;
  const StepPair& pair = dataset.pairs.front();
  while (in.prev.size() < elements) {
    for (const TensorPair& t : pair.tensors) {
      in.prev.insert(in.prev.end(), t.prev, t.prev + t.count);
      in.next.insert(in.next.end(), t.next, t.next + t.count);
    }
  }
  // A multiple of 8 elements, so that packed-mantissa slices start on byte boundaries.
  const size_t n = std::min(in.prev.size(), elements) / 8 * 8;
  in.prev.resize(n);
  in.next.resize(n);
  return in;
}

std::vector<KernelResult> RunKernels(const KernelInput& in, const Flags& flags, size_t workers) {
  const size_t n = in.prev.size();
  const int reps = flags.quick ? 5 : 9;
  const double budget = flags.quick ? 0.5 : 2.0;
  std::vector<uint16_t> copy(n), xors(n), xors_out(n), out(n);
  std::vector<uint32_t> positions(n);
  std::vector<uint8_t> packed(PackedMantissaBytes(n));
  for (size_t i = 0; i < n; ++i) xors[i] = in.prev[i] ^ in.next[i];
  // The modelled coder's rate sums, and a session history after one step.
  std::vector<uint64_t> rate_sums(n / 4 + 1);
  std::vector<uint8_t> history(n, 0), history_work(n, 0);
  AdvanceHistory(in.prev.data(), in.next.data(), n, history.data());
  const int8_t boosts[8] = {0, -kMaxRateLog, -kMaxRateLog, 2, 2, 2, 2, 2};  // as format 12
  // Slice s of `slices` (a multiple of 8 elements each), for the all-threads runs.
  auto slice = [&](size_t s, size_t slices, size_t* begin, size_t* count) {
    const size_t per = (n / 8 + slices - 1) / slices * 8;
    *begin = std::min(n, s * per);
    *count = std::min(n, *begin + per) - *begin;
  };
  auto run = [&](size_t threads, const auto& kernel) {
    return MedianSeconds(reps, budget, [&] {
      ParallelFor(threads, threads, [&](size_t s, size_t) {
        size_t begin, count;
        slice(s, threads, &begin, &count);
        kernel(s, begin, count);
      });
    });
  };
  auto copy_slice = [&](size_t, size_t b, size_t c) {
    std::memcpy(copy.data() + b, in.prev.data() + b, 2 * c);
  };
  const double memcpy_1t = run(1, copy_slice);
  const double memcpy_nt = run(workers, copy_slice);
  std::vector<KernelResult> results;
  const double bytes = 2.0 * n;
  results.push_back(
      KernelResult{"-", "memcpy", bytes / memcpy_1t * 1e-9, bytes / memcpy_nt * 1e-9, 1, 1});
  // What every decoder that verifies its result does at the least: write the result
  // (here a copy of prev) and hash it, tile by tile as the library's decoder does. A
  // codec without a checksum (the competitors) is bounded by memcpy alone.
  constexpr size_t kHashTile = size_t{1} << 15;
  std::vector<uint64_t> hashes(workers);
  auto copy_hash_slice = [&](size_t s, size_t b, size_t c) {
    XXH3_state_t* state = XXH3_createState();
    XXH3_64bits_reset(state);
    for (size_t t = b; t < b + c; t += kHashTile) {
      const size_t len = std::min(kHashTile, b + c - t);
      std::memcpy(copy.data() + t, in.prev.data() + t, 2 * len);
      XXH3_64bits_update(state, copy.data() + t, 2 * len);
    }
    hashes[s] = XXH3_64bits_digest(state);
    XXH3_freeState(state);
  };
  const double verified_1t = run(1, copy_hash_slice), verified_nt = run(workers, copy_hash_slice);
  results.push_back(KernelResult{"-", "memcpy+XXH3", bytes / verified_1t * 1e-9,
                                 bytes / verified_nt * 1e-9, memcpy_1t / verified_1t,
                                 memcpy_nt / verified_nt});
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  for (const int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string name = hwy::TargetName(target);
    Progress("kernels on " + name);
    auto add = [&](const std::string& kernel, const auto& func) {
      const double t1 = run(1, func), tn = run(workers, func);
      results.push_back(KernelResult{name, kernel, bytes / t1 * 1e-9, bytes / tn * 1e-9,
                                     memcpy_1t / t1, memcpy_nt / tn});
    };
    std::vector<uint64_t> changed(workers);  // per slice, so that the call is not elided
    add("ClassifyChanges", [&](size_t s, size_t b, size_t c) {
      changed[s] = ClassifyChanges(in.prev.data() + b, in.next.data() + b, c).changed;
    });
    add("CompactChanges", [&](size_t, size_t b, size_t c) {
      CompactChanges(in.prev.data() + b, in.next.data() + b, c, positions.data() + b,
                     xors_out.data() + b);
    });
    add("PackMantissas", [&](size_t, size_t b, size_t c) {
      PackMantissas(xors.data() + b, c, packed.data() + b / 8 * 7);
    });
    add("UnpackMantissas", [&](size_t, size_t b, size_t c) {
      UnpackMantissas(packed.data() + b / 8 * 7, c, xors_out.data() + b);
    });
    add("ApplyXor", [&](size_t, size_t b, size_t c) {
      ApplyXor(in.prev.data() + b, xors.data() + b, c, out.data() + b);
    });
    add("GroupRateSums", [&](size_t, size_t b, size_t c) {
      GroupRateSums(in.prev.data() + b, c / 4, /*rate_cap=*/24, rate_sums.data() + b / 4);
    });
    add("HistoryRateSums", [&](size_t, size_t b, size_t c) {
      HistoryRateSums(in.prev.data() + b, history.data() + b, boosts, c / 4, /*rate_cap=*/24,
                      rate_sums.data() + b / 4);
    });
    add("RecentPositions", [&](size_t, size_t b, size_t c) {
      RecentPositions(history.data() + b, c, positions.data() + b);
    });
    add("AdvanceHistory", [&](size_t, size_t b, size_t c) {
      AdvanceHistory(in.prev.data() + b, in.next.data() + b, c, history_work.data() + b);
    });
  }
  hwy::SetSupportedTargetsForTest(0);
  ProgressDone();
  return results;
}

// ---------------------------------------------------------------------------- output

struct Row {
  std::vector<std::string> cells;
};

void PrintTable(const std::vector<std::string>& header, const std::vector<Row>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const Row& r : rows) {
    for (size_t c = 0; c < r.cells.size(); ++c) width[c] = std::max(width[c], r.cells[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < cells.size(); ++c) {
      // First column left-aligned, numbers right-aligned.
      std::printf(c == 0 ? "%-*s" : "  %*s", static_cast<int>(width[c]), cells[c].c_str());
    }
    std::printf("\n");
  };
  line(header);
  size_t total = 0;
  for (size_t w : width) total += w + 2;
  std::printf("%s\n", std::string(total - 2, '-').c_str());
  for (const Row& r : rows) line(r.cells);
}

void PrintDatasetStats(const DatasetResult& d) {
  const DeltaStats& s = d.stats;
  std::printf("\n== %s: %llu params, %llu step pairs, %.3f%% changed per step\n", d.name.c_str(),
              static_cast<unsigned long long>(d.params), static_cast<unsigned long long>(s.pairs),
              100 * s.Density());
  std::printf(
      "   changes: %.2f%% mantissa-only, %.2f%% exponent, %.3f%% sign; |d|=1: %.2f%%; "
      "slope log2 P(change) vs exponent %.3f; P(changed | changed prev) %.2f%% "
      "(| unchanged prev %.3f%%)\n",
      100 * s.OfChanged(s.mantissa_only), 100 * s.OfChanged(s.exponent), 100 * s.OfChanged(s.sign),
      100 * s.OfChanged(s.unit_steps), s.ExponentSlope(), 100 * s.Overlap(),
      100 * s.OverlapUnchanged());
  std::printf("   bounds (%% of BF16): (a) %.3f%%  (b) %.3f%%  (b2) %.3f%%  (b2 learned) %.3f%%",
              s.BitsToPercent(s.bits_a), s.BitsToPercent(s.bits_b), s.BitsToPercent(s.bits_b2),
              s.BitsToPercent(s.bits_b2_learned));
  if (s.pairs_with_history > 0) {
    std::printf("; pairs with a previous pair: (c) %.2f x their (b2)",
                s.bits_b2_with_history > 0 ? s.bits_c / s.bits_b2_with_history : 0.0);
  }
  std::printf("\n\n");
}

// payload / bound (0 when the bound is 0: nothing changed).
double BoundRatio(double bits, double bound_bits) { return bound_bits > 0 ? bits / bound_bits : 0; }
std::string Ratio(double bits, double bound_bits) {
  return Format("%.2f", BoundRatio(bits, bound_bits));
}

double PayloadPercent(const DatasetResult& d, uint64_t bytes) {
  return d.stats.elements ? 100.0 * bytes / (2.0 * d.stats.elements) : 0;
}

void PrintCodecTable(const DatasetResult& d) {
  const DeltaStats& s = d.stats;
  std::vector<Row> rows;
  auto bound_row = [&](const char* name, double bits) {
    rows.push_back(
        Row{{name, Format("%.4f%%", s.BitsToPercent(bits)),
             Format("%.3f", s.changed ? bits / s.changed : 0), Format("%.3f%%", 100 * s.Density()),
             Ratio(bits, s.bits_b), Ratio(bits, s.bits_b2), "", "", "", "", "bound"}});
  };
  bound_row("(a) iid + H(d)", s.bits_a);
  bound_row("(b) p|exp + H(d)", s.bits_b);
  bound_row("(b2) p,d|exp", s.bits_b2);
  bound_row("(b2) learned", s.bits_b2_learned);
  for (const CodecResult& c : d.codecs) {
    if (!c.ok && c.payload_bytes == 0) {
      rows.push_back(Row{{c.codec, "", "", "", "", "", "", "", "", "", "FAILED"}});
      continue;
    }
    const double bits = 8.0 * c.payload_bytes;
    rows.push_back(
        Row{{c.codec, Format("%.4f%%", PayloadPercent(d, c.payload_bytes)),
             Format("%.3f", s.changed ? bits / s.changed : 0), Format("%.3f%%", 100 * s.Density()),
             Ratio(bits, s.bits_b), Ratio(bits, s.bits_b2), Format("%.2f", c.compress_1t),
             Format("%.2f", c.compress_nt), Format("%.2f", c.decompress_1t),
             Format("%.2f", c.decompress_nt), c.ok ? "ok" : "FAILED"}});
  }
  PrintTable({d.name, "payload", "bits/chg", "density", "x(b)", "x(b2)", "C 1T", "C nT", "D 1T",
              "D nT", "exact"},
             rows);
  for (const CodecResult& c : d.codecs) {
    if (!c.ok) std::printf("   %s: %s\n", c.codec.c_str(), c.error.c_str());
  }
}

// Per step pair: the stateless default, the grouped payloads and the session payload
// against that pair's (b2), with the learned (b2) beside it, and the grouped session
// against (c), the bound with the previous step's state.
// The first pair has no history yet (no (c)); "with history" pools the pairs after it.
void PrintSessionTable(const DatasetResult& d) {
  const SessionResult& r = d.session;
  if (!r.ran) return;
  std::printf(
      "\n   per step pair, effort %d: default (one payload per tensor), grouped (small sparse "
      "tensors share one payload: delta_compress_tensors),\n   session mode (arc_v3::Session "
      "per tensor; step k coded with the history of steps 0..k-1), grp sess (one Session "
      "over the small tensors):\n\n",
      r.effort);
  if (!r.ok) {
    std::printf("   FAILED: %s\n", r.error.c_str());
    return;
  }
  std::vector<Row> rows;
  SessionStep all, later;
  auto add = [](SessionStep* to, const SessionStep& step) {
    to->elements += step.elements;
    to->changed += step.changed;
    to->bits_b2 += step.bits_b2;
    to->bits_b2_learned += step.bits_b2_learned;
    to->pairs += step.pairs;
    to->pairs_with_history += step.pairs_with_history;
    to->bits_c += step.bits_c;
    to->stateless_bytes += step.stateless_bytes;
    to->grouped_bytes += step.grouped_bytes;
    to->session_bytes += step.session_bytes;
    to->grouped_session_bytes += step.grouped_session_bytes;
  };
  auto row = [&](const std::string& name, const SessionStep& step) {
    const double bf16 = 2.0 * static_cast<double>(step.elements);
    const bool with_c = step.pairs > 0 && step.pairs_with_history == step.pairs;
    rows.push_back(
        Row{{name, Format("%.3f%%", step.elements ? 100.0 * step.changed / step.elements : 0),
             Format("%.4f%%", bf16 > 0 ? 100.0 * step.bits_b2 / 8 / bf16 : 0),
             Format("%.4f%%", bf16 > 0 ? 100.0 * step.bits_b2_learned / 8 / bf16 : 0),
             with_c ? Format("%.4f%%", bf16 > 0 ? 100.0 * step.bits_c / 8 / bf16 : 0) : "-",
             Format("%.4f%%", bf16 > 0 ? 100.0 * step.stateless_bytes / bf16 : 0),
             Format("%.3f", BoundRatio(8.0 * step.stateless_bytes, step.bits_b2)),
             Format("%.4f%%", bf16 > 0 ? 100.0 * step.grouped_bytes / bf16 : 0),
             Format("%.3f", BoundRatio(8.0 * step.grouped_bytes, step.bits_b2)),
             Format("%.4f%%", bf16 > 0 ? 100.0 * step.session_bytes / bf16 : 0),
             Format("%.3f", BoundRatio(8.0 * step.session_bytes, step.bits_b2)),
             Format("%.4f%%", bf16 > 0 ? 100.0 * step.grouped_session_bytes / bf16 : 0),
             Format("%.3f", BoundRatio(8.0 * step.grouped_session_bytes, step.bits_b2)),
             with_c ? Format("%.3f", BoundRatio(8.0 * step.grouped_session_bytes, step.bits_c))
                    : "-"}});
  };
  for (size_t p = 0; p < r.steps.size(); ++p) {
    row("pair " + std::to_string(p), r.steps[p]);
    add(&all, r.steps[p]);
    if (p > 0) add(&later, r.steps[p]);
  }
  row("all pairs", all);
  if (r.steps.size() > 1) row("with history", later);
  PrintTable({"   " + d.name, "density", "(b2)", "learned", "(c)", "default", "x(b2)", "grouped",
              "x(b2)", "session", "x(b2)", "grp sess", "x(b2)", "x(c)"},
             rows);
  // GB/s of `elements` BF16 values in `seconds` (0 without a measurement).
  const auto speed = [](uint64_t elements, double seconds) {
    return seconds > 0 ? 2.0 * static_cast<double>(elements) / seconds * 1e-9 : 0.0;
  };
  std::printf(
      "   session 1 thread, one pass: compress %.2f GB/s, decompress %.2f GB/s; steps "
      "with history: %.2f, %.2f GB/s\n",
      speed(all.elements, r.compress_seconds), speed(all.elements, r.decompress_seconds),
      speed(r.history_elements, r.history_compress_seconds),
      speed(r.history_elements, r.history_decompress_seconds));
  // Shares of all the steps' elements.
  const auto share = [&all](uint64_t elements) {
    return all.elements > 0 ? 100.0 * static_cast<double>(elements) / all.elements : 0.0;
  };
  std::printf(
      "   grouped (tensors under %zu elements with under %zu changes in one "
      "delta_compress_tensors call per step, %.0f%% of the elements), 1 thread, one pass: "
      "compress %.2f GB/s, decompress %.2f GB/s\n",
      kGroupBelowElements, kGroupMaxChanges, share(r.grouped_elements),
      speed(r.grouped_elements, r.grouped_compress_seconds),
      speed(r.grouped_elements, r.grouped_decompress_seconds));
  std::printf(
      "   grp sess (tensors under %zu elements in one Session, %.0f%% of the elements), "
      "1 thread, one pass: compress %.2f GB/s, decompress %.2f GB/s; steps "
      "with history: %.2f, %.2f GB/s (the first step also allocates the history)\n",
      kGroupBelowElements, share(r.grouped_session_elements),
      speed(r.grouped_session_elements, r.grouped_session_compress_seconds),
      speed(r.grouped_session_elements, r.grouped_session_decompress_seconds),
      speed(r.grouped_history_elements, r.grouped_history_compress_seconds),
      speed(r.grouped_history_elements, r.grouped_history_decompress_seconds));
}

// The closing summary, the README's table: per dataset, arc_v3's payload (% of the BF16
// bytes) beside ARCv3 as published's and the smallest other codec's, bound (b2), arc_v3 /
// (b2), one-thread decode and encode GB/s of arc_v3 against slime_zstd; then, where any
// of arc_v3's other rows (effort levels, ARCv3 as published) is larger than the smallest
// other codec, by how much. "-": the codec did not run (--codecs) or failed.
void PrintHeadline(const std::vector<DatasetResult>& datasets) {
  constexpr char kPeer[] = "slime_zstd";
  std::printf(
      "\n== Headline, the README's table: payload as %% of the BF16 bytes (smaller is "
      "better) of %s (the library's default), %s (ARCv3 as published) and the smallest "
      "other codec; one-thread GB/s\n\n",
      kDefaultCodec, kPublishedCodec);
  std::vector<Row> rows;
  std::vector<std::string> notes;
  for (const DatasetResult& d : datasets) {
    const CodecResult *arc = nullptr, *published = nullptr, *peer = nullptr, *smallest = nullptr;
    for (const CodecResult& c : d.codecs) {
      if (!c.ok) continue;
      if (c.codec == kDefaultCodec) arc = &c;
      if (c.codec == kPublishedCodec) published = &c;
      if (c.codec == kPeer) peer = &c;
      if (!IsArcV3Codec(c.codec) &&
          (smallest == nullptr || c.payload_bytes < smallest->payload_bytes)) {
        smallest = &c;
      }
    }
    const double b2 = d.stats.BitsToPercent(d.stats.bits_b2);
    auto percent = [&](const CodecResult* c) {
      return c ? Format("%.3f%%", PayloadPercent(d, c->payload_bytes)) : std::string("-");
    };
    auto speeds = [&](double CodecResult::*field) {
      return (arc ? Format("%.2f", arc->*field) : "-") + " / " +
             (peer ? Format("%.2f", peer->*field) : "-");
    };
    rows.push_back(Row{
        {d.name, Format("%.2f%%", 100 * d.stats.Density()), percent(arc), percent(published),
         smallest ? percent(smallest) + " (" + smallest->codec + ")" : "-", Format("%.3f%%", b2),
         arc && b2 > 0 ? Format("%.2f", PayloadPercent(d, arc->payload_bytes) / b2) : "-",
         speeds(&CodecResult::decompress_1t), speeds(&CodecResult::compress_1t)}});
    if (smallest == nullptr) continue;
    std::string larger;
    for (const CodecResult& c : d.codecs) {
      if (c.ok && IsArcV3Codec(c.codec) && c.payload_bytes > smallest->payload_bytes) {
        larger += " " + c.codec +
                  Format(" +%.1f%%", 100.0 * c.payload_bytes / smallest->payload_bytes - 100);
      }
    }
    if (!larger.empty()) notes.push_back(d.name + ":" + larger);
  }
  PrintTable(
      {"dataset", "changed", kDefaultCodec, kPublishedCodec, "smallest other", "bound (b2)",
       std::string(kDefaultCodec) + "/(b2)", std::string("decode ") + kDefaultCodec + " / " + kPeer,
       std::string("encode ") + kDefaultCodec + " / " + kPeer},
      rows);
  if (!notes.empty())
    std::printf("   %s's rows larger than the smallest other codec:\n", kDefaultCodec);
  for (const std::string& note : notes) std::printf("     %s\n", note.c_str());
}

nlohmann::json ToJson(const std::vector<DatasetResult>& datasets,
                      const std::vector<KernelResult>& kernels, size_t workers) {
  nlohmann::json root;
  root["arc_v3_version"] = VersionString();
  root["threads_all"] = workers;
  root["active_target"] = ActiveTarget();
  root["throughput_unit"] = "GB/s of BF16 input (median)";
  for (const DatasetResult& d : datasets) {
    const DeltaStats& s = d.stats;
    nlohmann::json j;
    j["name"] = d.name;
    j["params"] = d.params;
    j["pairs"] = s.pairs;
    j["elements"] = s.elements;
    j["changed"] = s.changed;
    j["density"] = s.Density();
    j["mantissa_only_share"] = s.OfChanged(s.mantissa_only);
    j["exponent_share"] = s.OfChanged(s.exponent);
    j["sign_share"] = s.OfChanged(s.sign);
    j["unit_step_share"] = s.OfChanged(s.unit_steps);
    j["exponent_slope"] = s.ExponentSlope();
    if (!std::isnan(s.Overlap())) j["p_changed_given_changed_prev"] = s.Overlap();
    if (s.pairs_with_history > 0)
      j["bound_c_ratio_to_b2"] = BoundRatio(s.bits_c, s.bits_b2_with_history);
    j["bound_percent"] = {{"a", s.BitsToPercent(s.bits_a)},
                          {"b", s.BitsToPercent(s.bits_b)},
                          {"b2", s.BitsToPercent(s.bits_b2)},
                          {"b2_learned", s.BitsToPercent(s.bits_b2_learned)}};
    for (const CodecResult& c : d.codecs) {
      nlohmann::json r;
      r["codec"] = c.codec;
      r["ok"] = c.ok;
      if (!c.ok) r["error"] = c.error;
      r["payload_bytes"] = c.payload_bytes;
      r["payload_percent"] = PayloadPercent(d, c.payload_bytes);
      r["bits_per_change"] = s.changed ? 8.0 * c.payload_bytes / s.changed : 0;
      r["ratio_to_b"] = BoundRatio(8.0 * c.payload_bytes, s.bits_b);
      r["ratio_to_b2"] = BoundRatio(8.0 * c.payload_bytes, s.bits_b2);
      r["compress_gbps_1t"] = c.compress_1t;
      r["compress_gbps_nt"] = c.compress_nt;
      r["decompress_gbps_1t"] = c.decompress_1t;
      r["decompress_gbps_nt"] = c.decompress_nt;
      j["codecs"].push_back(r);
    }
    if (d.session.ran) {
      nlohmann::json session;
      session["ok"] = d.session.ok;
      if (!d.session.ok) session["error"] = d.session.error;
      for (const SessionStep& step : d.session.steps) {
        session["pairs"].push_back(
            {{"elements", step.elements},
             {"changed", step.changed},
             {"bound_b2_bits", step.bits_b2},
             {"bound_b2_learned_bits", step.bits_b2_learned},
             {"bound_c_bits",
              step.pairs_with_history ? nlohmann::json(step.bits_c) : nlohmann::json()},
             {"default_bytes", step.stateless_bytes},
             {"grouped_bytes", step.grouped_bytes},
             {"grouped_session_bytes", step.grouped_session_bytes},
             {"session_bytes", step.session_bytes}});
      }
      j["session"] = session;
    }
    root["datasets"].push_back(j);
  }
  for (const KernelResult& k : kernels) {
    root["kernels"].push_back({{"target", k.target},
                               {"kernel", k.kernel},
                               {"gbps_1t", k.gbps_1t},
                               {"gbps_nt", k.gbps_nt},
                               {"of_memcpy_1t", k.of_memcpy_1t},
                               {"of_memcpy_nt", k.of_memcpy_nt}});
  }
  return root;
}

bool WriteCsv(const std::string& path, const std::vector<DatasetResult>& datasets) {
  std::ofstream out(path);
  out << "dataset,codec,ok,payload_bytes,payload_percent,bits_per_change,density,ratio_to_b,ratio_"
         "to_b2,"
         "compress_gbps_1t,compress_gbps_nt,decompress_gbps_1t,decompress_gbps_nt\n";
  for (const DatasetResult& d : datasets) {
    const DeltaStats& s = d.stats;
    auto bound = [&](const char* name, double bits) {
      out << d.name << "," << name << ",bound," << bits / 8 << "," << s.BitsToPercent(bits) << ","
          << (s.changed ? bits / s.changed : 0) << "," << s.Density() << ","
          << BoundRatio(bits, s.bits_b) << "," << BoundRatio(bits, s.bits_b2) << ",,,,\n";
    };
    bound("bound_a", s.bits_a);
    bound("bound_b", s.bits_b);
    bound("bound_b2", s.bits_b2);
    bound("bound_b2_learned", s.bits_b2_learned);
    for (const CodecResult& c : d.codecs) {
      out << d.name << "," << c.codec << "," << (c.ok ? "ok" : "FAILED") << "," << c.payload_bytes
          << "," << PayloadPercent(d, c.payload_bytes) << ","
          << (s.changed ? 8.0 * c.payload_bytes / s.changed : 0) << "," << s.Density() << ","
          << BoundRatio(8.0 * c.payload_bytes, s.bits_b) << ","
          << BoundRatio(8.0 * c.payload_bytes, s.bits_b2) << "," << c.compress_1t << ","
          << c.compress_nt << "," << c.decompress_1t << "," << c.decompress_nt << "\n";
    }
  }
  return static_cast<bool>(out);
}

// Payload % vs density, one series per codec (and the bound (b2)), log-log, via gnuplot.
void WriteChart(const std::string& png, const std::vector<DatasetResult>& datasets) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::printf("chart skipped: gnuplot not found (Debian: apt-get install gnuplot-nox)\n");
    return;
  }
  std::map<std::string, std::vector<std::pair<double, double>>> series;
  std::vector<std::string> order;
  auto add = [&](const std::string& name, double density, double percent) {
    if (!series.count(name)) order.push_back(name);
    series[name].emplace_back(100 * density, percent);
  };
  for (const DatasetResult& d : datasets) {
    add("bound (b2)", d.stats.Density(), d.stats.BitsToPercent(d.stats.bits_b2));
    for (const CodecResult& c : d.codecs) {
      if (c.ok) add(c.codec, d.stats.Density(), PayloadPercent(d, c.payload_bytes));
    }
  }
  // gnuplot's data and script go to a folder of their own, removed after it ran: the
  // user's folder gets the PNG only.
  std::error_code ec;
  std::string work = (std::filesystem::temp_directory_path(ec) / "arc_bench_chart_XXXXXX").string();
  if (ec || mkdtemp(work.data()) == nullptr) {
    std::printf("chart skipped: cannot create a temporary folder for gnuplot\n");
    return;
  }
  const std::string data = work + "/series.dat", script = work + "/chart.gp";
  // A gnuplot string in single quotes: '' stands for '.
  auto quoted = [](const std::string& text) {
    std::string out = "'";
    for (const char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
    return out + "'";
  };
  std::ofstream dat(data);
  for (const std::string& name : order) {
    auto& points = series[name];
    std::sort(points.begin(), points.end());
    dat << "\"" << name << "\"\n";
    for (const auto& [x, y] : points) dat << x << " " << y << "\n";
    dat << "\n\n";
  }
  dat.close();
  const bool cairo = std::system("gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1") == 0;
  std::ofstream gp(script);
  gp << "set terminal " << (cairo ? "pngcairo size 1200,800 font ',10'" : "png size 1200,800")
     << "\n"
     << "set output " << quoted(png) << "\n"
     << "set title 'BF16 weight-update payload vs density (lower is better)'\n"
     << "set xlabel 'changed values per step (%)'\nset ylabel 'payload (% of BF16 bytes)'\n"
     << "set termoption noenhanced\nset logscale xy\nset grid\nset key outside right top\n"
     << "plot for [i=0:" << order.size() - 1 << "] " << quoted(data)
     << " index i using 1:2 with linespoints lw (i == 0 ? 3 : 1) pt (i % 13 + 1) dashtype i / 8 + "
        "1 title columnheader(1)\n";
  gp.close();
  // The folder's name is mkdtemp's: no quote in it.
  const int rc = std::system(("gnuplot '" + script + "'").c_str());
  std::filesystem::remove_all(work, ec);
  std::printf("chart: %s%s\n", png.c_str(), rc == 0 ? "" : " (gnuplot failed)");
}

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  const size_t workers = WorkerCount(flags.threads, 1 << 20);

  std::vector<std::unique_ptr<Codec>> codecs = AllCodecs();
  if (!flags.codecs.empty()) {
    std::set<std::string> known;
    for (const auto& c : codecs) known.insert(c->Name());
    for (const std::string& name : flags.codecs) {
      if (!known.count(name)) {
        std::string all;
        for (const auto& c : codecs) all += " " + c->Name();
        std::fprintf(stderr, "arc_bench: unknown codec '%s'%s; known:%s\n", name.c_str(),
                     RenamedCodecHint(name).c_str(), all.c_str());
        return 2;
      }
    }
    codecs.erase(std::remove_if(codecs.begin(), codecs.end(),
                                [&](const auto& c) { return !flags.codecs.count(c->Name()); }),
                 codecs.end());
  }

  std::printf(
      "arc_bench: arc_v3 %s, dispatch target %s, %zu threads for nT; throughput in GB/s of BF16 "
      "input\n",
      VersionString(), ActiveTarget(), workers);
  // Datasets are loaded (or generated) one at a time, to keep memory at one dataset.
  struct Source {
    std::string dir;  // empty: generator
    std::string regime;
    double density = 0;
  };
  std::vector<Source> sources;
  for (const std::string& dir : flags.dirs) sources.push_back(Source{dir, "", 0});
  if (flags.generated) {
    if (flags.regimes.count("low")) sources.push_back(Source{"", "gen_low", 0.002});
    if (flags.regimes.count("mid")) sources.push_back(Source{"", "gen_mid", 0.02});
    if (flags.regimes.count("high")) sources.push_back(Source{"", "gen_high", 0.10});
  }
  std::vector<DatasetResult> results;
  std::vector<KernelResult> kernel_results;
  bool failed = false;
  for (size_t si = 0; si < sources.size(); ++si) {
    const Source& source = sources[si];
    Dataset dataset;
    const std::string tag =
        "[" + std::to_string(si + 1) + "/" + std::to_string(sources.size()) + "] ";
    if (source.dir.empty()) {
      Progress(tag + "generating " + source.regime);
      GeneratorOptions options;
      options.params = flags.params;
      options.target_density = source.density;
      options.deltas = flags.deltas;
      GeneratedRun run;
      const double t0 = NowSeconds();
      const Status status = Generate(options, &run);
      if (!status.ok()) {
        std::fprintf(stderr, "arc_bench: generator: %s\n", status.ToString().c_str());
        return 1;
      }
      ProgressDone();
      std::printf("\n%s: generated %zu snapshots in %.1f s (lr %.3g)\n", source.regime.c_str(),
                  run.snapshots.size(), NowSeconds() - t0, run.learning_rate);
      if (!flags.save_generated.empty()) {
        const Status saved =
            WriteSnapshots(flags.save_generated + "/" + source.regime, run.layout, run.snapshots);
        if (!saved.ok()) {
          std::fprintf(stderr, "arc_bench: %s\n", saved.ToString().c_str());
          return 1;
        }
        if (flags.generate_only) {
          std::printf("wrote %s/%s\n", flags.save_generated.c_str(), source.regime.c_str());
          continue;
        }
      }
      dataset = DatasetFromSnapshots(source.regime, run.layout, std::move(run.snapshots));
    } else {
      Progress(tag + "loading " + source.dir);
      const Status status = LoadCheckpointDir(source.dir, &dataset);
      if (!status.ok()) {
        std::fprintf(stderr, "arc_bench: %s\n", status.ToString().c_str());
        return 1;
      }
    }
    DatasetResult d;
    d.name = dataset.name;
    d.params = dataset.pairs.front().Elements();
    Progress(tag + d.name + ": statistics and bounds");
    std::vector<DeltaStats> pair_stats;
    d.stats = AnalyzeDataset(dataset, &pair_stats);
    for (size_t c = 0; c < codecs.size(); ++c) {
      Progress(tag + d.name + ": " + codecs[c]->Name() + " (" + std::to_string(c + 1) + "/" +
               std::to_string(codecs.size()) + ")");
      d.codecs.push_back(RunCodec(*codecs[c], dataset, flags, workers));
      failed = failed || !d.codecs.back().ok;
    }
    if (flags.session) {
      Progress(tag + d.name + ": session mode");
      d.session = RunSessions(dataset, pair_stats, flags.step_effort);
      failed = failed || !d.session.ok;
    }
    ProgressDone();
    PrintDatasetStats(d);
    PrintCodecTable(d);
    PrintSessionTable(d);
    std::fflush(stdout);
    if (flags.kernels && si + 1 == sources.size()) {
      const KernelInput input =
          MakeKernelInput(dataset, flags.quick ? (size_t{1} << 22) : (size_t{1} << 24));
      kernel_results = RunKernels(input, flags, workers);
    }
    results.push_back(std::move(d));
  }

  if (!kernel_results.empty()) {
    std::printf(
        "\n== Speed ceiling: kernels vs memcpy on %zu BF16 values (GB/s of BF16 input; "
        "fraction = memcpy time / kernel time for the same count)\n\n",
        static_cast<size_t>(flags.quick ? (size_t{1} << 22) : (size_t{1} << 24)));
    std::vector<Row> rows;
    for (const KernelResult& k : kernel_results) {
      rows.push_back(
          Row{{k.target, k.kernel, Format("%.2f", k.gbps_1t), Format("%.2f", k.of_memcpy_1t),
               Format("%.2f", k.gbps_nt), Format("%.2f", k.of_memcpy_nt)}});
    }
    PrintTable({"target", "kernel", "GB/s 1T", "x memcpy", "GB/s nT", "x memcpy"}, rows);
  }

  if (flags.generate_only) return 0;
  bool any_file = false;
  for (const std::string* path : {&flags.json, &flags.csv, &flags.chart}) {
    if (!path->empty()) CreateParentDirectory(*path);
    any_file = any_file || !path->empty();
  }
  if (any_file) std::printf("\n");
  if (!flags.json.empty()) {
    std::ofstream out(flags.json);
    out << ToJson(results, kernel_results, workers).dump(1) << "\n";
    if (out) {
      std::printf("json: %s\n", flags.json.c_str());
    } else {
      std::fprintf(stderr, "arc_bench: cannot write %s\n", flags.json.c_str());
    }
  }
  if (!flags.csv.empty()) {
    if (WriteCsv(flags.csv, results)) {
      std::printf("csv: %s\n", flags.csv.c_str());
    } else {
      std::fprintf(stderr, "arc_bench: cannot write %s\n", flags.csv.c_str());
    }
  }
  if (!flags.chart.empty()) WriteChart(flags.chart, results);
  PrintHeadline(results);
  if (failed) {
    std::printf("\nSOME ROUND TRIPS FAILED (see above)\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace arc_v3

int main(int argc, char** argv) { return arc_v3::bench::Main(argc, argv); }
