// Fuzz target: the user's checkpoint files as the CLI and the sync layer open them
// (src/checkpoint/safetensors.h): a safetensors file's header, and a sharded checkpoint's
// model.safetensors.index.json. Input: one byte choosing which, then the file's bytes,
// written to a scratch directory (the parser maps files).
// Promises checked: no crash or out-of-bounds access; a refusal is an error with a
// message; an accepted file's tensors lie inside its data section, the non-empty ones in
// offset order without overlap, each dtype x shape bytes; its tensors and metadata written again
// (BuildHeader) read back the same, byte for byte; an accepted index names only files
// directly inside its directory.
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "src/checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_common.h"

namespace arc_v3 {
namespace fuzz {
namespace {

namespace fs = std::filesystem;

// A directory of this process's own, made once and removed at exit.
const std::string* scratch_dir = nullptr;
void RemoveScratch() {
  std::error_code ec;
  if (scratch_dir != nullptr) fs::remove_all(*scratch_dir, ec);
}
const std::string& Scratch() {
  if (scratch_dir == nullptr) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/arc_v3_fuzz_st.XXXXXX";
    if (mkdtemp(&pattern[0]) == nullptr) std::abort();
    scratch_dir = new std::string(pattern);
    std::atexit(RemoveScratch);
  }
  return *scratch_dir;
}

void Write(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  FUZZ_CHECK(out.good(), "cannot write the scratch file");
}

void CheckFile(const std::string& path) {
  safetensors::File file;
  const Status s = safetensors::File::Open(path, &file);
  FUZZ_CHECK(s.ok() || !s.message().empty(), "an error without a message");
  if (!s.ok()) return;
  const uint64_t data_bytes = file.file_size() - file.data_start();
  uint64_t last_end = 0;
  std::vector<safetensors::TensorInfo> tensors = file.tensors();
  for (const safetensors::TensorInfo& t : tensors) {
    FUZZ_CHECK(t.begin <= t.end && t.end <= data_bytes, "a tensor outside the data section");
    // A tensor of no bytes occupies none: it may sit at any offset, even inside another's.
    if (t.size() != 0) {
      FUZZ_CHECK(t.begin >= last_end, "tensors out of offset order or overlapping");
      last_end = t.end;
    }
    uint64_t elements = 1;
    for (uint64_t d : t.shape) elements *= d;
    FUZZ_CHECK(t.size() == elements * safetensors::DTypeSize(t.dtype),
               "a tensor of the wrong size");
  }
  // Written again from what was read: the same tensors, the same bytes.
  std::vector<uint8_t> bytes = safetensors::BuildHeader(&tensors, file.metadata());
  for (const safetensors::TensorInfo& t : file.tensors()) {
    const uint8_t* at = file.data(t);
    bytes.insert(bytes.end(), at, at + t.size());
  }
  const std::string again_path = Scratch() + "/again.safetensors";
  Write(again_path, bytes.data(), bytes.size());
  safetensors::File again;
  const Status back = safetensors::File::Open(again_path, &again);
  FUZZ_CHECK(back.ok(), back.message().c_str());
  FUZZ_CHECK(again.tensors().size() == file.tensors().size() && again.metadata() == file.metadata(),
             "a file written from what was read reads otherwise");
  for (size_t i = 0; i < file.tensors().size(); ++i) {
    const safetensors::TensorInfo& a = file.tensors()[i];
    const safetensors::TensorInfo& b = again.tensors()[i];
    FUZZ_CHECK(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.size() == b.size(),
               "a tensor changed in a round trip");
    FUZZ_CHECK(std::equal(file.data(a), file.data(a) + a.size(), again.data(b)),
               "tensor bytes changed");
  }
}

void CheckIndex(const std::string& dir, const uint8_t* data, size_t size) {
  Write(dir + "/model.safetensors.index.json", data, size);
  std::vector<std::string> files;
  const Status s = safetensors::ListCheckpointFiles(dir, &files);
  FUZZ_CHECK(s.ok() || !s.message().empty(), "an error without a message");
  if (!s.ok()) return;
  for (const std::string& f : files) {
    const fs::path p(f);
    FUZZ_CHECK(p.parent_path() == fs::path(dir) && p.filename() != ".." && p.filename() != ".",
               "an index names a file outside its directory");
  }
}

}  // namespace

int FuzzSafetensors(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  if (data[0] % 2 == 0) {
    const std::string path = Scratch() + "/input.safetensors";
    Write(path, data + 1, size - 1);
    CheckFile(path);
  } else {
    const std::string dir = Scratch() + "/checkpoint";
    std::error_code ec;
    fs::create_directories(dir, ec);
    CheckIndex(dir, data + 1, size - 1);
  }
  return 0;
}

ARC_V3_FUZZ_ENTRY(FuzzSafetensors)

}  // namespace fuzz
}  // namespace arc_v3
