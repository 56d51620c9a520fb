// checkpoint_bench: times `arc_v3 diff` + `arc_v3 apply` of a checkpoint pair end to end
// (temporary files under $TMPDIR) and checks the rebuilt checkpoint byte for byte. The
// codec alone: arc_bench.
//
//   bazel run //bench:checkpoint_bench -- PREV NEXT [-r 5] [-T N] [-e 0..3] [--scaling]
//       [--no-sync] [--no-group] [--json]
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "arc_v3.hpp"
#include "src/checkpoint/checkpoint_delta.h"
#include "src/checkpoint/container.h"
#include "src/common/parallel.h"

namespace arc_v3 {
namespace {

namespace fs = std::filesystem;
using checkpoint::RunOptions;
using checkpoint::RunReport;
using Json = nlohmann::ordered_json;

constexpr int kExitOk = 0, kExitError = 1, kExitUsage = 2;

struct Common {
  int threads = 0;
  int effort = RunOptions().effort;
  bool json = false;
  bool no_sync = false;
  bool no_group = false;
};

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof(text), u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
  return text;
}

// Byte-compares two checkpoints (files or directories with the same file names).
bool SameCheckpoint(const std::string& a, const std::string& b, std::string* why) {
  std::vector<std::pair<std::string, std::string>> pairs;
  std::error_code ec;
  if (fs::is_directory(a, ec)) {
    for (const auto& e : fs::directory_iterator(a, ec)) {
      if (e.is_regular_file())
        pairs.emplace_back(e.path().string(), (fs::path(b) / e.path().filename()).string());
    }
  } else {
    pairs.emplace_back(a, b);
  }
  for (const auto& p : pairs) {
    std::unique_ptr<checkpoint::MappedFile> x, y;
    if (!checkpoint::MappedFile::Open(p.first, &x).ok() ||
        !checkpoint::MappedFile::Open(p.second, &y).ok() || x->size() != y->size() ||
        (x->size() && std::memcmp(x->data(), y->data(), x->size()) != 0)) {
      *why = p.first + " differs from " + p.second;
      return false;
    }
  }
  return true;
}

// Diff and apply times of one thread count, in seconds.
struct BenchTimes {
  size_t threads = 0;
  std::vector<double> diff, apply;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Best(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

// Times diff and apply `repeats` times at the requested thread count and, with `scaling`,
// at one thread too. The thread counts alternate run by run so that a shared machine's
// drift hits them alike; medians are reported, and their ratio is the speed-up.
// Runs diff (PREV -> NEXT into `delta`) then apply (into `out`) `repeats` times per thread
// count, alternating the counts, into `times`; `r` is the last run's report.
Status BenchRuns(const std::string& prev, const std::string& next, const std::string& delta,
                 const std::string& out, const Common& c, int repeats,
                 std::vector<BenchTimes>* times, RunReport* r) {
  std::error_code ec;
  for (int i = 0; i < repeats; ++i) {
    for (BenchTimes& t : *times) {
      RunOptions o;
      o.threads = t.threads;
      o.effort = c.effort;
      o.sync = !c.no_sync;
      o.group = !c.no_group;
      auto t0 = std::chrono::steady_clock::now();
      const Status s = checkpoint::Diff(prev, next, delta, o, r);
      t.diff.push_back(Seconds(t0));
      if (!s.ok()) return s;
      // The last run's output goes first, untimed: replaced during the apply, its dirty
      // pages would be written back or waited for inside the timing, run after run.
      fs::remove_all(out, ec);
      t0 = std::chrono::steady_clock::now();
      const Status a = checkpoint::Apply(prev, delta, out, o, r);
      t.apply.push_back(Seconds(t0));
      if (!a.ok()) return a;
    }
  }
  return Status::Ok();
}

// Prints the medians (and with --scaling the speed-up of the last thread count over one).
void PrintBench(const std::vector<BenchTimes>& times, const RunReport& r, const Common& c,
                int repeats, bool scaling, bool same, const std::string& why) {
  const double gb = r.target_bytes / 1e9;
  const BenchTimes& all = times.back();
  const double diff_speedup = Median(times[0].diff) / Median(all.diff);
  const double apply_speedup = Median(times[0].apply) / Median(all.apply);
  if (c.json) {
    const auto timing = [gb](const BenchTimes& t) {
      return Json{{"threads", t.threads},
                  {"diff_seconds", Median(t.diff)},
                  {"apply_seconds", Median(t.apply)},
                  {"diff_gb_per_s", gb / Median(t.diff)},
                  {"apply_gb_per_s", gb / Median(t.apply)},
                  {"diff_best_seconds", Best(t.diff)},
                  {"apply_best_seconds", Best(t.apply)}};
    };
    Json j = timing(all);
    j.update({{"command", "bench"},
              {"ok", same},
              {"repeats", repeats},
              {"checkpoint_bytes", r.target_bytes},
              {"delta_bytes", r.delta_bytes},
              {"fsync", !c.no_sync},
              {"identical", same}});
    if (scaling) {
      j["one_thread"] = timing(times[0]);
      j["diff_speedup"] = diff_speedup;
      j["apply_speedup"] = apply_speedup;
    }
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("bench (fsync %s, median of %d%s): checkpoint %s, delta %s (%.3f%%)\n",
                c.no_sync ? "off" : "on", repeats, scaling ? ", thread counts alternating" : "",
                HumanBytes(r.target_bytes).c_str(), HumanBytes(r.delta_bytes).c_str(),
                100.0 * r.delta_bytes / r.target_bytes);
    for (auto t = times.rbegin(); t != times.rend(); ++t) {
      std::printf(
          "  %2zu thread%s  diff %6.3f s %5.2f GB/s (best %.3f s)  "
          "apply %6.3f s %5.2f GB/s (best %.3f s)\n",
          t->threads, t->threads == 1 ? " " : "s", Median(t->diff), gb / Median(t->diff),
          Best(t->diff), Median(t->apply), gb / Median(t->apply), Best(t->apply));
    }
    if (scaling) {
      std::printf("  speed-up 1 -> %zu threads: diff %.2fx, apply %.2fx\n", all.threads,
                  diff_speedup, apply_speedup);
    }
    std::printf("  rebuilt checkpoint %s\n", same ? "identical" : ("DIFFERS: " + why).c_str());
  }
}

int Bench(const std::string& prev, const std::string& next, const Common& c, int repeats,
          bool scaling) {
  std::vector<BenchTimes> times(scaling ? 2 : 1);
  times.back().threads = WorkerCount(c.threads, 1 << 20);
  if (scaling) {
    times[0].threads = 1;
    if (times[1].threads < 2) {
      std::fprintf(stderr,
                   "checkpoint_bench: --scaling needs -T 2 or more (or a machine with 2+ cores)\n");
      return kExitUsage;
    }
  }
  std::error_code ec;
  const fs::path dir = fs::temp_directory_path() / ("arc_v3_bench_" + std::to_string(getpid()));
  fs::create_directories(dir, ec);
  const std::string delta = (dir / "delta.a3d").string();
  const std::string out =
      (dir / (fs::is_directory(next, ec) ? "next" : "next.safetensors")).string();
  RunReport r;
  const Status s = BenchRuns(prev, next, delta, out, c, repeats, &times, &r);
  std::string why;
  const bool same = s.ok() && SameCheckpoint(next, out, &why);
  fs::remove_all(dir, ec);
  if (!s.ok()) {
    std::fprintf(stderr, "checkpoint_bench: error: %s\n", s.ToString().c_str());
    return kExitError;
  }
  PrintBench(times, r, c, repeats, scaling, same, why);
  return same ? kExitOk : kExitError;
}

int Main(int argc, char** argv) {
  CLI::App app(
      "Time diff + apply of PREV -> NEXT end to end (temporary files under $TMPDIR) and check\n"
      "the rebuilt checkpoint byte for byte. The codec alone: bazel run //bench:arc_bench",
      "checkpoint_bench");
  Common common;
  std::string prev, next;
  int repeats = 5;
  bool scaling = false;
  app.add_option("PREV", prev, "Base checkpoint")->required();
  app.add_option("NEXT", next, "New checkpoint")->required();
  app.add_option("-r,--repeats", repeats, "Runs (default 5); medians are reported")
      ->check(CLI::PositiveNumber);
  app.add_option("-T,--threads", common.threads, "Worker threads (default 0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("-e,--effort", common.effort, "arc_v3 effort 0..3 (default: arc_v3 diff's)")
      ->check(CLI::Range(0, 3));
  app.add_flag("--json", common.json, "Print a JSON summary on stdout instead of text");
  app.add_flag("--no-sync", common.no_sync, "Skip fsync (measures CPU work, not the disk)");
  app.add_flag("--no-group", common.no_group, "As diff --no-group (version-1 delta)");
  app.add_flag("--scaling", scaling,
               "Also time 1 thread, alternating with -T, and print the speed-up");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  return Bench(prev, next, common, repeats, scaling);
}

}  // namespace
}  // namespace arc_v3

int main(int argc, char** argv) { return arc_v3::Main(argc, argv); }
