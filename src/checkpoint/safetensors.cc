// safetensors reading (see safetensors.h).
#include "src/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "src/checkpoint/strict_json.h"
#include "src/common/file_io.h"
#include "src/common/status_macros.h"

namespace arc_v3 {
namespace safetensors {
namespace {

Status Corrupt(const std::string& path, const std::string& what) {
  return Status(ErrorCode::kCorruptHeader, path + ": " + what);
}

}  // namespace

size_t DTypeSize(const std::string& dtype) {
  static const std::map<std::string, size_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  const auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

File::~File() { Release(); }

File::File(File&& other) noexcept { *this = std::move(other); }

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    Release();
    path_ = std::move(other.path_);
    map_ = other.map_;
    size_ = other.size_;
    data_ = other.data_;
    tensors_ = std::move(other.tensors_);
    metadata_ = std::move(other.metadata_);
    other.map_ = nullptr;
    other.size_ = 0;
    other.data_ = nullptr;
  }
  return *this;
}

void File::Release() {
  if (map_ != nullptr && size_ > 0) munmap(const_cast<uint8_t*>(map_), size_);
  map_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

namespace {

// One tensor entry of a header: dtype known, shape, and a byte range inside the data
// section (`data_size` bytes) of the size dtype x shape.
Status ParseTensor(const std::string& path, const std::string& name, const nlohmann::json& t,
                   uint64_t data_size, TensorInfo* info) {
  if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") ||
      !t.contains("data_offsets") || !t["dtype"].is_string() || !t["shape"].is_array() ||
      !t["data_offsets"].is_array() || t["data_offsets"].size() != 2) {
    return Corrupt(path, "tensor '" + name + "' lacks dtype, shape or data_offsets");
  }
  info->name = name;
  info->dtype = t["dtype"].get<std::string>();
  const size_t element_size = DTypeSize(info->dtype);
  if (element_size == 0) {
    return Corrupt(path, "tensor '" + name + "' has unknown dtype " + info->dtype);
  }
  uint64_t elements = 1;
  for (const auto& dim : t["shape"]) {
    if (!dim.is_number_unsigned()) return Corrupt(path, "tensor '" + name + "' has a bad shape");
    const uint64_t d = dim.get<uint64_t>();
    if (d != 0 && elements > (uint64_t{1} << 62) / d) return Corrupt(path, "shape too large");
    elements *= d;
    info->shape.push_back(d);
  }
  const auto& offsets = t["data_offsets"];
  if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
    return Corrupt(path, "tensor '" + name + "' has bad data_offsets");
  }
  info->begin = offsets[0].get<uint64_t>();
  info->end = offsets[1].get<uint64_t>();
  if (info->begin > info->end || info->end > data_size) {
    return Corrupt(path, "tensor '" + name + "' lies outside the file");
  }
  if (info->size() != elements * element_size) {
    return Corrupt(path, "tensor '" + name + "' size differs from dtype x shape");
  }
  return Status::Ok();
}

// The "__metadata__" entry: an object of strings.
Status ParseMetadata(const std::string& path, const nlohmann::json& m,
                     std::map<std::string, std::string>* metadata) {
  if (!m.is_object()) return Corrupt(path, "__metadata__ is not an object");
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (!it->is_string()) return Corrupt(path, "__metadata__ values must be strings");
    (*metadata)[it.key()] = it->get<std::string>();
  }
  return Status::Ok();
}

// Sorts the tensors by data offset (then name) and checks that no two overlap; zero-size
// tensors occupy no bytes, so they may share an offset with a neighbour.
Status SortAndCheckOverlaps(const std::string& path, std::vector<TensorInfo>* tensors) {
  std::sort(tensors->begin(), tensors->end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.name < b.name;
  });
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : *tensors) {
    if (t.size() == 0) continue;
    if (previous != nullptr && t.begin < previous->end) {
      return Corrupt(path, "tensors '" + previous->name + "' and '" + t.name + "' overlap");
    }
    previous = &t;
  }
  return Status::Ok();
}

}  // namespace

Status File::Open(const std::string& path, File* file) {
  File result;
  result.path_ = path;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return file_io::Error(path, "cannot open");
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return file_io::Error(path, "cannot stat");
  }
  result.size_ = static_cast<uint64_t>(st.st_size);
  if (result.size_ < 8) {
    close(fd);
    return Corrupt(path, "shorter than the 8-byte header length");
  }
  void* map = mmap(nullptr, result.size_, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    result.size_ = 0;
    return file_io::Error(path, "cannot map");
  }
  result.map_ = static_cast<const uint8_t*>(map);

  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | result.map_[i];
  if (header_size > result.size_ - 8) return Corrupt(path, "header length past the end of file");
  result.data_ = result.map_ + 8 + header_size;
  const uint64_t data_size = result.size_ - 8 - header_size;

  nlohmann::json header;
  try {
    const char* text = reinterpret_cast<const char*>(result.map_ + 8);
    header = strict_json::Parse(text, text + header_size, "header");
  } catch (const strict_json::Error& e) {
    return Corrupt(path, e.what);  // a tensor named twice: no one reading
  } catch (const std::exception&) {
    return Corrupt(path, "header is not a JSON object");
  }
  if (!header.is_object()) return Corrupt(path, "header is not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      ARC_V3_RETURN_IF_ERROR(ParseMetadata(path, *it, &result.metadata_));
      continue;
    }
    TensorInfo info;
    ARC_V3_RETURN_IF_ERROR(ParseTensor(path, it.key(), *it, data_size, &info));
    result.tensors_.push_back(std::move(info));
  }
  ARC_V3_RETURN_IF_ERROR(SortAndCheckOverlaps(path, &result.tensors_));
  *file = std::move(result);
  return Status::Ok();
}

const TensorInfo* File::Find(const std::string& name) const {
  for (const TensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::vector<uint8_t> BuildHeader(std::vector<TensorInfo>* tensors,
                                 const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (TensorInfo& t : *tensors) {
    const uint64_t size = t.size();
    t.begin = offset;
    t.end = offset + size;
    offset = t.end;
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  std::string json = header.dump();
  while (json.size() % 8 != 0) json.push_back(' ');
  std::vector<uint8_t> bytes(8 + json.size());
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(bytes.data() + 8, json.data(), json.size());
  return bytes;
}

Status ListCheckpointFiles(const std::string& path, std::vector<std::string>* files) {
  namespace fs = std::filesystem;
  files->clear();
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    files->push_back(path);
    return Status::Ok();
  }
  if (!fs::is_directory(path, ec)) {
    return Status(ErrorCode::kInvalidArgument, path + ": no such file or directory");
  }
  const fs::path index = fs::path(path) / "model.safetensors.index.json";
  if (fs::is_regular_file(index, ec)) {
    std::ifstream in(index);
    nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded() || !json.contains("weight_map") || !json["weight_map"].is_object()) {
      return Status(ErrorCode::kCorruptHeader, index.string() + ": no weight_map");
    }
    std::set<std::string> shards;
    for (const auto& shard : json["weight_map"]) {
      if (!shard.is_string())
        return Status(ErrorCode::kCorruptHeader, index.string() + ": bad weight_map");
      const std::string name = shard.get<std::string>();
      if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
          name.find('\0') != std::string::npos) {
        return Status(ErrorCode::kCorruptHeader,
                      index.string() + ": shard '" + name + "' is no file of the directory");
      }
      shards.insert(name);
    }
    for (const auto& name : shards) files->push_back((fs::path(path) / name).string());
    return Status::Ok();
  }
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") {
      files->push_back(entry.path().string());
    }
  }
  std::sort(files->begin(), files->end());
  return Status::Ok();
}

}  // namespace safetensors
}  // namespace arc_v3
