// A user's program of the drop-in header (single_include/arc_v3.hpp): CI copies it into an
// empty folder beside the header and builds it with plain g++ / clang++
// (tests/single_header/run.sh). Built against the library instead (-DARC_V3_USER_LINKED:
// Bazel's //tests/single_header:user_linked, the installed CMake package), it prints the
// same payloads, which CI compares byte for byte.
//
//   user golden DIR         re-encodes the golden tensors of DIR (tests/golden/ENCODE.txt) and
//                           decodes every golden payload (MANIFEST.txt, errors/), on every
//                           SIMD target compiled in (one target when linked); ends with
//                           "N passed, N failed"
//   user roundtrip RUN...   each RUN a folder of consecutive BF16 checkpoints
//                           (step_*.safetensors): codes every step per tensor, as one grouped
//                           payload and in a session, decodes and checks each, and prints one
//                           line per step with the payloads' sizes and FNV-1a hashes (stdout;
//                           the targets on stderr). Exit 1 on any mismatch.
#ifndef ARC_V3_USER_LINKED
#define ARC_V3_IMPLEMENTATION  // this file compiles the codec: nothing else to link but its
                               // libraries
#endif
#include "arc_v3.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

int passed = 0;
int failed = 0;

void Check(bool ok, const std::string& what) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::printf("FAILED: %s\n", what.c_str());
  }
}

bool ReadFile(const std::string& path, std::vector<uint8_t>* bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  bytes->assign(std::istreambuf_iterator<char>(in), {});
  return true;
}

std::vector<uint16_t> Bf16(const std::vector<uint8_t>& bytes, size_t begin, size_t end) {
  std::vector<uint16_t> values((end - begin) / 2);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<uint16_t>(bytes[begin + 2 * i] | bytes[begin + 2 * i + 1] << 8);
  }
  return values;
}

uint64_t Fnv1a(const std::vector<uint8_t>& bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const uint8_t b : bytes) hash = (hash ^ b) * 0x100000001b3ull;
  return hash;
}

// Runs `body` once per SIMD target this file compiled (the implementation's own), or once
// on the dispatched target when linked against the library.
void ForEachTarget(const std::function<void(const std::string&)>& body) {
#ifdef ARC_V3_IMPLEMENTATION
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    body(hwy::TargetName(target));
  }
  hwy::SetSupportedTargetsForTest(0);
#else
  body(arc_v3::ActiveTarget());
#endif
}

// ---------------------------------------------------------------------------------------
// Goldens

std::vector<size_t> ParseCounts(const std::string& list) {
  std::vector<size_t> counts;
  std::stringstream in(list);
  std::string field;
  while (std::getline(in, field, ',')) counts.push_back(std::stoull(field));
  return counts;
}

std::vector<arc_v3::TensorDelta> Split(const std::vector<size_t>& counts,
                                       const std::vector<uint16_t>& src,
                                       const std::vector<uint16_t>& dst) {
  std::vector<arc_v3::TensorDelta> tensors;
  size_t at = 0;
  for (const size_t n : counts) {
    tensors.push_back({src.data() + at, dst.data() + at, n});
    at += n;
  }
  return tensors;
}

int Golden(const std::string& dir) {
  std::vector<std::string> targets;
  ForEachTarget([&](const std::string& target) { targets.push_back(target); });
  std::string names;
  for (const std::string& t : targets) names += " " + t;
  std::printf("targets:%s\n", names.c_str());

  // ENCODE.txt: NAME FORMAT(v1|one|tensors) EFFORT CHUNK_ELEMENTS [TENSOR_ELEMENTS,...]
  std::ifstream list(dir + "/ENCODE.txt");
  Check(list.good(), dir + "/ENCODE.txt");
  std::string line;
  int encoded = 0;
  while (std::getline(list, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name, format, counts;
    arc_v3::Options options;
    fields >> name >> format >> options.effort >> options.chunk_elements >> counts;
    options.format = format == "v1" ? arc_v3::Format::kPublished : arc_v3::Format::kDefault;
    std::vector<uint8_t> src_bytes, dst_bytes, golden;
    if (!ReadFile(dir + "/" + name + ".src.bf16", &src_bytes) ||
        !ReadFile(dir + "/" + name + ".dst.bf16", &dst_bytes) ||
        !ReadFile(dir + "/" + name + ".arc3", &golden)) {
      Check(false, "read golden " + name);
      continue;
    }
    const std::vector<uint16_t> src = Bf16(src_bytes, 0, src_bytes.size());
    const std::vector<uint16_t> dst = Bf16(dst_bytes, 0, dst_bytes.size());
    ++encoded;
    ForEachTarget([&](const std::string& target) {
      arc_v3::Delta delta;
      arc_v3::Status s;
      if (format == "tensors") {
        const std::vector<arc_v3::TensorDelta> tensors = Split(ParseCounts(counts), src, dst);
        s = arc_v3::delta_compress_tensors(tensors.data(), tensors.size(), &delta, options);
      } else {
        s = arc_v3::delta_compress(src, dst, &delta, options);
      }
      Check(s.ok() && delta.bytes == golden, "encode " + name + " on " + target + ": " +
                                                 s.ToString() + ", " +
                                                 std::to_string(delta.bytes.size()) +
                                                 " bytes, golden " + std::to_string(golden.size()));
    });
  }

  // MANIFEST.txt: NAME FORMAT_VERSION CHECKSUM [TENSOR_ELEMENTS,...]
  std::ifstream manifest(dir + "/MANIFEST.txt");
  Check(manifest.good(), dir + "/MANIFEST.txt");
  int decoded = 0;
  while (std::getline(manifest, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name, version, checksum_hex, counts;
    fields >> name >> version >> checksum_hex >> counts;
    const uint64_t checksum = std::stoull(checksum_hex, nullptr, 16);
    std::vector<uint8_t> src_bytes, dst_bytes, payload;
    if (!ReadFile(dir + "/" + name + ".src.bf16", &src_bytes) ||
        !ReadFile(dir + "/" + name + ".dst.bf16", &dst_bytes) ||
        !ReadFile(dir + "/" + name + ".arc3", &payload)) {
      Check(false, "read golden " + name);
      continue;
    }
    const std::vector<uint16_t> src = Bf16(src_bytes, 0, src_bytes.size());
    const std::vector<uint16_t> dst = Bf16(dst_bytes, 0, dst_bytes.size());
    ++decoded;
    ForEachTarget([&](const std::string& target) {
      std::vector<uint16_t> out(src.size(), 0);
      arc_v3::Status s;
      if (!counts.empty()) {
        std::vector<arc_v3::TensorOut> tensors;
        size_t at = 0;
        for (const size_t n : ParseCounts(counts)) {
          tensors.push_back({src.data() + at, out.data() + at, n});
          at += n;
        }
        s = arc_v3::delta_decompress_tensors(tensors.data(), tensors.size(), payload.data(),
                                             payload.size(), checksum);
      } else {
        s = arc_v3::delta_decompress(src.data(), src.size(), payload.data(), payload.size(),
                                     checksum, out.data());
      }
      Check(s.ok() && out == dst, "decode " + name + " on " + target + ": " + s.ToString());
    });
  }

  // errors/ERROR_NAME.arc3 fail with that error, applied to v1_sparse.
  std::vector<uint8_t> base_bytes;
  Check(ReadFile(dir + "/v1_sparse.src.bf16", &base_bytes), "read v1_sparse");
  const std::vector<uint16_t> base = Bf16(base_bytes, 0, base_bytes.size());
  std::vector<fs::path> errors;
  for (const auto& entry : fs::directory_iterator(dir + "/errors")) {
    if (entry.path().extension() == ".arc3") errors.push_back(entry.path());
  }
  std::sort(errors.begin(), errors.end());
  for (const fs::path& path : errors) {
    std::vector<uint8_t> payload;
    ReadFile(path.string(), &payload);
    ForEachTarget([&](const std::string& target) {
      std::vector<uint16_t> out(base.size(), 0x7777);
      const arc_v3::Status s =
          arc_v3::delta_decompress(base.data(), base.size(), payload.data(), payload.size(),
                                   0x29702faf0139f4adull, out.data());
      Check(arc_v3::ErrorName(s.code()) == path.stem().string() &&
                std::all_of(out.begin(), out.end(), [](uint16_t v) { return v == 0x7777; }),
            "error golden " + path.filename().string() + " on " + target + ": " + s.ToString());
    });
  }
  std::printf("goldens: %d encoded, %d decoded, %zu error payloads, on %zu targets\n", encoded,
              decoded, errors.size(), targets.size());
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 && encoded > 0 && decoded > 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------------------
// Real checkpoints

// A safetensors file's BF16 tensors, in the order of their bytes in the file.
struct Checkpoint {
  std::vector<uint8_t> bytes;
  std::vector<std::vector<uint16_t>> tensors;
};

// The (begin, end) data offsets of every "BF16" tensor of a safetensors JSON header. Only
// what such a header holds: an object of flat objects with "dtype", "shape" and
// "data_offsets" (and "__metadata__", which has no offsets).
bool ParseHeader(const std::string& json, std::vector<std::pair<size_t, size_t>>* spans) {
  size_t at = 0;
  while ((at = json.find("\"data_offsets\"", at)) != std::string::npos) {
    const size_t open = json.rfind('{', at), close = json.find('}', at);
    if (open == std::string::npos || close == std::string::npos) return false;
    const std::string entry = json.substr(open, close - open);
    const size_t dtype = entry.find("\"dtype\"");
    unsigned long long begin = 0, end = 0;
    if (dtype == std::string::npos ||
        std::sscanf(json.c_str() + json.find('[', at), "[%llu ,%llu]", &begin, &end) != 2 ||
        end < begin || (end - begin) % 2 != 0) {
      return false;
    }
    if (entry.compare(entry.find('"', entry.find(':', dtype)), 6, "\"BF16\"") == 0) {
      spans->emplace_back(begin, end);
    }
    at = close;
  }
  std::sort(spans->begin(), spans->end());
  return true;
}

bool LoadCheckpoint(const std::string& path, Checkpoint* checkpoint) {
  if (!ReadFile(path, &checkpoint->bytes) || checkpoint->bytes.size() < 8) return false;
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | checkpoint->bytes[i];
  if (header > checkpoint->bytes.size() - 8) return false;
  std::vector<std::pair<size_t, size_t>> spans;
  if (!ParseHeader(
          std::string(checkpoint->bytes.begin() + 8, checkpoint->bytes.begin() + 8 + header),
          &spans)) {
    return false;
  }
  for (const auto& span : spans) {
    checkpoint->tensors.push_back(
        Bf16(checkpoint->bytes, 8 + header + span.first, 8 + header + span.second));
  }
  return !checkpoint->tensors.empty();
}

// One line per step: the payloads of the step and whether each decoded to the next weights.
std::string CodeStep(const Checkpoint& prev, const Checkpoint& next, arc_v3::Session* sender,
                     arc_v3::Session* receiver) {
  const size_t n = prev.tensors.size();
  std::string line;
  char buffer[160];

  // One payload per tensor.
  std::vector<uint8_t> all;
  bool ok = true;
  for (size_t t = 0; t < n; ++t) {
    arc_v3::Delta delta;
    std::vector<uint16_t> out;
    ok &= arc_v3::delta_compress(prev.tensors[t], next.tensors[t], &delta).ok() &&
          arc_v3::delta_decompress(prev.tensors[t], delta, &out).ok() && out == next.tensors[t];
    all.insert(all.end(), delta.bytes.begin(), delta.bytes.end());
  }
  std::snprintf(buffer, sizeof(buffer), "per-tensor %zu payloads %zu bytes %016llx%s", n,
                all.size(), static_cast<unsigned long long>(Fnv1a(all)), ok ? "" : " MISMATCH");
  line += buffer;

  // The tensors in one payload, and one session step over them.
  std::vector<std::vector<uint16_t>> outs(n);
  std::vector<arc_v3::TensorDelta> deltas;
  std::vector<arc_v3::TensorOut> results;
  for (size_t t = 0; t < n; ++t) {
    outs[t].assign(prev.tensors[t].size(), 0);
    deltas.push_back({prev.tensors[t].data(), next.tensors[t].data(), prev.tensors[t].size()});
    results.push_back({prev.tensors[t].data(), outs[t].data(), outs[t].size()});
  }
  for (int session = 0; session < 2; ++session) {
    arc_v3::Delta delta;
    ok = session ? sender->CompressTensors(deltas.data(), n, &delta).ok()
                 : arc_v3::delta_compress_tensors(deltas.data(), n, &delta).ok();
    ok &= session ? receiver
                        ->DecompressTensors(results.data(), n, delta.bytes.data(),
                                            delta.bytes.size(), delta.checksum)
                        .ok()
                  : arc_v3::delta_decompress_tensors(results.data(), n, delta.bytes.data(),
                                                     delta.bytes.size(), delta.checksum)
                        .ok();
    ok &= outs == next.tensors;
    std::snprintf(buffer, sizeof(buffer), "; %s %zu bytes %016llx%s",
                  session ? "session" : "grouped", delta.bytes.size(),
                  static_cast<unsigned long long>(Fnv1a(delta.bytes)), ok ? "" : " MISMATCH");
    line += buffer;
  }
  return line;
}

int RoundTrip(const std::vector<std::string>& runs) {
  std::vector<std::string> lines;  // of the first target
  bool ok = true;
  size_t steps = 0, elements = 0;
  for (const std::string& run : runs) {
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(run)) {
      const std::string file = entry.path().filename().string();
      if (file.rfind("step_", 0) == 0 && entry.path().extension() == ".safetensors") {
        files.push_back(entry.path().string());
      }
    }
    std::sort(files.begin(), files.end());
    std::vector<Checkpoint> checkpoints(files.size());
    for (size_t i = 0; i < files.size(); ++i) {
      if (!LoadCheckpoint(files[i], &checkpoints[i])) {
        std::fprintf(stderr, "cannot read %s\n", files[i].c_str());
        return 1;
      }
    }
    if (checkpoints.size() < 2) {
      std::fprintf(stderr, "%s: fewer than 2 checkpoints\n", run.c_str());
      return 1;
    }
    const size_t base = lines.size();  // this run's lines start here
    ForEachTarget([&](const std::string& target) {
      arc_v3::Session sender, receiver;
      for (size_t i = 1; i < checkpoints.size(); ++i) {
        const std::string line = fs::path(run).filename().string() + " " +
                                 fs::path(files[i]).stem().string() + ": " +
                                 CodeStep(checkpoints[i - 1], checkpoints[i], &sender, &receiver);
        if (lines.size() < base + i) {  // the first target
          lines.push_back(line);
          for (const auto& t : checkpoints[i].tensors) elements += t.size();
          ++steps;
        } else if (lines[base + i - 1] != line) {
          std::fprintf(stderr, "target %s differs: %s\n", target.c_str(), line.c_str());
          ok = false;
        }
        if (line.find("MISMATCH") != std::string::npos) ok = false;
      }
      std::fprintf(stderr, "%s: %zu steps on %s\n", run.c_str(), checkpoints.size() - 1,
                   target.c_str());
    });
  }
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  std::fprintf(stderr, "%zu steps, %zu elements: %s\n", steps, elements,
               ok ? "every payload decoded, the same bytes on every target" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "golden" && argc == 3) return Golden(argv[2]);
  if (mode == "roundtrip" && argc >= 3) return RoundTrip({argv + 2, argv + argc});
  std::fprintf(stderr, "usage: %s golden DIR | roundtrip RUN...\n", argv[0]);
  return 2;
}
