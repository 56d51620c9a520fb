// The benchmark's one timing helper: median wall time of repeated runs.
#ifndef ARC_V3_BENCH_TIMING_H_
#define ARC_V3_BENCH_TIMING_H_

#include <algorithm>
#include <chrono>
#include <vector>

namespace arc_v3 {
namespace bench {

inline double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs `func` at least once and at most `max_reps` times, stopping early once
// `budget_seconds` have been spent (slow codecs on big inputs), and returns the median
// duration of one run in seconds.
template <class Func>
double MedianSeconds(int max_reps, double budget_seconds, const Func& func) {
  std::vector<double> times;
  const double start = NowSeconds();
  for (int rep = 0; rep < std::max(1, max_reps); ++rep) {
    const double t0 = NowSeconds();
    func();
    times.push_back(NowSeconds() - t0);
    if (NowSeconds() - start > budget_seconds) break;
  }
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  return n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
}

}  // namespace bench
}  // namespace arc_v3

#endif  // ARC_V3_BENCH_TIMING_H_
