// The clocks reports and documents use. Internal to the library.
#ifndef ARC_V3_SRC_COMMON_CLOCK_H_
#define ARC_V3_SRC_COMMON_CLOCK_H_

#include <chrono>

namespace arc_v3 {

// Seconds of steady time since `start`: durations in reports.
inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Seconds since the Unix epoch: times written into documents (publish and commit times).
inline double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace arc_v3

#endif  // ARC_V3_SRC_COMMON_CLOCK_H_
