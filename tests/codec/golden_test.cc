// Format stability: committed payloads (tests/golden/) must keep decoding to the same
// tensors in every future version, and committed broken payloads must keep failing with
// the same error.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "tests/golden_files.h"

namespace arc_v3 {
namespace {

using test::kGoldenDir;
using test::ReadBf16;
using test::ReadFile;

struct GoldenCase {
  std::string name;
  uint32_t version;
  uint64_t checksum;
  std::vector<size_t> tensors;  // element counts of a payload of several tensors
};

std::vector<GoldenCase> ReadManifest() {
  std::ifstream in(std::string(kGoldenDir) + "MANIFEST.txt");
  REQUIRE(in.good());
  std::vector<GoldenCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    GoldenCase c;
    std::string checksum;
    std::string tensors;
    fields >> c.name >> c.version >> checksum >> tensors;
    c.checksum = std::stoull(checksum, nullptr, 16);
    c.tensors = test::ParseTensorElements(tensors);
    cases.push_back(c);
  }
  return cases;
}

TEST_CASE("golden payloads decode to their committed tensors") {
  const std::vector<GoldenCase> cases = ReadManifest();
  REQUIRE(cases.size() >= 3);
  for (const GoldenCase& c : cases) {
    INFO("golden ", c.name);
    const std::string base = std::string(kGoldenDir) + c.name;
    const std::vector<uint16_t> src = ReadBf16(base + ".src.bf16");
    const std::vector<uint16_t> dst = ReadBf16(base + ".dst.bf16");
    const std::vector<uint8_t> payload = ReadFile(base + ".arc3");
    CHECK(Checksum(dst.data(), dst.size()) == c.checksum);
    PayloadInfo info;
    REQUIRE(delta_inspect(payload.data(), payload.size(), &info).ok());
    CHECK(info.format_version == c.version);
    if (c.name == "rans") {
      // It guards the rANS chunk layout: it must hold some.
      PayloadStats stats;
      REQUIRE(delta_stats(payload.data(), payload.size(), &stats).ok());
      CHECK(stats.chunk_modes[3] >= 2);
    }
    std::vector<uint16_t> out(src.size());
    if (!c.tensors.empty()) {
      CHECK(info.tensor_count == c.tensors.size());
      const std::vector<TensorOut> tensors =
          test::SplitTensors<TensorOut>(c.tensors, src.size(), [&](size_t at, size_t count) {
            return TensorOut{src.data() + at, out.data() + at, count};
          });
      const Status status = delta_decompress_tensors(tensors.data(), tensors.size(), payload.data(),
                                                     payload.size(), c.checksum);
      REQUIRE_MESSAGE(status.ok(), status.ToString());
      CHECK(out == dst);
      continue;
    }
    const Status status = delta_decompress(src.data(), src.size(), payload.data(), payload.size(),
                                           c.checksum, out.data());
    REQUIRE_MESSAGE(status.ok(), status.ToString());
    CHECK(out == dst);
  }
}

TEST_CASE("golden broken payloads fail with their named error") {
  const std::string base = std::string(kGoldenDir) + "v1_sparse";
  const std::vector<uint16_t> src = ReadBf16(base + ".src.bf16");
  const uint64_t checksum = ReadManifest().at(0).checksum;
  int tested = 0;
  for (int code = 1; code < static_cast<int>(ErrorCode::kMaxCode); ++code) {
    const std::string name = ErrorName(static_cast<ErrorCode>(code));
    const std::string path = std::string(kGoldenDir) + "errors/" + name + ".arc3";
    if (!std::ifstream(path).good()) continue;
    INFO("broken payload ", path);
    const std::vector<uint8_t> payload = ReadFile(path);
    std::vector<uint16_t> out(src.size(), 0x1234);
    const Status status = delta_decompress(src.data(), src.size(), payload.data(), payload.size(),
                                           checksum, out.data());
    CHECK(std::string(ErrorName(status.code())) == name);
    CHECK(out == std::vector<uint16_t>(src.size(), 0x1234));
    ++tested;
  }
  CHECK(tested >= 7);
}

}  // namespace
}  // namespace arc_v3
