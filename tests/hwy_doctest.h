// Runs a test body once per compiled-and-supported Highway target (the doctest twin of
// Highway's hwy_gtest.h) and checks that each target expected really ran it. Code inside
// must call the arc_v3:: dispatch wrappers, which follow SetSupportedTargetsForTest; a
// cached HWY_DYNAMIC_POINTER would not.
#ifndef ARC_V3_TESTS_HWY_DOCTEST_H_
#define ARC_V3_TESTS_HWY_DOCTEST_H_

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>

#include "hwy/targets.h"
#include "src/codec/kernels.h"

namespace arc_v3 {
namespace test {

// Names of the targets exercised so far by this binary, printed once at exit so that the
// test log shows every compiled target ran.
inline std::set<std::string>& ExercisedTargets() {
  static std::set<std::string>* targets = new std::set<std::string>;
  static const bool registered = [] {
    std::atexit([] {
      std::string line = "[hwy] targets exercised:";
      for (const std::string& t : *targets) line += " " + t;
      std::printf("%s\n", line.c_str());
    });
    return true;
  }();
  (void)registered;
  return *targets;
}

// Number of ForEachTarget loops run so far by this binary.
inline int& TargetLoops() {
  static int loops = 0;
  return loops;
}

// The targets a per-target loop must run on: every target the CPU supports
// (hwy::SupportedTargets()) that this translation unit compiled (HWY_TARGETS; the library
// is built with the same Highway policy), plus any target named in the environment
// variable ARC_V3_EXPECT_TARGETS (space-separated, e.g. "SVE2 SVE NEON EMU128" under
// qemu's max CPU, from tests/run_neon.sh), which must then be supported and compiled.
inline std::set<std::string> ExpectedTargets() {
  std::set<std::string> expected;
  const int64_t supported = hwy::SupportedTargets() & HWY_TARGETS;
  for (int64_t bit = 1; bit != 0 && bit <= supported; bit <<= 1) {
    if (supported & bit) expected.insert(hwy::TargetName(bit));
  }
  if (const char* named = std::getenv("ARC_V3_EXPECT_TARGETS")) {
    std::istringstream words(named);
    std::string target;
    while (words >> target) expected.insert(target);
  }
  return expected;
}

// Runs `body` once per compiled-and-supported target, and checks that the library's
// dispatch really ran on each target expected (ExpectedTargets): the names recorded are
// those the dispatching wrappers report while the body runs, not the loop's own list.
template <class Body>
void ForEachTarget(const Body& body) {
  struct Reset {  // also when a REQUIRE in the body throws
    ~Reset() { hwy::SetSupportedTargetsForTest(0); }
  } reset;
  hwy::SetSupportedTargetsForTest(0);
  const std::set<std::string> expected = ExpectedTargets();
  std::set<std::string> ran;
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string dispatched = DispatchedTargetName();
    ExercisedTargets().insert(dispatched);
    ran.insert(dispatched);
    INFO("target ", std::string(hwy::TargetName(target)));
    CHECK_MESSAGE(dispatched == hwy::TargetName(target), "the dispatch ran ", dispatched);
    body(hwy::TargetName(target));
  }
  ++TargetLoops();
  std::string want, got;
  for (const std::string& t : expected) want += " " + t;
  for (const std::string& t : ran) got += " " + t;
  CHECK_MESSAGE(ran == expected, "expected to run on:", want, "; ran on:", got);
}

}  // namespace test
}  // namespace arc_v3

#endif  // ARC_V3_TESTS_HWY_DOCTEST_H_
