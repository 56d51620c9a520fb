// Replays the committed fuzz corpora (tests/fuzz/corpus/TARGET/*) through the fuzz
// targets, without libFuzzer: every input that ever found a bug, plus a minimised corpus
// that covers what the fuzzers reached, runs on every `bazel test //...`. A violated
// promise aborts with the input's FUZZ_CHECK message (the file name is printed first).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

namespace arc_v3 {
namespace fuzz {
int FuzzDecode(const uint8_t* data, size_t size);
int FuzzRoundTrip(const uint8_t* data, size_t size);
int FuzzKernels(const uint8_t* data, size_t size);
int FuzzContainer(const uint8_t* data, size_t size);
int FuzzDocuments(const uint8_t* data, size_t size);
int FuzzRegionState(const uint8_t* data, size_t size);
int FuzzSafetensors(const uint8_t* data, size_t size);
int FuzzS3Answers(const uint8_t* data, size_t size);
int FuzzStoreFaults(const uint8_t* data, size_t size);
int FuzzEvents(const uint8_t* data, size_t size);

namespace {

// Runs every file of tests/fuzz/corpus/<name>/ through `target`; returns how many.
size_t Replay(const std::string& name, int (*target)(const uint8_t*, size_t)) {
  const std::filesystem::path dir = std::filesystem::path("tests/fuzz/corpus") / name;
  REQUIRE_MESSAGE(std::filesystem::is_directory(dir), "missing corpus ", dir.string());
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    const std::vector<uint8_t> bytes(std::istreambuf_iterator<char>(in), {});
    std::fprintf(stderr, "replay %s\n", path.string().c_str());
    // Fresh copy in an exactly-sized block: ASan catches reads past the input.
    const std::unique_ptr<uint8_t[]> copy(new uint8_t[bytes.size() + 1]);
    std::copy(bytes.begin(), bytes.end(), copy.get());
    CHECK(target(copy.get(), bytes.size()) == 0);
  }
  return files.size();
}

TEST_CASE("fuzz corpus: decode") { CHECK(Replay("decode", FuzzDecode) >= 10); }
TEST_CASE("fuzz corpus: roundtrip") { CHECK(Replay("roundtrip", FuzzRoundTrip) >= 10); }
TEST_CASE("fuzz corpus: kernels") { CHECK(Replay("kernels", FuzzKernels) >= 5); }
TEST_CASE("fuzz corpus: container") { CHECK(Replay("container", FuzzContainer) >= 2); }
TEST_CASE("fuzz corpus: documents") { CHECK(Replay("documents", FuzzDocuments) >= 20); }
TEST_CASE("fuzz corpus: region_state") { CHECK(Replay("region_state", FuzzRegionState) >= 4); }
TEST_CASE("fuzz corpus: safetensors") { CHECK(Replay("safetensors", FuzzSafetensors) >= 4); }
TEST_CASE("fuzz corpus: s3_answers") { CHECK(Replay("s3_answers", FuzzS3Answers) >= 4); }
TEST_CASE("fuzz corpus: store_faults") { CHECK(Replay("store_faults", FuzzStoreFaults) >= 8); }
TEST_CASE("fuzz corpus: events") { CHECK(Replay("events", FuzzEvents) >= 8); }

}  // namespace
}  // namespace fuzz
}  // namespace arc_v3
