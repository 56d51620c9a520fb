// Reading the committed golden files (tests/golden/): raw bytes and little-endian BF16
// tensors, from the source root (Bazel runs tests there; CMake sets it as their directory).
#ifndef ARC_V3_TESTS_GOLDEN_FILES_H_
#define ARC_V3_TESTS_GOLDEN_FILES_H_

#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace arc_v3 {
namespace test {

constexpr char kGoldenDir[] = "tests/golden/";

inline std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read ", path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

inline std::vector<uint16_t> ReadBf16(const std::string& path) {
  const std::vector<uint8_t> bytes = ReadFile(path);
  REQUIRE(bytes.size() % 2 == 0);
  std::vector<uint16_t> values(bytes.size() / 2);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8));
  }
  return values;
}

}  // namespace test
}  // namespace arc_v3

#endif  // ARC_V3_TESTS_GOLDEN_FILES_H_
