// A minimal fork-join loop over independent tasks (chunks). Threads are started per
// call: chunks are large (1M elements by default), so the start-up cost is negligible.
#ifndef ARC_V3_SRC_COMMON_PARALLEL_H_
#define ARC_V3_SRC_COMMON_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "arc_v3.hpp"

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
// An exception thrown by func (std::bad_alloc included) stops the handing out of tasks;
// once every worker has stopped, the caller rethrows the one of the lowest task.
template <class Func>
void ParallelFor(size_t num_tasks, size_t num_workers, const Func& func) {
  if (num_workers <= 1) {
    for (size_t task = 0; task < num_tasks; ++task) func(task, size_t{0});
    return;
  }
  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::exception_ptr error;
  size_t error_task = num_tasks;
  auto work = [&](size_t worker) {
    for (size_t task = next++; task < num_tasks; task = next++) {
      try {
        func(task, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (task < error_task) {
          error_task = task;
          error = std::current_exception();
        }
        next = num_tasks;  // hand out no more tasks
      }
    }
  };
  std::vector<std::thread> threads;
  try {
    threads.reserve(num_workers - 1);
    for (size_t w = 1; w < num_workers; ++w) threads.emplace_back(work, w);
  } catch (...) {
    // The threads we have finish the work.
  }
  work(0);
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

// Runs body() (returning Status) and turns what it throws into a Status: std::bad_alloc
// into kOutOfMemory, other exceptions into kInternal.
template <class Body>
Status StatusOrCaught(const Body& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, "out of memory");
  } catch (const std::exception& e) {
    return Status(ErrorCode::kInternal, e.what());
  }
}

// ParallelFor, returning what func throws as StatusOrCaught does.
template <class Func>
Status TryParallelFor(size_t num_tasks, size_t num_workers, const Func& func) {
  return StatusOrCaught([&] {
    ParallelFor(num_tasks, num_workers, func);
    return Status::Ok();
  });
}

// The error of a parallel run's first failing task in task order, so that the error
// reported does not depend on the thread count: tasks after a failure are skipped
// (Skip), tasks before it still run. Set ignores an ok status.
class FirstError {
 public:
  void Set(size_t task, const Status& s) {
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (task < first_task_) {
      first_task_ = task;
      status_ = s;
    }
  }
  bool Skip(size_t task) {
    std::lock_guard<std::mutex> lock(mutex_);
    return task > first_task_;
  }
  bool failed() {
    std::lock_guard<std::mutex> lock(mutex_);
    return !status_.ok();
  }
  Status status() {
    std::lock_guard<std::mutex> lock(mutex_);
    return status_;
  }

 private:
  std::mutex mutex_;
  Status status_;
  size_t first_task_ = SIZE_MAX;
};

}  // namespace arc_v3

#endif  // ARC_V3_SRC_COMMON_PARALLEL_H_
