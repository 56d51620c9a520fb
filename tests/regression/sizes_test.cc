// Ratio regression: payload sizes of every format and effort on deltas of the built-in
// generator (//bench:generator, fixed seeds) must equal tests/regression/sizes.csv, so
// that any change of compression ratio - better or worse - shows up as a reviewed diff of
// that file. On a mismatch the test prints the new CSV. After a deliberate change:
//   ARC_V3_UPDATE_SIZES=1 bazel run //tests/regression:sizes_test
// rewrites the committed file (then review `git diff tests/regression/sizes.csv`).
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "arc_v3.hpp"
#include "bench/generator.h"

namespace arc_v3 {
namespace {

const char kCsvPath[] = "tests/regression/sizes.csv";

std::string MeasureCsv() {
  std::ostringstream csv;
  csv << "seed,params,density,delta,format,effort,elements,changed,bytes,bits_per_change\n";
  for (const double density : {0.02, 0.005}) {
    bench::GeneratorOptions g;
    g.params = 1'000'000;
    g.target_density = density;
    g.deltas = 2;
    g.seed = 1;
    bench::GeneratedRun run;
    const Status s = bench::Generate(g, &run);
    REQUIRE_MESSAGE(s.ok(), s.ToString());
    for (size_t d = 0; d + 1 < run.snapshots.size(); ++d) {
      const std::vector<uint16_t>& src = run.snapshots[d];
      const std::vector<uint16_t>& dst = run.snapshots[d + 1];
      size_t changed = 0;
      for (size_t i = 0; i < src.size(); ++i) changed += src[i] != dst[i];
      for (const Format format : {Format::kPublished, Format::kDefault}) {
        for (int effort = 0; effort <= 3; ++effort) {
          Options options;
          options.format = format;
          options.effort = effort;
          Delta delta;
          REQUIRE(delta_compress(src, dst, &delta, options).ok());
          PayloadInfo info;
          REQUIRE(delta_inspect(delta.bytes.data(), delta.bytes.size(), &info).ok());
          char bits[32];
          std::snprintf(bits, sizeof(bits), "%.3f",
                        changed ? 8.0 * delta.bytes.size() / changed : 0.0);
          csv << g.seed << ',' << g.params << ',' << density << ',' << d << ',' << 'v'
              << info.format_version << ',' << effort << ',' << src.size() << ',' << changed << ','
              << delta.bytes.size() << ',' << bits << '\n';
        }
      }
    }
  }
  return csv.str();
}

TEST_CASE("payload sizes on generated deltas match tests/regression/sizes.csv") {
  const std::string measured = MeasureCsv();
  std::ifstream in(kCsvPath);
  std::stringstream committed;
  committed << in.rdbuf();
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (std::getenv("ARC_V3_UPDATE_SIZES") != nullptr && workspace != nullptr) {
    std::ofstream out(std::string(workspace) + "/" + kCsvPath);
    out << measured;
    REQUIRE(out.good());
    std::printf("wrote %s/%s\n", workspace, kCsvPath);
    return;
  }
  if (measured != committed.str()) {
    std::printf(
        "measured sizes (new %s):\n%s\nIf the change is intended: "
        "ARC_V3_UPDATE_SIZES=1 bazel run //tests/regression:sizes_test\n",
        kCsvPath, measured.c_str());
  }
  CHECK_MESSAGE(measured == committed.str(),
                "payload sizes changed: see the printed CSV and update it if intended");
}

}  // namespace
}  // namespace arc_v3
