// Consecutive BF16 checkpoints as the benchmark sees them: a dataset is a list of step
// pairs (prev -> next), each a list of tensors. The memory the pairs point into (mapped
// files or generated snapshots) is owned by the dataset.
#ifndef ARC_V3_BENCH_DATASET_H_
#define ARC_V3_BENCH_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "src/checkpoint/safetensors.h"

namespace arc_v3 {
namespace bench {

// One tensor of one step pair. rows x cols is the tensor as a matrix: shape[0] x the
// product of the other dimensions; a 1-D tensor is n x 1 (as PULSESync's COO treats it).
struct TensorPair {
  std::string name;
  uint64_t rows = 0, cols = 0;
  size_t count = 0;
  const uint16_t* prev = nullptr;
  const uint16_t* next = nullptr;
};

struct StepPair {
  std::vector<TensorPair> tensors;
  uint64_t Elements() const;
};

// Where a tensor lives in a flat snapshot (all tensors concatenated).
struct TensorLayout {
  std::string name;
  uint64_t rows = 0, cols = 0;
  size_t offset = 0;
  size_t count() const { return static_cast<size_t>(rows * cols); }
};

struct Dataset {
  std::string name;
  std::vector<StepPair> pairs;
  // Owners of the memory the pairs point into. Moving a Dataset keeps the pointers valid
  // (vector and mapping storage do not move).
  std::vector<safetensors::File> files;
  std::vector<std::vector<uint16_t>> snapshots;
};

// Builds the pairs of consecutive flat snapshots laid out as `layout`.
Dataset DatasetFromSnapshots(const std::string& name, const std::vector<TensorLayout>& layout,
                             std::vector<std::vector<uint16_t>> snapshots);

// Loads a run directory: its *.safetensors files (or subdirectories, each a sharded
// checkpoint), sorted by name, are consecutive steps. The BF16 tensors present with the
// same shape in every step are used; other dtypes are skipped. Needs >= 2 steps.
Status LoadCheckpointDir(const std::string& dir, Dataset* dataset);

// Writes each snapshot as dir/step_NNN.safetensors (BF16), for tools/stats.py and others.
Status WriteSnapshots(const std::string& dir, const std::vector<TensorLayout>& layout,
                      const std::vector<std::vector<uint16_t>>& snapshots);

}  // namespace bench
}  // namespace arc_v3

#endif  // ARC_V3_BENCH_DATASET_H_
