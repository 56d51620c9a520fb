// Issue #55 prototype bench: the bulk decoder (bulk_decode.h) vs slime_zstd (the
// benchmark's codec, bench/baselines/xor_codecs.cc), memcpy and memcpy+XXH3, on
// arc_bench's three generated regimes, one thread. Run pinned: taskset -c 1.
//   bulk_decode_bench [--params N] [--deltas D] [--reps R] [--only REGIME] [--min]
// Every round trip (all tensors, every pair, three regimes) is checked bit for bit before
// and after the timed passes; a mismatch or a failed decode exits 1.
// "default%" is today's default (codec "arc_v3") on the same data, per tensor, with its
// 8-byte checksums as arc_bench counts them; bd_pay% counts the prototype's payloads
// alone, and the note at the row's end gives them with an 8-byte checksum per tensor.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/codec.h"
#include "bench/prototypes/bulk_decode/bulk_decode.h"
#include "bench/timing.h"

namespace {

namespace bd = arc_v3::bench::bulk_decode;
using arc_v3::bench::Codec;
using arc_v3::bench::TensorView;

struct Task {
  size_t pair;
  size_t offset, count;
  uint64_t rows, cols;
};

const Codec* FindCodec(const std::vector<std::unique_ptr<Codec>>& codecs, const std::string& name) {
  for (const auto& codec : codecs) {
    if (codec->Name() == name) return codec.get();
  }
  std::fprintf(stderr, "bulk_decode_bench: no codec %s in bench/codecs.cc\n", name.c_str());
  std::exit(2);
}

int Usage(const char* message) {
  std::fprintf(stderr,
               "bulk_decode_bench: %s\n"
               "usage: bulk_decode_bench [--params N] [--deltas D] [--reps R] [--only REGIME]\n"
               "  --params N  generator model size (default %" PRIu64
               ")\n"
               "  --deltas D  step pairs per regime (default %d)\n"
               "  --reps R    interleaved timed passes, medians (default 7)\n"
               "  --only R    one regime (gen_low, gen_mid or gen_high)\n"
               "  --min       minima instead of medians (for development on a busy machine)\n",
               message, bd::kDefaultParams, bd::kDefaultDeltas);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t params = bd::kDefaultParams;
  int deltas = bd::kDefaultDeltas, reps = 7;
  std::string only;
  bool use_min = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--min") {
      use_min = true;
      continue;
    }
    if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
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
  bd::Book();
  XXH3_state_t* hs = XXH3_createState();
  bd::Streams st;
  std::printf(
      "bulk_decode_bench: bulk-decode prototype (AVX2+BMI2), K=%d classes, tile %zu, rANS %d "
      "states, scale 2^%d; per tensor, as arc_bench\n",
      bd::K, bd::kTile, bd::kStates, bd::kScaleBits);
  std::printf("%-9s %8s %8s | %7s %7s %6s | %9s %9s %6s | %6s %6s %6s | %6s %6s\n", "regime",
              "changed", "elems", "bd_D", "slimeD", "ratio", "bd_pay%", "default%", "x", "bd_C",
              "slimeC", "ratio", "memcpy", "+XXH3");
  std::vector<std::string> breakdown;
  uint64_t sink = 0;
  for (const bd::RegimeSpec& regime : bd::kRegimes) {
    const char* name = regime.name;
    if (!only.empty() && only != name) continue;
    const arc_v3::bench::GeneratedRun run = bd::GenerateRegime(regime, params, deltas);
    const std::vector<std::vector<uint16_t>>& snaps = run.snapshots;
    const size_t npairs = snaps.size() - 1;
    std::vector<Task> tasks;
    for (size_t p = 0; p < npairs; ++p)
      for (const auto& t : run.layout)
        tasks.push_back(Task{p, t.offset, t.count(), t.rows, t.cols});
    std::stable_sort(tasks.begin(), tasks.end(),
                     [](const Task& a, const Task& b) { return a.count > b.count; });
    auto view = [&](const Task& t, bool with_next) {
      return TensorView{snaps[t.pair].data() + t.offset,
                        with_next ? snaps[t.pair + 1].data() + t.offset : nullptr, t.count, t.rows,
                        t.cols};
    };
    std::vector<std::vector<uint16_t>> outs(npairs, std::vector<uint16_t>(snaps[0].size()));
    // bdp[k] holds bd_size[k] payload bytes and kReadPadding zero bytes (Decode's contract).
    std::vector<std::vector<uint8_t>> bdp(tasks.size()), slp(tasks.size());
    std::vector<size_t> bd_size(tasks.size());
    std::vector<uint64_t> sums(tasks.size());
    bd::EncScratch es;
    size_t elems = 0, changes = 0, bd_bytes = 0, sl_bytes = 0, default_bytes = 0;
    std::vector<uint8_t> payload;
    for (size_t k = 0; k < tasks.size(); ++k) {
      const Task& t = tasks[k];
      const uint16_t* a = snaps[t.pair].data() + t.offset;
      const uint16_t* b = snaps[t.pair + 1].data() + t.offset;
      bd::Encode(a, b, t.count, &bdp[k], &es);
      bd_size[k] = bdp[k].size();
      bd_bytes += bd_size[k];
      bdp[k].resize(bd_size[k] + bd::kReadPadding, 0);
      sums[k] = XXH3_64bits(b, 2 * t.count);
      if (!slime->Compress(view(t, true), &slp[k])) {
        std::printf("slime_zstd: compress failed, regime %s task %zu\n", name, k);
        return 1;
      }
      sl_bytes += slp[k].size();
      if (!arc_default->Compress(view(t, true), &payload)) {
        std::printf("%s: compress failed, regime %s task %zu\n", arc_default->Name().c_str(), name,
                    k);
        return 1;
      }
      default_bytes += payload.size();
      elems += t.count;
      for (size_t i = 0; i < t.count; ++i) changes += a[i] != b[i];
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
    auto bd_decode = [&](auto mode_tag, auto hash_tag, auto sel_tag) {
      constexpr bd::Mode kMode = decltype(mode_tag)::value;
      constexpr bool kHash = decltype(hash_tag)::value;
      constexpr bd::SelectKind kSel = decltype(sel_tag)::value;
      for (size_t k = 0; k < tasks.size(); ++k) {
        const Task& t = tasks[k];
        const bool ok = bd::Decode<kMode, kHash, kSel>(
            snaps[t.pair].data() + t.offset, t.count, bdp[k].data(), bd_size[k],
            outs[t.pair].data() + t.offset, sums[k], hs, &st, &sink);
        if (!ok && (kMode == bd::kFull || kMode == bd::kStreamsOnly)) {
          std::printf("decode failed regime %s task %zu size %zu count %zu\n", name, k, bd_size[k],
                      t.count);
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
    using MFull = std::integral_constant<bd::Mode, bd::kFull>;
    using MPass = std::integral_constant<bd::Mode, bd::kPassOnly>;
    using MStreams = std::integral_constant<bd::Mode, bd::kStreamsOnly>;
    using MNoApply = std::integral_constant<bd::Mode, bd::kNoApply>;
    using MNoSelect = std::integral_constant<bd::Mode, bd::kNoSelect>;
    using MExpNoScan = std::integral_constant<bd::Mode, bd::kExpandNoScan>;
    using S2 = std::integral_constant<bd::SelectKind, bd::kSelect2>;
    using SX = std::integral_constant<bd::SelectKind, bd::kExpand>;
    bd_decode(MFull(), T(), S2());
    check("bd");
    bd_decode(MFull(), F(), S2());
    check("bd nohash");
    bd_decode(MFull(), T(), SX());
    check("bd expand");
    if (!slime_decode()) {
      std::printf("slime_zstd: decompress failed, regime %s\n", name);
      return 1;
    }
    check("slime");
    enum {
      kFullH,
      kFullNoHash,
      kPassH,
      kPassNoHash,
      kStreams,
      kNoSel,
      kNoApp,
      kExpH,
      kExpNoHash,
      kExpNoScan,
      kSlimeD,
      kMemcpy,
      kMemcpyHash,
      kBdC,
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
      timeit(kFullH, [&] { bd_decode(MFull(), T(), S2()); });
      timeit(kStreams, [&] { bd_decode(MStreams(), F(), S2()); });
      timeit(kFullNoHash, [&] { bd_decode(MFull(), F(), S2()); });
      timeit(kNoSel, [&] { bd_decode(MNoSelect(), F(), S2()); });
      timeit(kNoApp, [&] { bd_decode(MNoApply(), F(), S2()); });
      timeit(kExpH, [&] { bd_decode(MFull(), T(), SX()); });
      timeit(kExpNoHash, [&] { bd_decode(MFull(), F(), SX()); });
      timeit(kExpNoScan, [&] { bd_decode(MExpNoScan(), F(), SX()); });
      timeit(kPassH, [&] { bd_decode(MPass(), T(), S2()); });
      timeit(kPassNoHash, [&] { bd_decode(MPass(), F(), S2()); });
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
        timeit(kBdC, [&] {
          for (const Task& t : tasks) {
            bd::Encode(snaps[t.pair].data() + t.offset, snaps[t.pair + 1].data() + t.offset,
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
    bd_decode(MFull(), T(), S2());
    check("bd after timing");
    bd_decode(MFull(), T(), SX());
    check("bd expand after timing");
    double med[kN];
    for (int v = 0; v < kN; ++v) {
      std::vector<double> x = tm[v];
      std::sort(x.begin(), x.end());
      med[v] = use_min ? x[0] : x[x.size() / 2];
    }
    const double bytes = 2.0 * elems;
    auto gbs = [&](int v) { return bytes / med[v] * 1e-9; };
    auto nse = [&](int v) { return med[v] / elems * 1e9; };
    auto nsc = [&](double sec) { return sec / changes * 1e9; };
    const double pay = 100.0 * bd_bytes / bytes;
    const double default_pct = 100.0 * default_bytes / bytes;
    const double pay_sums = 100.0 * (bd_bytes + 8.0 * tasks.size()) / bytes;
    std::printf(
        "%-9s %7.4f%% %8zu | %7.2f %7.2f %5.2fx | %8.4f%% %8.4f%% %5.3fx | %6.2f %6.2f %5.2fx | "
        "%6.2f %6.2f"
        "   (slime payload %.4f%%; bd with 8 B checksums %.4f%% = %.3fx)\n",
        name, 100.0 * changes / elems, elems / npairs, gbs(kFullH), gbs(kSlimeD),
        gbs(kFullH) / gbs(kSlimeD), pay, default_pct, pay / default_pct, gbs(kBdC), gbs(kSlimeC),
        gbs(kBdC) / gbs(kSlimeC), gbs(kMemcpy), gbs(kMemcpyHash), 100.0 * sl_bytes / bytes,
        pay_sums, pay_sums / default_pct);
    std::fflush(stdout);
    const double budget = nsc(med[kSlimeD] - med[kMemcpyHash]);
    // Classes with changes, averaged over the coded tensors (the expand runs once per such
    // class and word).
    double active_sum = 0;
    size_t coded = 0;
    for (size_t k = 0; k < tasks.size(); ++k) {
      if (!bd_size[k]) continue;
      int a = 0;
      for (int c = 0; c < bd::K; ++c) a += bdp[k][1 + c] != bd::kInactive;
      active_sum += double(a) * double(tasks[k].count);
      coded += tasks[k].count;
    }
    const double active = coded ? active_sum / double(coded) : 0;
    char line[3072];
    std::snprintf(
        line, sizeof line,
        "%-9s ns/element: bd full %.3f | bd no-hash %.3f | class pass+copy %.3f (+XXH3 %.3f) | "
        "memcpy %.3f | memcpy+XXH3 %.3f | slime %.3f\n"
        "          per change (%zu changes), budget (slime - memcpy+XXH3) %.2f ns: whole decode "
        "over memcpy+XXH3 %.2f ns\n"
        "          stages: class pass over memcpy %.3f ns/el (%.2f ns/chg) | entropy %.2f ns/chg | "
        "select tables %.3f ns/el (%.2f ns/chg)"
        " | select %.2f ns/chg | apply %.2f ns/chg | XXH3 %.3f ns/el (%.2f ns/chg)\n"
        "          expand instead of select: decode %.2f GB/s (%.2fx slime), over memcpy+XXH3 %.2f "
        "ns/chg | expand %.3f ns/el"
        " (%.1f classes with changes: %.4f ns/el/class; %.2f ns/chg) | positions (tzcnt loop) + "
        "merge + apply %.2f ns/chg\n",
        name, nse(kFullH), nse(kFullNoHash), nse(kPassNoHash), nse(kPassH), nse(kMemcpy),
        nse(kMemcpyHash), nse(kSlimeD), changes, budget, nsc(med[kFullH] - med[kMemcpyHash]),
        nse(kPassNoHash) - nse(kMemcpy), nsc(med[kPassNoHash] - med[kMemcpy]), nsc(med[kStreams]),
        nse(kNoSel) - nse(kPassNoHash) - nse(kStreams),
        nsc(med[kNoSel] - med[kPassNoHash] - med[kStreams]), nsc(med[kNoApp] - med[kNoSel]),
        nsc(med[kFullNoHash] - med[kNoApp]), nse(kFullH) - nse(kFullNoHash),
        nsc(med[kFullH] - med[kFullNoHash]), gbs(kExpH), gbs(kExpH) / gbs(kSlimeD),
        nsc(med[kExpH] - med[kMemcpyHash]), nse(kExpNoScan) - nse(kPassNoHash) - nse(kStreams),
        active, (nse(kExpNoScan) - nse(kPassNoHash) - nse(kStreams)) / active,
        nsc(med[kExpNoScan] - med[kPassNoHash] - med[kStreams]),
        nsc(med[kExpNoHash] - med[kExpNoScan]));
    breakdown.push_back(line);
  }
  std::printf("\nbreakdown (medians of %d interleaved passes):\n", reps);
  for (const std::string& l : breakdown) std::printf("%s", l.c_str());
  std::printf("all round trips verified bit for bit (sink %" PRIu64 ")\n", sink & 1);
  XXH3_freeState(hs);
  return 0;
}
