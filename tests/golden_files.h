// Reading the committed golden files (tests/golden/): raw bytes and little-endian BF16
// tensors, from the source root (Bazel runs tests there; CMake sets it as their directory).
#ifndef ARC_V3_TESTS_GOLDEN_FILES_H_
#define ARC_V3_TESTS_GOLDEN_FILES_H_

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
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

// A golden of several tensors: "3000,324,0" -> their element counts, which split the
// golden's src and dst in order; an empty string (one-tensor golden) gives no split.
inline std::vector<size_t> ParseTensorElements(const std::string& list) {
  std::vector<size_t> counts;
  size_t at = 0;
  while (at < list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    counts.push_back(std::stoull(list.substr(at, comma - at)));
    at = comma + 1;
  }
  return counts;
}

// The tensors of `values` split as `counts` says (which must add up to its size).
template <class Tensor>
std::vector<Tensor> SplitTensors(const std::vector<size_t>& counts, size_t total,
                                 const std::function<Tensor(size_t at, size_t count)>& make) {
  std::vector<Tensor> tensors;
  size_t at = 0;
  for (const size_t count : counts) {
    tensors.push_back(make(at, count));
    at += count;
  }
  REQUIRE(at == total);
  return tensors;
}

}  // namespace test
}  // namespace arc_v3

#endif  // ARC_V3_TESTS_GOLDEN_FILES_H_
