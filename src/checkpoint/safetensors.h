// Reading safetensors files (https://github.com/huggingface/safetensors format: 8-byte
// little-endian header length, JSON header, raw little-endian tensor data), memory-mapped.
// Used by the CLI and the benchmarks; not part of the codec library.
#ifndef ARC_V3_SRC_CHECKPOINT_SAFETENSORS_H_
#define ARC_V3_SRC_CHECKPOINT_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "arc_v3.hpp"

namespace arc_v3 {
namespace safetensors {

struct TensorInfo {
  std::string name;
  std::string dtype;  // as in the file: "BF16", "F32", "I64", ...
  std::vector<uint64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
  uint64_t size() const { return end - begin; }
};

// Bytes per element of a safetensors dtype name; 0 if unknown.
size_t DTypeSize(const std::string& dtype);

// A read-only, memory-mapped safetensors file. Movable, not copyable.
class File {
 public:
  File() = default;
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Maps `path` and validates its header: JSON well-formed, dtypes known, every tensor's
  // byte range inside the file, consistent with dtype x shape, and non-overlapping.
  // Errors: kInvalidArgument (cannot open/map), kCorruptHeader (malformed file).
  static Status Open(const std::string& path, File* file);

  // Tensors in the order of their data offsets.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr if absent.
  const TensorInfo* Find(const std::string& name) const;
  const uint8_t* data(const TensorInfo& tensor) const { return data_ + tensor.begin; }
  // "__metadata__" string map, if any.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  // The whole mapped file; its data section starts at data_start().
  const uint8_t* raw() const { return map_; }
  uint64_t data_start() const { return static_cast<uint64_t>(data_ - map_); }

 private:
  void Release();

  std::string path_;
  const uint8_t* map_ = nullptr;  // whole file
  uint64_t size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Serialises a safetensors header (length prefix + JSON, padded with spaces to a multiple
// of 8 bytes as the reference implementation does) for tensors laid out in the given
// order, assigning their byte ranges; returns the header bytes.
std::vector<uint8_t> BuildHeader(std::vector<TensorInfo>* tensors,
                                 const std::map<std::string, std::string>& metadata);

// The *.safetensors files of a checkpoint: `path` itself if it is a file, otherwise the
// files of a directory (listed by model.safetensors.index.json if present), sorted.
Status ListCheckpointFiles(const std::string& path, std::vector<std::string>* files);

}  // namespace safetensors
}  // namespace arc_v3

#endif  // ARC_V3_SRC_CHECKPOINT_SAFETENSORS_H_
