// Empirical entropy of the class-gap model (class_gap.h), per tensor, on arc_bench's three
// generated regimes (4M parameters, 2 pairs): positions as per-class i.i.d. changes for
// K = 2..16 classes c = clamp(e - e0, 0, K-1) with the best e0 per tensor (plus one byte
// per class and e0), values as a 3-way (+1, -1, escape) distribution with escape bits.
// An estimate only: no payload is coded.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/prototypes/class_gap/class_gap.h"

namespace cg = arc_v3::bench::class_gap;
using arc_v3::bench::ExponentField;
using arc_v3::bench::MonotoneKey;

namespace {

double BinaryEntropy(double p) {
  return p <= 0 || p >= 1 ? 0 : -(p * std::log2(p) + (1 - p) * std::log2(1 - p));
}

}  // namespace

int main() {
  for (const cg::RegimeSpec& regime : cg::kRegimes) {
    const arc_v3::bench::GeneratedRun run =
        cg::GenerateRegime(regime, cg::kDefaultParams, cg::kDefaultDeltas);
    size_t total = 0, changes = 0;
    double bitsK[5] = {0}, valbits = 0, valbits_cls = 0;
    const int Ks[5] = {2, 4, 8, 12, 16};
    size_t small = 0;
    for (size_t p = 0; p + 1 < run.snapshots.size(); ++p) {
      for (const auto& t : run.layout) {
        const uint16_t* a = run.snapshots[p].data() + t.offset;
        const uint16_t* b = run.snapshots[p + 1].data() + t.offset;
        std::vector<double> n(256), k(256), vp(256), vm(256), ve(256), escb(256);
        for (size_t i = 0; i < t.count(); ++i) {
          const int e = ExponentField(a[i]);
          n[e]++;
          if (a[i] != b[i]) {
            k[e]++;
            const int d = MonotoneKey(b[i]) - MonotoneKey(a[i]);
            if (d == 1)
              vp[e]++;
            else if (d == -1)
              vm[e]++;
            else {
              ve[e]++;
              const int j = 31 - __builtin_clz(unsigned(std::abs(d)));
              escb[e] += j + 1 + 2;
            }
          }
        }
        total += t.count();
        for (int e = 0; e < 256; ++e) changes += size_t(k[e]);
        if (p == 0 && t.count() < 100000) small++;  // tensors of the model, not per pair
        for (int ki = 0; ki < 5; ++ki) {
          const int classes = Ks[ki];
          double best = 1e300;
          for (int e0 = 0; e0 < 256; ++e0) {
            std::vector<double> nc(classes), kc(classes);
            for (int e = 0; e < 256; ++e) {
              const int c = std::clamp(e - e0, 0, classes - 1);
              nc[c] += n[e];
              kc[c] += k[e];
            }
            double bits = 0;
            for (int c = 0; c < classes; ++c)
              if (nc[c]) bits += nc[c] * BinaryEntropy(kc[c] / nc[c]);
            best = std::min(best, bits);
          }
          bitsK[ki] += best + classes * 8 + 8;  // + one byte per class and e0
        }
        // values: global (+1,-1,esc) distribution per tensor, and per exponent
        double P = 0, M = 0, E = 0, EB = 0;
        for (int e = 0; e < 256; ++e) {
          P += vp[e];
          M += vm[e];
          E += ve[e];
          EB += escb[e];
          const double s = vp[e] + vm[e] + ve[e];
          for (double x : {vp[e], vm[e], ve[e]})
            if (x) valbits_cls -= x * std::log2(x / s);
          valbits_cls += escb[e];
        }
        const double s = P + M + E;
        for (double x : {P, M, E})
          if (x) valbits -= x * std::log2(x / s);
        valbits += EB;
      }
    }
    std::printf("%s: %zu tensors (%zu < 100k), %zu elements/pair, density %.4f%%\n", regime.name,
                run.layout.size(), small, total / (run.snapshots.size() - 1),
                100.0 * changes / total);
    for (int ki = 0; ki < 5; ++ki)
      std::printf("  K=%2d positions %.4f%%  (bits/change %.2f)\n", Ks[ki],
                  100 * bitsK[ki] / 16 / total, bitsK[ki] / changes);
    std::printf(
        "  values (tensor-global 3-way + escape bits) %.4f%% (%.2f b/ch); per-exponent 3-way "
        "%.4f%% (%.2f b/ch, no table cost)\n",
        100 * valbits / 16 / total, valbits / changes, 100 * valbits_cls / 16 / total,
        valbits_cls / changes);
  }
  return 0;
}
