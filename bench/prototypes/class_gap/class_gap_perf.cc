// Decode-only loop of the class-gap prototype, for perf record / perf annotate:
//   class_gap_perf <regime 0|1|2> <seconds>
// Regime 0, 1, 2 = gen_low, gen_mid, gen_high (4M parameters, first pair, per tensor, as
// class_gap_bench). Exits 1 if a decode fails (malformed payload or wrong checksum).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/prototypes/class_gap/class_gap.h"
#include "bench/timing.h"

namespace cg = arc_v3::bench::class_gap;

int main(int argc, char** argv) {
  const int ri = argc == 3 ? std::atoi(argv[1]) : -1;
  const double secs = argc == 3 ? std::atof(argv[2]) : 0;
  if (ri < 0 || ri > 2 || !(secs > 0)) {
    std::fprintf(stderr, "usage: class_gap_perf <regime 0|1|2> <seconds>\n");
    return 2;
  }
  const arc_v3::bench::GeneratedRun run =
      cg::GenerateRegime(cg::kRegimes[ri], cg::kDefaultParams, cg::kDefaultDeltas);
  const std::vector<uint16_t>& prev = run.snapshots[0];
  const std::vector<uint16_t>& next = run.snapshots[1];
  struct Coded {
    const uint16_t* base;
    size_t count;
    std::vector<uint8_t> payload;  // size bytes, then kReadPadding zero bytes
    size_t size;
    uint64_t sum;
    uint16_t* out;
  };
  std::vector<Coded> coded;
  std::vector<uint16_t> out(prev.size());
  cg::EncScratch es;
  for (const auto& t : run.layout) {
    Coded c{prev.data() + t.offset, t.count(), {}, 0, 0, out.data() + t.offset};
    cg::Encode(c.base, next.data() + t.offset, c.count, &c.payload, &es);
    c.size = c.payload.size();
    c.payload.resize(c.size + cg::kReadPadding, 0);
    c.sum = XXH3_64bits(next.data() + t.offset, 2 * c.count);
    coded.push_back(std::move(c));
  }
  XXH3_state_t* hs = XXH3_createState();
  const double t0 = arc_v3::bench::NowSeconds();
  int it = 0;
  while (arc_v3::bench::NowSeconds() - t0 < secs) {
    for (const Coded& c : coded) {
      if (!cg::Decode<true, true>(c.base, c.count, c.payload.data(), c.size, c.out, c.sum, hs))
        return 1;
    }
    ++it;
  }
  std::printf("%d iters, %.3f ns/el\n", it,
              (arc_v3::bench::NowSeconds() - t0) / it / prev.size() * 1e9);
  XXH3_freeState(hs);
  return 0;
}
