// The encoder's bytes are part of the promise: the same (src, dst, options) give the same
// payload on every machine, compiler and SIMD target (src/codec/FORMAT.md). This test re-encodes
// the golden tensors (tests/golden/ENCODE.txt lists the options that made each committed
// NAME.arc3, on x86) on every compiled target and compares byte for byte; run on Arm by
// tests/run_neon.sh, it checks NEON/SVE/SVE2 against the x86 bytes.
//
// Both formats are frozen (version 16 with arc_v3 1.0, version 1 as published): a change
// of these bytes is a change of the format. Should a new format version need new
// payloads, `ARC_V3_UPDATE_GOLDEN=1 bazel run //tests/codec:encode_golden_test` writes them and
// fails for each (update mode checks nothing); a second, ordinary run checks them.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "tests/golden_files.h"
#include "tests/hwy_doctest.h"

namespace arc_v3 {
namespace {

using test::kGoldenDir;
using test::ReadBf16;
using test::ReadFile;

struct EncodeCase {
  std::string name;
  Options options;
  std::vector<size_t> tensors;  // "tensors": the tensors' element counts
};

// Lines: NAME FORMAT(v1|one|tensors) EFFORT CHUNK_ELEMENTS [TENSOR_ELEMENTS,...].
std::vector<EncodeCase> ReadEncodeList() {
  std::ifstream in(std::string(kGoldenDir) + "ENCODE.txt");
  REQUIRE(in.good());
  std::vector<EncodeCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    EncodeCase c;
    std::string format;
    std::string tensors;
    fields >> c.name >> format >> c.options.effort >> c.options.chunk_elements;
    const bool valid = (format == "v1" || format == "one" || format == "tensors") && !fields.fail();
    REQUIRE_MESSAGE(valid, "bad line: ", line);
    fields >> tensors;
    c.tensors = test::ParseTensorElements(tensors);
    REQUIRE_MESSAGE((format == "tensors") == !c.tensors.empty(), "bad line: ", line);
    c.options.format = format == "v1" ? Format::kPublished : Format::kDefault;
    c.options.threads = 1;
    cases.push_back(c);
  }
  return cases;
}

TEST_CASE("the encoder reproduces the committed golden payloads on every target") {
  const std::vector<EncodeCase> cases = ReadEncodeList();
  REQUIRE(cases.size() >= 6);
  const char* update = std::getenv("ARC_V3_UPDATE_GOLDEN");
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  for (const EncodeCase& c : cases) {
    INFO("golden ", c.name);
    REQUIRE(c.name.find('/') == std::string::npos);
    const std::string base = std::string(kGoldenDir) + c.name;
    const std::vector<uint16_t> src = ReadBf16(base + ".src.bf16");
    const std::vector<uint16_t> dst = ReadBf16(base + ".dst.bf16");
    const bool exists = std::ifstream(base + ".arc3").good();
    const std::vector<uint8_t> committed =
        exists ? ReadFile(base + ".arc3") : std::vector<uint8_t>();
    // One tensor through delta_compress, several through delta_compress_tensors.
    const auto compress = [&](Delta* delta) {
      if (c.tensors.empty()) return delta_compress(src, dst, delta, c.options);
      const std::vector<TensorDelta> tensors =
          test::SplitTensors<TensorDelta>(c.tensors, src.size(), [&](size_t at, size_t count) {
            return TensorDelta{src.data() + at, dst.data() + at, count};
          });
      return delta_compress_tensors(tensors.data(), tensors.size(), delta, c.options);
    };
    Delta delta;
    REQUIRE(compress(&delta).ok());
    // Version 1 payloads are written once (when new) and then frozen.
    if (delta.bytes != committed && update != nullptr && workspace != nullptr &&
        (c.options.format == Format::kDefault || !exists)) {
      const std::string path = std::string(workspace) + "/" + base + ".arc3";
      std::ofstream out(path, std::ios::binary);
      out.write(reinterpret_cast<const char*>(delta.bytes.data()),
                static_cast<std::streamsize>(delta.bytes.size()));
      REQUIRE(out.good());
      // Update mode is not a test: nothing was compared with the file just written, so
      // the run fails visibly; run the test again without ARC_V3_UPDATE_GOLDEN to check.
      FAIL_CHECK("update mode (ARC_V3_UPDATE_GOLDEN): rewrote ", path, " (", committed.size(),
                 " -> ", delta.bytes.size(), " bytes), not checked: run again without it");
      continue;
    }
    test::ForEachTarget([&](const char* target) {
      Delta on_target;
      REQUIRE(compress(&on_target).ok());
      CHECK_MESSAGE(on_target.bytes == committed, "target ", std::string(target), ": ",
                    on_target.bytes.size(), " bytes, committed ", committed.size(),
                    c.options.format == Format::kPublished
                        ? " (a format-1 golden stays as committed: it must keep decoding; if the "
                          "encoder's race changed on purpose, pick the options that reproduce it "
                          "in ENCODE.txt or add a new golden)"
                        : " (format 16 is frozen: the encoder must keep writing these bytes)");
    });
  }
}

}  // namespace
}  // namespace arc_v3
