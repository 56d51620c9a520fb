// Issue #43 prototype bench: the class-gap codec (class_gap.h) vs slime_zstd (the
// benchmark's codec, bench/baselines/xor_codecs.cc), memcpy and memcpy+XXH3, on
// arc_bench's three generated regimes, one thread. Run pinned: taskset -c 1.
//   class_gap_bench [--params N] [--deltas D] [--reps R] [--concat]
// --concat: each pair's flat snapshot (all tensors concatenated) is ONE tensor.
// Every round trip (all tensors, every pair, three regimes) is checked bit for bit before
// and after the timed passes; a mismatch exits 1.
// "default%" is today's default (the codec "arc_v3": default format and effort) on the
// same data, per tensor, counting its 8-byte checksum per tensor as arc_bench does; cg_pay%
// counts the class-gap payloads alone (its checksums are in the note at the row's end).
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/codec.h"
#include "bench/prototypes/class_gap/class_gap.h"
#include "bench/timing.h"

namespace {

namespace cg = arc_v3::bench::class_gap;
using arc_v3::bench::Codec;
using arc_v3::bench::TensorView;

// One coded tensor: a tensor of the model (or a whole snapshot with --concat) in one pair.
struct Task {
  size_t pair;
  size_t offset, count;
  uint64_t rows, cols;
};

const Codec* FindCodec(const std::vector<std::unique_ptr<Codec>>& codecs, const std::string& name) {
  for (const auto& codec : codecs) {
    if (codec->Name() == name) return codec.get();
  }
  std::fprintf(stderr, "class_gap_bench: no codec %s in bench/codecs.cc\n", name.c_str());
  std::exit(2);
}

int Usage(const char* message) {
  std::fprintf(stderr,
               "class_gap_bench: %s\n"
               "usage: class_gap_bench [--params N] [--deltas D] [--reps R] [--concat]\n"
               "  --params N  generator model size (default %" PRIu64
               ")\n"
               "  --deltas D  step pairs per regime (default %d)\n"
               "  --reps R    interleaved timed passes, medians (default 7)\n"
               "  --concat    code each pair's whole snapshot as one tensor\n",
               message, cg::kDefaultParams, cg::kDefaultDeltas);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t params = cg::kDefaultParams;
  int deltas = cg::kDefaultDeltas, reps = 7;
  bool concat = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--concat") {
      concat = true;
      continue;
    }
    if (a != "--params" && a != "--deltas" && a != "--reps")
      return Usage(("unknown option " + a).c_str());
    if (i + 1 >= argc) return Usage((a + " needs a value").c_str());
    char* rest = nullptr;
    const unsigned long long v = std::strtoull(argv[++i], &rest, 10);
    if (*rest != '\0' || v < 1 || (a != "--params" && v > 1000000))
      return Usage((a + ": bad value").c_str());
    if (a == "--params")
      params = v;
    else if (a == "--deltas")
      deltas = int(v);
    else
      reps = int(v);
  }
  const std::vector<std::unique_ptr<Codec>> codecs = arc_v3::bench::AllCodecs();
  const Codec* slime = FindCodec(codecs, "slime_zstd");
  const Codec* arc_default = FindCodec(codecs, arc_v3::bench::kDefaultCodec);
  cg::Book();
  XXH3_state_t* hs = XXH3_createState();
  std::printf(
      "class_gap_bench: class-gap prototype, K=%d classes, tile %zu, rANS 2+2 states "
      "(values/gaps), scale 2^%d; %s\n",
      cg::K, cg::kTile, cg::kScaleBits,
      concat ? "one tensor per pair (concatenated)" : "per tensor, as arc_bench");
  std::printf("%-9s %8s %8s | %7s %7s %6s | %9s %9s %6s | %6s %6s %6s | %6s %6s\n", "regime",
              "changed", "elems", "cg_D", "slimeD", "ratio", "cg_pay%", "default%", "x", "cg_C",
              "slimeC", "ratio", "memcpy", "+XXH3");
  std::vector<std::string> breakdown;
  for (const cg::RegimeSpec& regime : cg::kRegimes) {
    const char* name = regime.name;
    const arc_v3::bench::GeneratedRun run = cg::GenerateRegime(regime, params, deltas);
    const std::vector<std::vector<uint16_t>>& snaps = run.snapshots;
    const size_t npairs = snaps.size() - 1;
    std::vector<Task> tasks;
    for (size_t p = 0; p < npairs; ++p) {
      if (concat)
        tasks.push_back(Task{p, 0, snaps[p].size(), snaps[p].size(), 1});
      else
        for (const auto& t : run.layout)
          tasks.push_back(Task{p, t.offset, t.count(), t.rows, t.cols});
    }
    std::stable_sort(tasks.begin(), tasks.end(),
                     [](const Task& a, const Task& b) { return a.count > b.count; });
    auto view = [&](const Task& t, bool with_next) {
      return TensorView{snaps[t.pair].data() + t.offset,
                        with_next ? snaps[t.pair + 1].data() + t.offset : nullptr, t.count, t.rows,
                        t.cols};
    };
    std::vector<std::vector<uint16_t>> outs(npairs, std::vector<uint16_t>(snaps[0].size()));
    // cgp[k] holds cg_size[k] payload bytes and kReadPadding zero bytes (Decode's contract).
    std::vector<std::vector<uint8_t>> cgp(tasks.size()), slp(tasks.size());
    std::vector<size_t> cg_size(tasks.size());
    std::vector<uint64_t> sums(tasks.size());
    cg::EncScratch es;
    size_t elems = 0, changes = 0, cg_bytes = 0, sl_bytes = 0;
    for (size_t k = 0; k < tasks.size(); ++k) {
      const Task& t = tasks[k];
      const uint16_t* a = snaps[t.pair].data() + t.offset;
      const uint16_t* b = snaps[t.pair + 1].data() + t.offset;
      cg::Encode(a, b, t.count, &cgp[k], &es);
      cg_size[k] = cgp[k].size();
      cg_bytes += cg_size[k];
      cgp[k].resize(cg_size[k] + cg::kReadPadding, 0);
      sums[k] = XXH3_64bits(b, 2 * t.count);
      if (!slime->Compress(view(t, true), &slp[k])) {
        std::printf("slime_zstd: compress failed, regime %s task %zu\n", name, k);
        return 1;
      }
      sl_bytes += slp[k].size();
      elems += t.count;
      for (size_t i = 0; i < t.count; ++i) changes += a[i] != b[i];
    }
    // Today's default, per tensor whatever --concat says (as the model is coded today).
    size_t default_bytes = 0;
    {
      std::vector<uint8_t> payload;
      for (size_t p = 0; p < npairs; ++p) {
        for (const auto& t : run.layout) {
          const TensorView tv{snaps[p].data() + t.offset, snaps[p + 1].data() + t.offset, t.count(),
                              t.rows, t.cols};
          if (!arc_default->Compress(tv, &payload)) {
            std::printf("%s: compress failed, regime %s tensor %s\n", arc_default->Name().c_str(),
                        name, t.name.c_str());
            return 1;
          }
          default_bytes += payload.size();
        }
      }
    }
    auto check = [&](const char* what) {
      for (size_t k = 0; k < tasks.size(); ++k) {
        const Task& t = tasks[k];
        if (std::memcmp(outs[t.pair].data() + t.offset, snaps[t.pair + 1].data() + t.offset,
                        2 * t.count)) {
          std::printf("MISMATCH %s regime %s task %zu\n", what, name, k);
          std::exit(1);
        }
      }
      for (auto& o : outs) std::fill(o.begin(), o.end(), uint16_t(0xFFFF));
    };
    auto cg_decode = [&](auto walk, auto hash) {
      constexpr bool kWalk = decltype(walk)::value, kHash = decltype(hash)::value;
      for (size_t k = 0; k < tasks.size(); ++k) {
        const Task& t = tasks[k];
        const bool ok =
            cg::Decode<kWalk, kHash>(snaps[t.pair].data() + t.offset, t.count, cgp[k].data(),
                                     cg_size[k], outs[t.pair].data() + t.offset, sums[k], hs);
        if (!ok && kWalk) {
          std::printf("decode failed regime %s task %zu size %zu count %zu pair %zu off %zu\n",
                      name, k, cg_size[k], t.count, t.pair, t.offset);
          std::exit(1);
        }
      }
    };
    auto slime_decode = [&]() {
      bool ok = true;
      for (size_t k = 0; k < tasks.size(); ++k) {
        const Task& t = tasks[k];
        ok &= slime->Decompress(view(t, false), slp[k].data(), slp[k].size(),
                                outs[t.pair].data() + t.offset);
      }
      return ok;
    };
    using T = std::true_type;
    using F = std::false_type;
    cg_decode(T(), T());
    check("cg");
    cg_decode(T(), F());
    check("cg nohash");
    if (!slime_decode()) {
      std::printf("slime_zstd: decompress failed, regime %s\n", name);
      return 1;
    }
    check("slime");
    // Timed: every variant once per rep, interleaved; medians.
    enum {
      kEntropyOnly,
      kFull,
      kFullNoHash,
      kPass,
      kPassNoHash,
      kSlimeD,
      kMemcpy,
      kMemcpyHash,
      kCgC,
      kSlimeC,
      kN
    };
    std::vector<std::vector<double>> tm(kN);
    auto timeit = [&](int v, const auto& f) {
      const double t0 = arc_v3::bench::NowSeconds();
      f();
      tm[v].push_back(arc_v3::bench::NowSeconds() - t0);
    };
    std::vector<uint8_t> scratch;
    for (int rep = 0; rep < reps; ++rep) {
      timeit(kFull, [&] { cg_decode(T(), T()); });
      timeit(kEntropyOnly, [&] {  // class pass + copy + entropy decode, no select/scatter, no hash
        for (size_t k = 0; k < tasks.size(); ++k) {
          const Task& t = tasks[k];
          cg::Decode<true, false, false>(snaps[t.pair].data() + t.offset, t.count, cgp[k].data(),
                                         cg_size[k], outs[t.pair].data() + t.offset, sums[k], hs);
        }
      });
      timeit(kFullNoHash, [&] { cg_decode(T(), F()); });
      timeit(kPass, [&] { cg_decode(F(), T()); });
      timeit(kPassNoHash, [&] { cg_decode(F(), F()); });
      timeit(kSlimeD, [&] { slime_decode(); });
      timeit(kMemcpy, [&] {
        for (const Task& t : tasks)
          std::memcpy(outs[t.pair].data() + t.offset, snaps[t.pair].data() + t.offset, 2 * t.count);
      });
      timeit(
          kMemcpyHash,
          [&] {  // as arc_bench's memcpy+XXH3 row: copy + XXH3 update tile by tile (32K elements)
            for (const Task& t : tasks) {
              XXH3_64bits_reset(hs);
              for (size_t i = 0; i < t.count; i += 32768) {
                const size_t n = std::min<size_t>(32768, t.count - i);
                std::memcpy(outs[t.pair].data() + t.offset + i, snaps[t.pair].data() + t.offset + i,
                            2 * n);
                XXH3_64bits_update(hs, outs[t.pair].data() + t.offset + i, 2 * n);
              }
              volatile uint64_t h = XXH3_64bits_digest(hs);
              (void)h;
            }
          });
      if (rep < 5) {
        timeit(kCgC, [&] {
          for (const Task& t : tasks) {
            cg::Encode(snaps[t.pair].data() + t.offset, snaps[t.pair + 1].data() + t.offset,
                       t.count, &scratch, &es);
            volatile uint64_t h =
                XXH3_64bits(snaps[t.pair + 1].data() + t.offset, 2 * t.count);  // the checksum
            (void)h;
          }
        });
        timeit(kSlimeC, [&] {
          for (const Task& t : tasks) slime->Compress(view(t, true), &scratch);
        });
      }
    }
    cg_decode(T(), T());
    check("cg after timing");
    double med[kN];
    for (int v = 0; v < kN; ++v) {
      std::vector<double> x = tm[v];
      std::sort(x.begin(), x.end());
      med[v] = x[x.size() / 2];
    }
    const double bytes = 2.0 * elems;
    auto gbs = [&](int v) { return bytes / med[v] * 1e-9; };
    auto nse = [&](int v) { return med[v] / elems * 1e9; };
    const double pay = 100.0 * cg_bytes / bytes;
    const double default_pct = 100.0 * default_bytes / bytes;
    const double pay_sums = 100.0 * (cg_bytes + 8.0 * tasks.size()) / bytes;
    std::printf(
        "%-9s %7.4f%% %8zu | %7.2f %7.2f %5.2fx | %8.4f%% %8.4f%% %5.3fx | %6.2f %6.2f %5.2fx | "
        "%6.2f %6.2f"
        "   (slime payload %.4f%%; cg with 8 B checksums %.4f%% = %.3fx)\n",
        name, 100.0 * changes / elems, elems / npairs, gbs(kFull), gbs(kSlimeD),
        gbs(kFull) / gbs(kSlimeD), pay, default_pct, pay / default_pct, gbs(kCgC), gbs(kSlimeC),
        gbs(kCgC) / gbs(kSlimeC), gbs(kMemcpy), gbs(kMemcpyHash), 100.0 * sl_bytes / bytes,
        pay_sums, pay_sums / default_pct);
    char line[1024];
    std::snprintf(
        line, sizeof line,
        "%-9s ns/element: cg full %.3f | class pass+copy %.3f | +XXH3 %.3f | cg no-hash %.3f | "
        "memcpy %.3f | memcpy+XXH3 %.3f | slime %.3f\n"
        "          per change (%zu changes): entropy+select+scatter %.2f ns (full - pass, with "
        "hash), %.2f ns (no hash); "
        "hash %.3f ns/el; pass over memcpy %.3f ns/el; budget to match slime: %.3f ns/el\n"
        "          per change: entropy decode alone %.2f ns, select+scatter %.2f ns\n",
        name, nse(kFull), nse(kPassNoHash), nse(kPass), nse(kFullNoHash), nse(kMemcpy),
        nse(kMemcpyHash), nse(kSlimeD), changes, (med[kFull] - med[kPass]) / changes * 1e9,
        (med[kFullNoHash] - med[kPassNoHash]) / changes * 1e9, nse(kPass) - nse(kPassNoHash),
        nse(kPassNoHash) - nse(kMemcpy), nse(kSlimeD),
        (med[kEntropyOnly] - med[kPassNoHash]) / changes * 1e9,
        (med[kFullNoHash] - med[kEntropyOnly]) / changes * 1e9);
    breakdown.push_back(line);
  }
  std::printf("\nbreakdown (medians of %d interleaved passes):\n", reps);
  for (const std::string& l : breakdown) std::printf("%s", l.c_str());
  std::printf("all round trips verified bit for bit\n");
  XXH3_freeState(hs);
  return 0;
}
