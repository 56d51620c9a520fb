// Writes the seed corpora of the fuzz targets (run by build.sh --seeds):
//   decode/     payloads of both versions (1 and 16), several densities, efforts and
//               chunk sizes: XOR-stream, modelled and rANS chunks, groups of tensors,
//               column signs, and session payloads (first steps, and steps that
//               continue fuzz_common.h's priming step), against the fixed base of
//               fuzz_common.h;
//   roundtrip/  option + edit-list inputs of fuzz_roundtrip.cc;
//   kernels/    control byte + XOR masks of fuzz_kernels.cc;
//   container/  the manifest of a real delta container made by checkpoint::Diff.
// Usage: make_seeds OUT_DIR TMP_DIR
#include <zstd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "src/checkpoint/checkpoint_delta.h"
#include "src/checkpoint/container.h"
#include "src/codec/format.h"
#include "src/codec/model_coder.h"
#include "tests/fuzz/fuzz_common.h"

namespace arc_v3 {
namespace fuzz {
namespace {

void Write(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  FUZZ_CHECK(out.good(), path.c_str());
}

uint16_t Step(uint16_t v, int step) {
  return FromMonotoneKey(static_cast<uint16_t>(MonotoneKey(v) + step));
}

void DecodeSeeds(const std::string& dir) {
  int index = 0;
  for (const size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{5000}}) {
    for (const double density : {0.002, 0.05, 0.6}) {
      std::vector<uint16_t> src = MakeBase(n), dst = src;
      std::mt19937 rng(static_cast<uint32_t>(n * 7 + density * 1000));
      for (size_t i = 0; i < n; ++i) {
        if (std::uniform_real_distribution<double>(0, 1)(rng) >= density) continue;
        const uint32_t r = rng();
        dst[i] = (r & 15) == 0 ? static_cast<uint16_t>(src[i] ^ (r >> 16))
                               : Step(src[i], (r & 16) ? 1 : -1);
      }
      for (const Format format : {Format::kPublished, Format::kDefault}) {
        for (const int effort : {0, 2, 3}) {
          Options options;
          options.format = format;
          options.effort = effort;
          options.chunk_elements = 1024;
          options.threads = 1;
          Delta delta;
          FUZZ_CHECK(delta_compress(src, dst, &delta, options).ok(), "compress");
          Write(dir + "/seed_" + std::to_string(index++), delta.bytes);
          if (n == 0) break;
        }
      }
      if (n >= 4096 && density > 0.5) {
        // Chunks of 4096 with thousands of changes: rANS chunks.
        Options options;
        options.chunk_elements = 4096;
        options.threads = 1;
        Delta delta;
        FUZZ_CHECK(delta_compress(src, dst, &delta, options).ok(), "compress");
        Write(dir + "/seed_" + std::to_string(index++), delta.bytes);
      }
      if (n > 0) {
        // Groups of tensors: the same elements split in three, one empty.
        const std::vector<TensorDelta> tensors = GroupViews<TensorDelta>(n, src.data(), dst.data());
        const Options options = SeedOptions();
        Delta delta;
        FUZZ_CHECK(delta_compress_tensors(tensors.data(), tensors.size(), &delta, options).ok(),
                   "compress tensors");
        Write(dir + "/tensors_" + std::to_string(index++), delta.bytes);
        // The first step of a session over the same group matches a fresh receiver.
        Session session(options);
        FUZZ_CHECK(session.CompressTensors(tensors.data(), tensors.size(), &delta).ok(),
                   "session tensors");
        Write(dir + "/session_tensors_" + std::to_string(index++), delta.bytes);
      }
      // Session payloads: the first step's matches a fresh Session on the fuzz base, so
      // mutations reach the history-conditioned decoding; the second's history differs.
      Session session(SeedOptions());
      for (int step = 0; step < 2; ++step) {
        Delta delta;
        FUZZ_CHECK(session.Compress(src.data(), dst.data(), n, &delta).ok(), "session");
        Write(dir + "/session_" + std::to_string(index++), delta.bytes);
      }
      if (n == 5000 && density < 0.01) {
        // Column signs: 4096 elements as rows of 128 whose changes (10%) share
        // their column's direction 9 times in 10, in one modelled chunk.
        std::vector<uint16_t> rows = src;
        std::vector<int> column_up(128);
        for (int& up : column_up) up = static_cast<int>(rng() & 1);
        for (size_t i = 0; i < 4096; ++i) {
          if (rng() % 10 != 0) continue;
          const bool up = (rng() % 10 != 0) == (column_up[i % 128] != 0);
          rows[i] = Step(src[i], up ? 1 : -1);
        }
        Options options = SeedOptions();
        options.chunk_elements = 4096;
        Delta delta;
        FUZZ_CHECK(delta_compress(src.data(), rows.data(), 4096, &delta, options).ok(),
                   "compress columns");
        const size_t layout_at = 4 + 1 + 1 + 2 + 1 + 1;  // magic version flags count log mode
        FUZZ_CHECK(delta.bytes[4] == kFormatVersion &&
                       delta.bytes[layout_at - 1] == kChunkModelled &&
                       (delta.bytes[layout_at] & 0x40) != 0,
                   "column signs: one modelled chunk");
        Write(dir + "/columns_" + std::to_string(index++), delta.bytes);
      }
      // Steps that continue the priming step, one tensor and a group: they
      // decode on fuzz_decode's primed sessions, chunks from its carried models.
      for (const bool group : {false, true}) {
        Session sender(SeedOptions());
        Delta delta;
        CompressPrimingStep(n, group, &sender, &delta);
        FUZZ_CHECK(CompressSessionStep(src.data(), dst.data(), n, group, &sender, &delta).ok(),
                   "continuing session step");
        Write(dir + "/continues_" + std::to_string(index++), delta.bytes);
      }
    }
  }
}

void RoundTripSeeds(const std::string& dir) {
  std::mt19937 rng(7);
  for (int i = 0; i < 16; ++i) {
    std::vector<uint8_t> in;
    in.push_back(static_cast<uint8_t>(i * 5));  // options
    in.push_back(i == 15 ? 1 : 0);              // mode
    const uint16_t n = static_cast<uint16_t>(i == 15 ? 64 : 500 + i * 700);
    in.push_back(static_cast<uint8_t>(n));
    in.push_back(static_cast<uint8_t>(n >> 8));
    for (int e = 0; e < 40 + i * 10; ++e) in.push_back(static_cast<uint8_t>(rng()));
    Write(dir + "/seed_" + std::to_string(i), in);
  }
}

void KernelSeeds(const std::string& dir) {
  std::mt19937 rng(11);
  for (int i = 0; i < 12; ++i) {
    std::vector<uint8_t> in;
    in.push_back(static_cast<uint8_t>(i * 3 + (i << 3)));
    const int n = i * 37 + 1;
    for (int e = 0; e < 2 * n; ++e) in.push_back(static_cast<uint8_t>(rng()));
    Write(dir + "/seed_" + std::to_string(i), in);
  }
}

// A small safetensors file: 8-byte header size, JSON header, tensor bytes.
void WriteSafetensors(const std::string& path, uint32_t seed, bool extra) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> data;
  std::string header = "{";
  auto add = [&](const std::string& name, const std::string& dtype, const std::string& shape,
                 size_t bytes, bool sparse) {
    const size_t begin = data.size();
    std::mt19937 base(static_cast<uint32_t>(bytes));  // shared between the two files
    for (size_t i = 0; i < bytes; ++i) {
      uint8_t b = static_cast<uint8_t>(base());
      if (!sparse || rng() % 16 == 0) b ^= static_cast<uint8_t>(rng() & 3);
      data.push_back(b);
    }
    if (header.size() > 1) header += ",";
    header += "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
              ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(data.size()) +
              "]}";
  };
  add("w", "BF16", "[64,32]", 64 * 32 * 2, true);
  add("b", "F32", "[10]", 40, true);
  add("i", "I64", "[3]", 24, false);
  add("n", "BF16", "[40]", 80, true);  // with w, a group of two in version 2
  if (extra) add("new", "BF16", "[4,4]", 32, false);
  header += "}";
  std::vector<uint8_t> file(8);
  for (int k = 0; k < 8; ++k) file[k] = static_cast<uint8_t>(uint64_t{header.size()} >> (8 * k));
  file.insert(file.end(), header.begin(), header.end());
  file.insert(file.end(), data.begin(), data.end());
  Write(path, file);
}

std::vector<uint8_t> Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void ContainerSeeds(const std::string& dir, const std::string& tmp) {
  // Variants: a changed header or not; version 1 (no groups) or 2.
  for (int variant = 0; variant < 4; ++variant) {
    const std::string prev = tmp + "/prev.safetensors", next = tmp + "/next.safetensors";
    const std::string delta = tmp + "/delta.a3d";
    WriteSafetensors(prev, 1, false);
    WriteSafetensors(next, 2, (variant & 1) != 0);
    checkpoint::RunOptions options;
    options.threads = 1;
    options.sync = false;
    options.group = variant >= 2;
    const Status s = checkpoint::Diff(prev, next, delta, options, nullptr);
    FUZZ_CHECK(s.ok(), s.ToString().c_str());
    const std::vector<uint8_t> bytes = Read(delta);
    uint64_t manifest_size = 0, data_size = 0;
    for (int k = 0; k < 8; ++k) manifest_size |= uint64_t{bytes[8 + k]} << (8 * k);
    for (int k = 0; k < 8; ++k) data_size |= uint64_t{bytes[24 + k]} << (8 * k);
    const uint8_t* z = bytes.data() + checkpoint::kHeaderSize;
    std::string json(ZSTD_getFrameContentSize(z, manifest_size), '\0');
    FUZZ_CHECK(ZSTD_decompress(&json[0], json.size(), z, manifest_size) == json.size(), "zstd");
    FUZZ_CHECK(data_size < 32768, "seed data section too large");
    const uint8_t version_bit = bytes[4] == 2 ? 0x80 : 0;
    FUZZ_CHECK((bytes[4] == 2) == options.group, "grouped seeds are version 2");
    std::vector<uint8_t> in = {static_cast<uint8_t>(data_size),
                               static_cast<uint8_t>((data_size >> 8) | version_bit)};
    in.insert(in.end(), json.begin(), json.end());
    in.insert(in.end(), bytes.end() - static_cast<std::ptrdiff_t>(data_size), bytes.end());
    Write(dir + "/seed_" + std::to_string(variant), in);
  }
}

}  // namespace
}  // namespace fuzz
}  // namespace arc_v3

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: make_seeds OUT_DIR TMP_DIR\n");
    return 2;
  }
  const std::string out = argv[1];
  arc_v3::fuzz::DecodeSeeds(out + "/decode");
  arc_v3::fuzz::RoundTripSeeds(out + "/roundtrip");
  arc_v3::fuzz::KernelSeeds(out + "/kernels");
  arc_v3::fuzz::ContainerSeeds(out + "/container", argv[2]);
  return 0;
}
