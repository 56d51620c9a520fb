// Decode-only loop of the bulk-decode prototype, for perf record / perf annotate:
//   bulk_decode_perf <regime 0|1|2> <seconds> [expand|streams]
// streams: the entropy stage alone (DecodeStreams), reported per change.
// Regime 0, 1, 2 = gen_low, gen_mid, gen_high (4M parameters, first pair, per tensor, as
// bulk_decode_bench). Exits 1 if a decode fails (malformed payload or wrong checksum).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/prototypes/bulk_decode/bulk_decode.h"
#include "bench/timing.h"

namespace bd = arc_v3::bench::bulk_decode;

int main(int argc, char** argv) {
  const int ri = argc >= 3 ? std::atoi(argv[1]) : -1;
  const double secs = argc >= 3 ? std::atof(argv[2]) : 0;
  const bool expand = argc >= 4 && std::strcmp(argv[3], "expand") == 0;
  const bool streams = argc >= 4 && std::strcmp(argv[3], "streams") == 0;
  if (ri < 0 || ri > 2 || !(secs > 0)) {
    std::fprintf(stderr, "usage: bulk_decode_perf <regime 0|1|2> <seconds> [expand]\n");
    return 2;
  }
  const arc_v3::bench::GeneratedRun run =
      bd::GenerateRegime(bd::kRegimes[ri], bd::kDefaultParams, 1);
  const std::vector<uint16_t>& a = run.snapshots[0];
  const std::vector<uint16_t>& b = run.snapshots[1];
  std::vector<std::vector<uint8_t>> pay(run.layout.size());
  std::vector<size_t> size(run.layout.size());
  std::vector<uint64_t> sums(run.layout.size());
  bd::EncScratch es;
  for (size_t k = 0; k < run.layout.size(); ++k) {
    const auto& t = run.layout[k];
    bd::Encode(a.data() + t.offset, b.data() + t.offset, t.count(), &pay[k], &es);
    size[k] = pay[k].size();
    pay[k].resize(size[k] + bd::kReadPadding, 0);
    sums[k] = XXH3_64bits(b.data() + t.offset, 2 * t.count());
  }
  std::vector<uint16_t> out(a.size());
  XXH3_state_t* hs = XXH3_createState();
  bd::Streams st;
  const double t0 = arc_v3::bench::NowSeconds();
  long passes = 0;
  while (arc_v3::bench::NowSeconds() - t0 < secs) {
    for (size_t k = 0; k < run.layout.size(); ++k) {
      const auto& t = run.layout[k];
      if (streams) {
        if (size[k] && !bd::DecodeStreams(pay[k].data(), size[k], &st)) {
          std::fprintf(stderr, "streams failed, tensor %zu\n", k);
          return 1;
        }
        continue;
      }
      const bool ok = expand ? bd::Decode<bd::kFull, true, bd::kExpand>(
                                   a.data() + t.offset, t.count(), pay[k].data(), size[k],
                                   out.data() + t.offset, sums[k], hs, &st)
                             : bd::Decode<bd::kFull, true, bd::kSelect2>(
                                   a.data() + t.offset, t.count(), pay[k].data(), size[k],
                                   out.data() + t.offset, sums[k], hs, &st);
      if (!ok) {
        std::fprintf(stderr, "decode failed, tensor %zu\n", k);
        return 1;
      }
    }
    ++passes;
  }
  const double dt = arc_v3::bench::NowSeconds() - t0;
  size_t changes = 0;
  for (size_t i = 0; i < a.size(); ++i) changes += a[i] != b[i];
  std::printf("%ld passes, %.3f ns/element, %.2f ns/change\n", passes,
              dt / passes / double(a.size()) * 1e9, dt / passes / double(changes) * 1e9);
  XXH3_freeState(hs);
  return 0;
}
