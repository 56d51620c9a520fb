#include "bench/dataset.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>

namespace arc_v3 {
namespace bench {

uint64_t StepPair::Elements() const {
  uint64_t total = 0;
  for (const TensorPair& t : tensors) total += t.count;
  return total;
}

Dataset DatasetFromSnapshots(const std::string& name, const std::vector<TensorLayout>& layout,
                             std::vector<std::vector<uint16_t>> snapshots) {
  Dataset dataset;
  dataset.name = name;
  dataset.snapshots = std::move(snapshots);
  for (size_t step = 1; step < dataset.snapshots.size(); ++step) {
    StepPair pair;
    for (const TensorLayout& t : layout) {
      pair.tensors.push_back(TensorPair{t.name, t.rows, t.cols, t.count(),
                                        dataset.snapshots[step - 1].data() + t.offset,
                                        dataset.snapshots[step].data() + t.offset});
    }
    dataset.pairs.push_back(std::move(pair));
  }
  return dataset;
}

namespace {

struct Located {
  const safetensors::File* file;
  const safetensors::TensorInfo* info;
};

// Opens one checkpoint (a file, or a directory of shards), appending its files.
Status OpenCheckpoint(const std::string& path, std::vector<safetensors::File>* files) {
  std::vector<std::string> shard_paths;
  Status status = safetensors::ListCheckpointFiles(path, &shard_paths);
  if (!status.ok()) return status;
  if (shard_paths.empty()) return Status(ErrorCode::kInvalidArgument, path + ": no .safetensors");
  for (const std::string& shard : shard_paths) {
    safetensors::File file;
    status = safetensors::File::Open(shard, &file);
    if (!status.ok()) return status;
    files->push_back(std::move(file));
  }
  return Status::Ok();
}

// The tensor's data as uint16_t: in place when 2-byte aligned (always, unless an odd-sized
// tensor precedes it), else copied into the dataset.
const uint16_t* AlignedBf16(const uint8_t* bytes, size_t count, Dataset* dataset) {
  if (reinterpret_cast<uintptr_t>(bytes) % alignof(uint16_t) == 0) {
    return reinterpret_cast<const uint16_t*>(bytes);
  }
  dataset->snapshots.emplace_back(count);
  std::memcpy(dataset->snapshots.back().data(), bytes, count * 2);
  return dataset->snapshots.back().data();
}

}  // namespace

Status LoadCheckpointDir(const std::string& dir, Dataset* dataset) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status(ErrorCode::kInvalidArgument, dir + ": not a directory");
  std::vector<std::string> steps;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_directory() ||
        (entry.is_regular_file() && entry.path().extension() == ".safetensors")) {
      steps.push_back(entry.path().string());
    }
  }
  std::sort(steps.begin(), steps.end());
  if (steps.size() < 2) {
    return Status(ErrorCode::kInvalidArgument, dir + ": needs at least 2 checkpoints");
  }
  *dataset = Dataset();
  dataset->name = fs::path(dir).filename().string();
  if (dataset->name.empty()) dataset->name = fs::path(dir).parent_path().filename().string();
  // Files of step s are files[first_file[s], first_file[s + 1]).
  std::vector<size_t> first_file;
  for (const std::string& step : steps) {
    first_file.push_back(dataset->files.size());
    Status status = OpenCheckpoint(step, &dataset->files);
    if (!status.ok()) return status;
  }
  first_file.push_back(dataset->files.size());
  // Index each step's BF16 tensors by name (after all files are opened: no reallocation).
  std::vector<std::map<std::string, Located>> by_step(steps.size());
  for (size_t s = 0; s < steps.size(); ++s) {
    for (size_t f = first_file[s]; f < first_file[s + 1]; ++f) {
      for (const safetensors::TensorInfo& info : dataset->files[f].tensors()) {
        if (info.dtype == "BF16") by_step[s][info.name] = Located{&dataset->files[f], &info};
      }
    }
  }
  for (size_t s = 1; s < steps.size(); ++s) {
    StepPair pair;
    for (const auto& [name, prev] : by_step[s - 1]) {
      const auto it = by_step[s].find(name);
      if (it == by_step[s].end() || it->second.info->shape != prev.info->shape) continue;
      const std::vector<uint64_t>& shape = prev.info->shape;
      TensorPair t;
      t.name = name;
      t.count = prev.info->size() / 2;
      t.rows = shape.empty() ? 1 : shape[0];
      t.cols = t.rows ? t.count / t.rows : 0;
      if (t.count == 0) continue;
      t.prev = AlignedBf16(prev.file->data(*prev.info), t.count, dataset);
      t.next = AlignedBf16(it->second.file->data(*it->second.info), t.count, dataset);
      pair.tensors.push_back(std::move(t));
    }
    // Tensors in file order (data offsets) rather than name order, as a trainer sends them.
    std::stable_sort(pair.tensors.begin(), pair.tensors.end(),
                     [](const TensorPair& a, const TensorPair& b) { return a.prev < b.prev; });
    if (pair.tensors.empty()) {
      return Status(ErrorCode::kInvalidArgument,
                    steps[s] + ": no BF16 tensor shared with the previous step");
    }
    dataset->pairs.push_back(std::move(pair));
  }
  return Status::Ok();
}

Status WriteSnapshots(const std::string& dir, const std::vector<TensorLayout>& layout,
                      const std::vector<std::vector<uint16_t>>& snapshots) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::vector<safetensors::TensorInfo> infos;
  for (const TensorLayout& t : layout) {
    safetensors::TensorInfo info;
    info.name = t.name;
    info.dtype = "BF16";
    info.shape =
        t.cols == 1 ? std::vector<uint64_t>{t.rows} : std::vector<uint64_t>{t.rows, t.cols};
    info.end = 2 * t.count();  // BuildHeader lays the tensors out by their sizes
    infos.push_back(std::move(info));
  }
  const std::vector<uint8_t> header =
      safetensors::BuildHeader(&infos, {{"generator", "arc_bench"}});
  for (size_t s = 0; s < snapshots.size(); ++s) {
    char name[48];
    std::snprintf(name, sizeof(name), "step_%03zu.safetensors", s);
    const std::string path = (fs::path(dir) / name).string();
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return Status(ErrorCode::kInvalidArgument, path + ": cannot create");
    bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
    for (const TensorLayout& t : layout) {
      ok = ok && std::fwrite(snapshots[s].data() + t.offset, 2, t.count(), f) == t.count();
    }
    ok = (std::fclose(f) == 0) && ok;
    if (!ok) return Status(ErrorCode::kInvalidArgument, path + ": write failed");
  }
  return Status::Ok();
}

}  // namespace bench
}  // namespace arc_v3
