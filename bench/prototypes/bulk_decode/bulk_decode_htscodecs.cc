// Per-call cost of Debian's htscodecs order-0 rANS (libhtscodecs-dev 1.3.0, 4-way and
// RANS_ORDER_X32) on the stream sizes the bulk decoder has: one stream per class and
// tensor or per class and tile (a 16384-element tile at 2% changed holds ~330 changes,
// ~40 per class). Symbols are i.i.d. bytes from the prototype's two models: ternary
// values (+1, -1, escape: 0.445 / 0.445 / 0.11) and coarse gaps (geometric, ratio 0.7,
// 16 symbols). For each stream size: decode ns per symbol (median of 9 passes over
// ~2 M symbols cut into streams of that size) and bytes per call over the ideal.
//   bulk_decode_htscodecs   (run pinned: taskset -c 1)
#include <htscodecs/rANS_static4x16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench/timing.h"

int main() {
  std::mt19937_64 rng(1);
  struct Model {
    const char* name;
    std::vector<double> p;
  };
  std::vector<Model> models = {{"ternary values", {0.445, 0.445, 0.11}}, {"coarse gaps", {}}};
  for (int s = 0; s < 16; ++s)
    models[1].p.push_back(s < 15 ? std::pow(0.7, s) * 0.3 : std::pow(0.7, 15));
  const size_t kTotal = 2'000'000;
  std::printf(
      "htscodecs %s order-0 rANS, one thread; ns per decoded symbol and bytes per call over the "
      "entropy\n",
      "1.3.0");
  std::printf("%-15s %8s | %10s %10s | %12s %12s\n", "model", "stream", "4x16 ns/s", "X32 ns/s",
              "4x16 B/call", "X32 B/call");
  for (const Model& m : models) {
    double h = 0;
    for (double q : m.p)
      if (q > 0) h -= q * std::log2(q);
    std::discrete_distribution<int> dist(m.p.begin(), m.p.end());
    std::vector<uint8_t> all(kTotal);
    for (uint8_t& b : all) b = uint8_t(dist(rng));
    for (size_t n : {40, 330, 1650, 3300, 33000, 330000}) {
      const size_t streams = kTotal / n;
      double ns[2], over[2];
      for (int v = 0; v < 2; ++v) {
        const int order = v ? RANS_ORDER_X32 : 0;
        std::vector<std::vector<uint8_t>> enc(streams);
        size_t bytes = 0;
        for (size_t k = 0; k < streams; ++k) {
          unsigned int out_size = 0;
          unsigned char* c = rans_compress_4x16(all.data() + k * n, unsigned(n), &out_size, order);
          if (!c) {
            std::fprintf(stderr, "compress failed\n");
            return 1;
          }
          enc[k].assign(c, c + out_size);
          std::free(c);
          bytes += out_size;
        }
        std::vector<uint8_t> out(n);
        std::vector<double> times;
        for (int rep = 0; rep < 9; ++rep) {
          const double t0 = arc_v3::bench::NowSeconds();
          for (size_t k = 0; k < streams; ++k) {
            unsigned int out_size = unsigned(n);
            if (!rans_uncompress_to_4x16(enc[k].data(), unsigned(enc[k].size()), out.data(),
                                         &out_size) ||
                out_size != n) {
              std::fprintf(stderr, "decode failed\n");
              return 1;
            }
            if (rep == 0 && !std::equal(out.begin(), out.end(), all.begin() + k * n)) {
              std::fprintf(stderr, "mismatch\n");
              return 1;
            }
          }
          times.push_back(arc_v3::bench::NowSeconds() - t0);
        }
        std::sort(times.begin(), times.end());
        ns[v] = times[4] / double(streams * n) * 1e9;
        over[v] = (double(bytes) - h * double(streams * n) / 8) / double(streams);
      }
      std::printf("%-15s %8zu | %10.2f %10.2f | %12.1f %12.1f\n", m.name, n, ns[0], ns[1], over[0],
                  over[1]);
    }
  }
  return 0;
}
