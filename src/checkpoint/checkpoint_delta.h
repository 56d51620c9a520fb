// Diff, apply and verify whole safetensors checkpoints (single files or sharded
// directories) through the delta container of container.h. Inputs are memory-mapped,
// pieces are coded in parallel, and outputs are written aside, fsynced and renamed, so a
// failure or a kill never leaves a half-written file under a final name.
#ifndef ARC_V3_SRC_CHECKPOINT_CHECKPOINT_DELTA_H_
#define ARC_V3_SRC_CHECKPOINT_CHECKPOINT_DELTA_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "arc_v3_checkpoint.hpp"
#include "src/checkpoint/container.h"
#include "src/checkpoint/safetensors.h"

namespace arc_v3 {
namespace checkpoint {

// One tensor of a checkpoint, wherever its bytes are.
struct TensorView {
  std::string name;
  std::string dtype;  // a safetensors dtype: "BF16", "F32", ...
  std::vector<uint64_t> shape;
  const uint8_t* data = nullptr;  // `bytes` bytes
  uint64_t bytes = 0;
  uint64_t offset = 0;  // within its file's data section
};

// One file of a checkpoint, as its safetensors layout: the header (the 8-byte length and
// the JSON) in bytes [0, data_start), then the tensors at data_start + offset.
struct FileView {
  std::string name;  // a plain file name
  const uint8_t* header = nullptr;
  uint64_t data_start = 0, size = 0;
  const uint8_t* raw = nullptr;     // the whole file where it is mapped (its gaps are kept)
  std::vector<TensorView> tensors;  // by data offset
};

// A checkpoint opened for reading, as named tensors: one .safetensors file or a directory
// of shards (memory-mapped), or tensors in the caller's memory (one file whose header is
// the one safetensors::BuildHeader writes for them). Movable; the views stay valid.
class Checkpoint {
 public:
  // Errors: kInvalidArgument (missing, unreadable or malformed files). An empty path
  // opens a checkpoint without tensors.
  static Status Open(const std::string& path, Checkpoint* checkpoint);
  // `tensors` (name, dtype, shape, data; bytes, offset are set here) as one file named
  // `file_name`, in this order. The memory must outlive the checkpoint. Errors:
  // kInvalidArgument (unknown dtype, size not dtype x shape, a name twice).
  static Status FromMemory(const std::string& file_name, std::vector<TensorView> tensors,
                           Checkpoint* checkpoint);
  // The same for the tensors of arc_v3_checkpoint.hpp.
  static Status FromMemory(const std::string& file_name, const std::vector<NamedTensor>& tensors,
                           Checkpoint* checkpoint);
  bool directory() const { return directory_; }
  bool empty() const { return files_.empty(); }
  // Whether the tensors are memory-mapped files: their pages may be let go once read
  // (they come back from the page cache), never so caller memory.
  bool mapped() const { return !mapped_.empty(); }
  const std::string& path() const { return path_; }  // for messages
  const std::vector<FileView>& files() const { return files_; }
  // The tensor (and the file holding it); nullptr if absent.
  const TensorView* Find(const std::string& name, const FileView** file = nullptr) const;
  // model.safetensors.index.json, if the directory has one ("" otherwise).
  const std::string& index_path() const { return index_path_; }

 private:
  Status Add(FileView file);

  std::string path_;
  bool directory_ = false;
  std::vector<safetensors::File> mapped_;      // what files_ points into
  std::vector<std::vector<uint8_t>> headers_;  // synthesized headers of memory files
  std::vector<FileView> files_;
  std::map<std::string, std::pair<size_t, size_t>> by_name_;  // -> (file, tensor)
  std::string index_path_;
};

// The public options (arc_v3_checkpoint.hpp) and a test hook.
struct RunOptions : CheckpointOptions {
  RunOptions() = default;
  explicit RunOptions(const CheckpointOptions& options) : CheckpointOptions(options) {}
  // Called at "piece" (after each piece is written aside, or encoded by Diff) and
  // "rename" (all outputs written and synced, before the first rename); an error aborts
  // the run.
  std::function<Status(const char* stage)> hook;
};
using RunReport = CheckpointReport;

// A tensor's checksum as containers record it (the target_xxh3 of an ungrouped tensor):
// XXH3 over the XXH3s of its row blocks of about kPieceElements elements (src/checkpoint/FORMAT.md,
// "Tensor"). `data` holds t.bytes() bytes.
uint64_t TensorChecksum(const TensorEntry& t, const uint8_t* data);

// Writes the delta from checkpoint `prev` to `next` (both files or both directories).
// An empty `prev` writes an anchor: every tensor carried whole, needing no base.
Status Diff(const std::string& prev, const std::string& next, const std::string& delta_path,
            const RunOptions& options, RunReport* report);
// The same from opened checkpoints (files or memory), to a file or into `delta`.
Status Diff(const Checkpoint& prev, const Checkpoint& next, const std::string& delta_path,
            const RunOptions& options, RunReport* report);
Status Diff(const Checkpoint& prev, const Checkpoint& next, const RunOptions& options,
            std::vector<uint8_t>* delta, RunReport* report);

// Rebuilds the target of `delta_path` from `prev` into `out` (a file or a directory, as
// the delta's layout says; `out` == `prev` applies in place; an empty `prev` applies an
// anchor, which needs no base). Wrong base: kChecksumMismatch
// naming the tensor; corrupt delta: kTruncated, kBadMagic, kCorrupt*, ...
Status Apply(const std::string& prev, const std::string& delta_path, const std::string& out,
             const RunOptions& options, RunReport* report);

// Checks that `prev` is the base of `delta_path` (every delta tensor present with the
// recorded dtype, shape and checksum) without writing anything.
Status Verify(const std::string& prev, const std::string& delta_path, const RunOptions& options,
              RunReport* report);

// Partial apply: decodes rows [row_begin, row_end) (clipped to the tensor) of one target
// tensor into `out` (row_bytes * rows long), reading only the overlapping pieces of the
// delta and checking the base rows they cover. A grouped tensor reads its group and
// needs the base of every member.
Status ApplyRows(const Checkpoint& base, const Reader& delta, const TensorEntry& tensor,
                 uint64_t row_begin, uint64_t row_end, uint8_t* out, int threads);

// Checks the bases of a group's members (a mismatch names the member and, unless empty,
// `needed_by`, the tensor it is needed for), reads the group and decodes it into
// `decoded`: the members' target bytes, back to back.
Status ApplyGroup(const Checkpoint& base, const Reader& reader, const FileEntry& file,
                  const Group& group, std::vector<uint16_t>* decoded, const std::string& needed_by);

// Partial apply into a new safetensors file: every target tensor whose name matches the
// ECMAScript regular expression `tensor_regex` (whole-name match), sliced to rows
// [row_begin, row_end) of its first dimension (rank-0 tensors whole).
Status ApplyPartial(const std::string& prev, const std::string& delta_path,
                    const std::string& tensor_regex, uint64_t row_begin, uint64_t row_end,
                    const std::string& out_path, const RunOptions& options, RunReport* report);

}  // namespace checkpoint
}  // namespace arc_v3

#endif  // ARC_V3_SRC_CHECKPOINT_CHECKPOINT_DELTA_H_
