// arc_v3_checkpoint.hpp: checkpoint files and directories through the public API alone
// (DiffCheckpoints, ApplyDelta, ApplyDeltaPart, VerifyDelta, InspectDeltaFile): what
// `arc_v3 diff`, `apply`, `verify` and `inspect` run.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "arc_v3_checkpoint.hpp"

namespace {

namespace fs = std::filesystem;
using arc_v3::CheckpointOptions;
using arc_v3::CheckpointReport;
using arc_v3::DeltaInfo;
using arc_v3::ErrorCode;
using arc_v3::Status;

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/arc_v3_files_XXXXXX";
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct Tensor {
  std::string name;
  std::vector<uint64_t> shape;  // BF16
  std::vector<uint16_t> values;
};

// Writes `tensors` as a safetensors file, in this order.
void WriteSafetensors(const std::string& path, const std::vector<Tensor>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const Tensor& t : tensors) {
    const uint64_t bytes = 2 * t.values.size();
    header[t.name] = {
        {"dtype", "BF16"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  const uint64_t length = json.size();  // little endian on every target we build
  out.write(reinterpret_cast<const char*>(&length), 8);
  out.write(json.data(), static_cast<std::streamsize>(json.size()));
  for (const Tensor& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.values.data()),
              static_cast<std::streamsize>(2 * t.values.size()));
  }
  REQUIRE(out.good());
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A tensor of trained-looking BF16 weights.
Tensor Weights(const std::string& name, uint64_t rows, uint64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 0.02f);
  Tensor t{name, {rows, cols}, std::vector<uint16_t>(rows * cols)};
  for (uint16_t& v : t.values) {
    const float f = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    v = static_cast<uint16_t>(bits >> 16);
  }
  return t;
}

// A step: every `every`-th value of each tensor moves by one unit in the last place.
std::vector<Tensor> Step(std::vector<Tensor> tensors, size_t every, uint64_t* changed) {
  for (Tensor& t : tensors) {
    for (size_t i = 0; i < t.values.size(); i += every) {
      t.values[i] = static_cast<uint16_t>(t.values[i] ^ 1);
      ++*changed;
    }
  }
  return tensors;
}

std::vector<Tensor> Model(uint32_t seed) {
  return {Weights("embed", 64, 256, seed), Weights("layers.0.w", 128, 128, seed + 1),
          Weights("layers.0.norm", 1, 128, seed + 2), Weights("layers.1.w", 128, 128, seed + 3)};
}

TEST_CASE("a file delta: diff, verify, apply bit for bit, inspect; a wrong base changes nothing") {
  TempDir dir;
  const std::vector<Tensor> prev = Model(1);
  uint64_t changed = 0;
  const std::vector<Tensor> next = Step(prev, 97, &changed);
  WriteSafetensors(dir / "prev.safetensors", prev);
  WriteSafetensors(dir / "next.safetensors", next);

  CheckpointOptions options;
  options.threads = 2;
  CheckpointReport diffed;
  REQUIRE(arc_v3::DiffCheckpoints(dir / "prev.safetensors", dir / "next.safetensors",
                                  dir / "step.a3d", options, &diffed)
              .ok());
  CHECK(diffed.files == 1);
  CHECK(diffed.tensors == 4);
  CHECK(diffed.delta_bytes == fs::file_size(dir / "step.a3d"));
  CHECK(diffed.delta_bytes < diffed.target_bytes / 10);

  CheckpointReport verified;
  CHECK(arc_v3::VerifyDelta(dir / "prev.safetensors", dir / "step.a3d", options, &verified).ok());
  CheckpointReport applied;
  REQUIRE(arc_v3::ApplyDelta(dir / "prev.safetensors", dir / "step.a3d", dir / "out.safetensors",
                             options, &applied)
              .ok());
  CHECK(ReadAll(dir / "out.safetensors") == ReadAll(dir / "next.safetensors"));
  CHECK(applied.written == std::vector<std::string>{dir / "out.safetensors"});

  // Inspect: without a base what the payloads say; with it every change, counted.
  DeltaInfo info;
  REQUIRE(arc_v3::InspectDeltaFile(dir / "step.a3d", "", 1, &info).ok());
  CHECK_FALSE(info.directory);
  CHECK(info.files == 1);
  CHECK(info.delta_bytes == diffed.delta_bytes);
  CHECK(info.manifest_bytes > 0);
  REQUIRE(info.tensors.size() == 4);
  REQUIRE(arc_v3::InspectDeltaFile(dir / "step.a3d", dir / "prev.safetensors", 2, &info).ok());
  uint64_t counted = 0, stored = 0;
  for (const arc_v3::DeltaTensorInfo& t : info.tensors) {
    CHECK(t.kind == "delta");
    CHECK(t.changes_known);
    CHECK(t.chunks_known);
    CHECK(t.high == 0);  // only last-place changes
    CHECK(t.coder_summary.rfind("arc_v3:", 0) == 0);
    counted += t.changed;
    stored += t.delta_bytes;
    if (t.group >= 0) {
      REQUIRE(static_cast<size_t>(t.group) < info.groups.size());
      CHECK(t.delta_bytes == 0);
    }
  }
  CHECK_FALSE(info.groups.empty());  // layers.0.norm is small enough for a group
  for (const arc_v3::DeltaGroupInfo& g : info.groups) {
    CHECK(g.file == "next.safetensors");
    CHECK(g.chunks_known);
    CHECK(g.changes_known);
    stored += g.delta_bytes;
  }
  CHECK(counted == changed);
  CHECK(stored < info.delta_bytes);

  // The same bytes in memory: the manifest alone (no payload read), the same tensors,
  // groups and sizes; no chunk counts.
  const std::string bytes = ReadAll(dir / "step.a3d");
  DeltaInfo from_memory;
  REQUIRE(arc_v3::InspectDelta(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                               &from_memory)
              .ok());
  REQUIRE(from_memory.tensors.size() == 4);
  CHECK(from_memory.groups.size() == info.groups.size());
  for (size_t i = 0; i < 4; ++i) {
    const arc_v3::DeltaTensorInfo& t = from_memory.tensors[i];
    CHECK(t.name == info.tensors[i].name);
    CHECK(t.delta_bytes == info.tensors[i].delta_bytes);
    CHECK(t.group == info.tensors[i].group);
    CHECK_FALSE(t.chunks_known);
    CHECK_FALSE(t.changes_known);
    CHECK(t.coder_summary == "arc_v3");
  }
  for (const arc_v3::DeltaGroupInfo& g : from_memory.groups) {
    CHECK_FALSE(g.chunks_known);
    CHECK(g.coder_summary == "arc_v3");
  }

  // A wrong base: refused, naming a tensor, and no output appears.
  WriteSafetensors(dir / "other.safetensors", Model(7));
  const Status wrong = arc_v3::ApplyDelta(dir / "other.safetensors", dir / "step.a3d",
                                          dir / "never.safetensors", options, &applied);
  CHECK(wrong.code() == ErrorCode::kChecksumMismatch);
  CHECK_FALSE(fs::exists(dir / "never.safetensors"));
  CHECK(
      arc_v3::VerifyDelta(dir / "other.safetensors", dir / "step.a3d", options, &verified).code() ==
      ErrorCode::kChecksumMismatch);
  CHECK(arc_v3::InspectDeltaFile(dir / "step.a3d", dir / "other.safetensors", 1, &info).code() ==
        ErrorCode::kChecksumMismatch);

  // An output that exists is kept unless overwrite.
  options.overwrite = false;
  CHECK(arc_v3::ApplyDelta(dir / "prev.safetensors", dir / "step.a3d", dir / "out.safetensors",
                           options, &applied)
            .code() == ErrorCode::kAlreadyExists);
  CHECK(arc_v3::DiffCheckpoints(dir / "prev.safetensors", dir / "next.safetensors",
                                dir / "step.a3d", options, &diffed)
            .code() == ErrorCode::kAlreadyExists);

  // A damaged delta: refused.
  std::string damaged = bytes;
  damaged[damaged.size() / 2] = static_cast<char>(damaged[damaged.size() / 2] ^ 0x40);
  std::ofstream(dir / "damaged.a3d", std::ios::binary) << damaged;
  CHECK_FALSE(arc_v3::ApplyDelta(dir / "prev.safetensors", dir / "damaged.a3d",
                                 dir / "bad.safetensors", CheckpointOptions(), &applied)
                  .ok());
  CHECK_FALSE(fs::exists(dir / "bad.safetensors"));
}

TEST_CASE("a partial apply writes the selected tensors' rows") {
  TempDir dir;
  const std::vector<Tensor> prev = Model(3);
  uint64_t changed = 0;
  const std::vector<Tensor> next = Step(prev, 31, &changed);
  WriteSafetensors(dir / "prev.safetensors", prev);
  WriteSafetensors(dir / "next.safetensors", next);
  CheckpointReport report;
  REQUIRE(arc_v3::DiffCheckpoints(dir / "prev.safetensors", dir / "next.safetensors",
                                  dir / "step.a3d", CheckpointOptions(), &report)
              .ok());
  REQUIRE(arc_v3::ApplyDeltaPart(dir / "prev.safetensors", dir / "step.a3d", "layers\\.[0-9]+\\.w",
                                 10, 20, dir / "part.safetensors", CheckpointOptions(), &report)
              .ok());
  CHECK(report.tensors == 2);
  const std::string part = ReadAll(dir / "part.safetensors");
  uint64_t length = 0;
  std::memcpy(&length, part.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(part.substr(8, length));
  for (const Tensor& t : next) {
    if (t.name != "layers.0.w" && t.name != "layers.1.w") {
      CHECK_FALSE(header.contains(t.name));
      continue;
    }
    REQUIRE(header.contains(t.name));
    CHECK(header[t.name]["shape"] == std::vector<uint64_t>{10, 128});
    const uint64_t begin = header[t.name]["data_offsets"][0];
    CHECK(std::memcmp(part.data() + 8 + length + begin, t.values.data() + 10 * 128, 10 * 128 * 2) ==
          0);
  }
}

TEST_CASE("a sharded checkpoint directory: diff and apply every file, inspect names the files") {
  TempDir dir;
  const std::vector<Tensor> model = Model(5);
  uint64_t changed = 0;
  const std::vector<Tensor> stepped = Step(model, 53, &changed);
  for (const char* step : {"prev", "next"}) {
    const std::vector<Tensor>& tensors = std::string(step) == "prev" ? model : stepped;
    fs::create_directories(dir / step);
    WriteSafetensors(dir / (std::string(step) + "/model-00001-of-00002.safetensors"),
                     {tensors[0], tensors[1]});
    WriteSafetensors(dir / (std::string(step) + "/model-00002-of-00002.safetensors"),
                     {tensors[2], tensors[3]});
  }
  CheckpointReport report;
  REQUIRE(arc_v3::DiffCheckpoints(dir / "prev", dir / "next", dir / "step.a3d", CheckpointOptions(),
                                  &report)
              .ok());
  CHECK(report.files == 2);
  REQUIRE(
      arc_v3::ApplyDelta(dir / "prev", dir / "step.a3d", dir / "out", CheckpointOptions(), &report)
          .ok());
  for (const char* name :
       {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    CHECK(ReadAll(dir / (std::string("out/") + name)) ==
          ReadAll(dir / (std::string("next/") + name)));
  }
  DeltaInfo info;
  REQUIRE(arc_v3::InspectDeltaFile(dir / "step.a3d", dir / "prev", 1, &info).ok());
  CHECK(info.directory);
  CHECK(info.files == 2);
  uint64_t counted = 0;
  for (const arc_v3::DeltaTensorInfo& t : info.tensors) counted += t.changed;
  CHECK(counted == changed);
  // Without a base an anchor: an empty prev rebuilds the directory whole.
  REQUIRE(
      arc_v3::DiffCheckpoints("", dir / "next", dir / "anchor.a3d", CheckpointOptions(), &report)
          .ok());
  REQUIRE(
      arc_v3::ApplyDelta("", dir / "anchor.a3d", dir / "whole", CheckpointOptions(), &report).ok());
  CHECK(ReadAll(dir / "whole/model-00002-of-00002.safetensors") ==
        ReadAll(dir / "next/model-00002-of-00002.safetensors"));
  REQUIRE(arc_v3::InspectDeltaFile(dir / "anchor.a3d", "", 1, &info).ok());
  for (const arc_v3::DeltaTensorInfo& t : info.tensors) CHECK(t.kind == "added");
}

}  // namespace
