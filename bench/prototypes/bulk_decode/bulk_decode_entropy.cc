// Entropy estimates for issue #55's payload choices, per tensor, on arc_bench's three
// generated regimes: positions as i.i.d. changes within K exponent classes (member-rank
// space, K = 1 is plain element space), positions as element-space gaps with an empirical
// log2-bucket table, and values (+1, -1, escape) with or without the exponent class as
// context, and the 8 classes merged into 2-4 position groups by change rate (the values
// keeping 8). Compared with today's default payload on the same data. An estimate only:
// nothing is coded.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "bench/bf16.h"
#include "bench/codec.h"
#include "bench/prototypes/bulk_decode/bulk_decode.h"

namespace bd = arc_v3::bench::bulk_decode;
using arc_v3::bench::ExponentField;
using arc_v3::bench::MonotoneKey;

namespace {

double H2(double p) {
  return p <= 0 || p >= 1 ? 0 : -(p * std::log2(p) + (1 - p) * std::log2(1 - p));
}
double Ent(const std::vector<double>& h) {  // total bits of an empirical order-0 code
  double s = 0, b = 0;
  for (double x : h) s += x;
  for (double x : h)
    if (x > 0) b -= x * std::log2(x / s);
  return b;
}

}  // namespace

int main() {
  const auto codecs = arc_v3::bench::AllCodecs();
  const arc_v3::bench::Codec* def = nullptr;
  for (const auto& c : codecs)
    if (c->Name() == arc_v3::bench::kDefaultCodec) def = c.get();
  for (const bd::RegimeSpec& regime : bd::kRegimes) {
    const arc_v3::bench::GeneratedRun run =
        bd::GenerateRegime(regime, bd::kDefaultParams, bd::kDefaultDeltas);
    size_t total = 0, changes = 0, def_bytes = 0;
    const int Ks[5] = {1, 2, 3, 4, 8};
    double merged[3] = {0};  // the 8 classes merged into 2, 3, 4 groups by change rate
    double posK[5] = {0}, gapbucket = 0, val_glob = 0, val_cls = 0, esc_raw = 0, nesc = 0;
    std::vector<uint8_t> payload;
    for (size_t p = 0; p + 1 < run.snapshots.size(); ++p) {
      for (const auto& t : run.layout) {
        const uint16_t* a = run.snapshots[p].data() + t.offset;
        const uint16_t* b = run.snapshots[p + 1].data() + t.offset;
        const arc_v3::bench::TensorView tv{a, b, t.count(), t.rows, t.cols};
        def->Compress(tv, &payload);
        def_bytes += payload.size();
        std::vector<double> n(256), k(256);
        std::vector<double> tern_g(3), esc_g(32);
        std::vector<std::vector<double>> tern_c(8, std::vector<double>(3));
        std::vector<double> buckets(40);
        size_t last = 0;
        bool any = false;
        size_t tk = 0;
        for (size_t i = 0; i < t.count(); ++i) {
          n[ExponentField(a[i])]++;
          if (a[i] != b[i]) {
            k[ExponentField(a[i])]++;
            tk++;
          }
        }
        total += t.count();
        changes += tk;
        if (!tk) continue;
        // best e0 for K = 8 (value context)
        int e0v = 0;
        double bestv = 1e300;
        for (int e0 = 0; e0 < 256; ++e0) {
          double nc[8] = {0}, kc[8] = {0};
          for (int e = 0; e < 256; ++e) {
            const int c = std::clamp(e - e0, 0, 7);
            nc[c] += n[e];
            kc[c] += k[e];
          }
          double bits = 0;
          for (int c = 0; c < 8; ++c) bits += nc[c] * H2(kc[c] / nc[c] > 0 ? kc[c] / nc[c] : 0);
          if (bits < bestv) {
            bestv = bits;
            e0v = e0;
          }
        }
        for (size_t i = 0; i < t.count(); ++i) {
          if (a[i] == b[i]) continue;
          const size_t g = any ? i - last - 1 : i;
          any = true;
          last = i;
          buckets[g ? 64 - __builtin_clzll(g) : 0]++;  // bucket = bit length; raw bits = length - 1
          if (g > 1) gapbucket += 63 - __builtin_clzll(g);
          const int d = MonotoneKey(b[i]) - MonotoneKey(a[i]);
          const int s = d == 1 ? 0 : d == -1 ? 1 : 2;
          tern_g[s]++;
          tern_c[std::clamp(ExponentField(a[i]) - e0v, 0, 7)][s]++;
          if (s == 2) {
            const int j = 31 - __builtin_clz(unsigned(std::abs(d)));
            esc_g[2 * j + (d < 0)]++;
            esc_raw += j;
            nesc++;
          }
        }
        gapbucket += Ent(buckets) + 8 * 12;  // table: about 12 bytes
        val_glob += Ent(tern_g) + 16;
        for (auto& h : tern_c) val_cls += Ent(h) + 2;
        val_cls += 8;
        const double esc_bits = Ent(esc_g) + esc_raw;  // shared by both value models
        val_glob += esc_bits;
        val_cls += esc_bits;
        esc_raw = 0;
        {  // best grouping of the K = 8 classes (e0 of the values) into G groups, contiguous in
           // rate
          double nc[8] = {0}, kc[8] = {0};
          for (int e = 0; e < 256; ++e) {
            const int c = std::clamp(e - e0v, 0, 7);
            nc[c] += n[e];
            kc[c] += k[e];
          }
          int ord[8] = {0, 1, 2, 3, 4, 5, 6, 7};
          std::sort(ord, ord + 8, [&](int x, int y) {
            return (nc[x] ? kc[x] / nc[x] : 0) < (nc[y] ? kc[y] / nc[y] : 0);
          });
          auto cost = [&](int i, int j) {  // classes ord[i..j) as one group
            double members = 0, changed = 0;
            for (int q = i; q < j; ++q) {
              members += nc[ord[q]];
              changed += kc[ord[q]];
            }
            return members * H2(members ? changed / members : 0);
          };
          for (int G = 2; G <= 4; ++G) {
            double dp[9][5];
            for (auto& row : dp)
              for (double& x : row) x = 1e300;
            dp[0][0] = 0;
            for (int j = 1; j <= 8; ++j)
              for (int g = 1; g <= G; ++g)
                for (int i = 0; i < j; ++i)
                  dp[j][g] = std::min(dp[j][g], dp[i][g - 1] + cost(i, j));
            merged[G - 2] += dp[8][G] + 8 * 8 + 8 + 8;  // + one byte per class, e0, the grouping
          }
        }
        for (int ki = 0; ki < 5; ++ki) {
          const int K = Ks[ki];
          double best = 1e300;
          for (int e0 = 0; e0 < 256; ++e0) {
            std::vector<double> nc(K), kc(K);
            for (int e = 0; e < 256; ++e) {
              const int c = std::clamp(e - e0, 0, K - 1);
              nc[c] += n[e];
              kc[c] += k[e];
            }
            double bits = 0;
            for (int c = 0; c < K; ++c)
              if (nc[c]) bits += nc[c] * H2(kc[c] / nc[c]);
            best = std::min(best, bits);
            if (K == 1) break;
          }
          posK[ki] += best + K * 8 + 8;
        }
      }
    }
    const double bytes = 2.0 * total, def_pct = 100.0 * def_bytes / bytes;
    std::printf(
        "%s: %zu tensors, %zu elements/pair, density %.4f%%, escapes %.2f%% of changes; default "
        "payload %.4f%%\n",
        regime.name, run.layout.size(), total / (run.snapshots.size() - 1), 100.0 * changes / total,
        100.0 * nesc / changes, def_pct);
    auto pct = [&](double bits) { return 100.0 * bits / 8 / bytes; };
    for (int ki = 0; ki < 5; ++ki)
      std::printf("  positions, %d class%s (i.i.d. per class): %.4f%% (%.2f b/change)\n", Ks[ki],
                  Ks[ki] > 1 ? "es" : "  ", pct(posK[ki]), posK[ki] / changes);
    for (int G = 2; G <= 4; ++G)
      std::printf(
          "  positions, the 8 classes merged into %d groups by change rate: %.4f%% (%.2f "
          "b/change)\n",
          G, pct(merged[G - 2]), merged[G - 2] / changes);
    std::printf("  positions, element gaps, log2 buckets + raw bits: %.4f%% (%.2f b/change)\n",
                pct(gapbucket), gapbucket / changes);
    std::printf(
        "  values: tensor-global %.4f%% (%.2f b/change), class context (K=8) %.4f%% (%.2f "
        "b/change)\n",
        pct(val_glob), val_glob / changes, pct(val_cls), val_cls / changes);
    for (int ki : {0, 3, 4})
      std::printf("  total K=%d positions + class-context values: %.4f%% = %.3fx default\n", Ks[ki],
                  pct(posK[ki] + val_cls), pct(posK[ki] + val_cls) / def_pct);
    std::printf("  total element gaps (buckets) + class-context values: %.4f%% = %.3fx default\n",
                pct(gapbucket + val_cls), pct(gapbucket + val_cls) / def_pct);
  }
  return 0;
}
