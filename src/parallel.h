// A minimal fork-join loop over independent tasks (chunks). Threads are started per
// call: chunks are large (1M elements by default), so the start-up cost is negligible.
#ifndef ARC_V3_SRC_PARALLEL_H_
#define ARC_V3_SRC_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace arc_v3 {

// Number of workers to use for `num_tasks` tasks when the caller asked for `threads`
// (0 = all hardware threads).
inline size_t WorkerCount(int threads, size_t num_tasks) {
  size_t workers = threads > 0 ? static_cast<size_t>(threads)
                               : std::max<size_t>(1, std::thread::hardware_concurrency());
  return std::max<size_t>(1, std::min(workers, num_tasks));
}

// Calls func(task, worker) for every task in [0, num_tasks) on `num_workers` threads
// (the caller's thread is worker 0). Tasks are handed out in order.
template <class Func>
void ParallelFor(size_t num_tasks, size_t num_workers, const Func& func) {
  if (num_workers <= 1) {
    for (size_t task = 0; task < num_tasks; ++task) func(task, size_t{0});
    return;
  }
  std::atomic<size_t> next{0};
  auto work = [&](size_t worker) {
    for (size_t task = next++; task < num_tasks; task = next++) func(task, worker);
  };
  std::vector<std::thread> threads;
  threads.reserve(num_workers - 1);
  for (size_t w = 1; w < num_workers; ++w) {
    try {
      threads.emplace_back(work, w);
    } catch (...) {
      break;  // the threads we have finish the work
    }
  }
  work(0);
  for (std::thread& t : threads) t.join();
}

}  // namespace arc_v3

#endif  // ARC_V3_SRC_PARALLEL_H_
