// Runs a test body once per compiled-and-supported Highway target (the doctest twin of
// Highway's hwy_gtest.h). Code inside must call the arc_v3:: dispatch wrappers, which
// follow SetSupportedTargetsForTest; a cached HWY_DYNAMIC_POINTER would not.
#ifndef ARC_V3_TESTS_HWY_DOCTEST_H_
#define ARC_V3_TESTS_HWY_DOCTEST_H_

#include <doctest/doctest.h>

#include <cstdio>
#include <set>
#include <string>

#include "hwy/targets.h"

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

template <class Body>
void ForEachTarget(const Body& body) {
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    ExercisedTargets().insert(hwy::TargetName(target));
    INFO("target ", std::string(hwy::TargetName(target)));
    body(hwy::TargetName(target));
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace test
}  // namespace arc_v3

#endif  // ARC_V3_TESTS_HWY_DOCTEST_H_
