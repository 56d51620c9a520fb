// A rollout engine's memory while its Follower applies one step: peak resident memory over
// what it held before, per changed element. Pulls step FROM of STORE (the anchor route),
// then step TO by the chain, and prints one JSON line.
//   follow_memory STORE [--from 0] [--to 1] [--threads N] [--fetch-ahead BYTES]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "arc_v3_sync.hpp"

namespace {

// A field of /proc/self/status in bytes (VmRSS, VmHWM).
uint64_t Status(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::strtoull(line.c_str() + n + 1, nullptr, 10) * 1024;
    }
  }
  return 0;
}

int Fail(const arc_v3::Status& s, const char* what) {
  std::fprintf(stderr, "follow_memory: %s: %s\n", what, s.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(
        stderr,
        "usage: follow_memory STORE [--from 0] [--to 1] [--threads N] [--fetch-ahead BYTES]\n");
    return 2;
  }
  const std::string store = argv[1];
  uint64_t from = 0, to = 1;
  arc_v3::FollowerOptions options;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    const uint64_t value = std::strtoull(argv[i + 1], nullptr, 10);
    if (arg == "--from") {
      from = value;
    } else if (arg == "--to") {
      to = value;
    } else if (arg == "--threads") {
      options.threads = static_cast<int>(value);
    } else if (arg == "--fetch-ahead") {
      options.fetch_ahead_bytes = value;
    } else {
      std::fprintf(stderr, "follow_memory: unknown option %s\n", arg.c_str());
      return 2;
    }
  }
  std::unique_ptr<arc_v3::Follower> follower;
  arc_v3::Status s = arc_v3::Follower::Open(store, options, &follower);
  if (!s.ok()) return Fail(s, "open");
  arc_v3::FollowResult first, next;
  s = follower->Pull(from, &first);
  if (!s.ok()) return Fail(s, "first pull");
  uint64_t model = 0;
  for (const arc_v3::FollowedTensor& t : follower->tensors()) {
    uint64_t elements = 1;
    for (uint64_t d : t.shape) elements *= d;
    model += elements / (t.shape.empty() ? 1 : t.shape[0]) * (t.row_end - t.row_begin) *
             (t.dtype == "F32" || t.dtype == "I32"   ? 4
              : t.dtype == "F64" || t.dtype == "I64" ? 8
                                                     : 2);
  }
  const uint64_t held = Status("VmRSS");
  {
    std::ofstream reset("/proc/self/clear_refs");
    reset << "5";  // VmHWM starts again from VmRSS
  }
  s = follower->Pull(to, &next);
  if (!s.ok()) return Fail(s, "second pull");
  const uint64_t peak = Status("VmHWM");
  std::printf(
      "{\"model_bytes\": %llu, \"held_rss\": %llu, \"peak_rss\": %llu, \"route\": \"%s\", "
      "\"changed_elements\": "
      "%llu, \"undo_bytes\": %llu, \"fetched_bytes\": %llu, \"requests\": %llu, \"seconds\": "
      "%.3f}\n",
      static_cast<unsigned long long>(model), static_cast<unsigned long long>(held),
      static_cast<unsigned long long>(peak), next.route.c_str(),
      static_cast<unsigned long long>(next.changed_elements),
      static_cast<unsigned long long>(next.undo_bytes),
      static_cast<unsigned long long>(next.fetched_bytes),
      static_cast<unsigned long long>(next.requests), next.total_seconds);
  return 0;
}
