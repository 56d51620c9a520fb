// Applying a delta container to tensors held in memory (a rollout engine's weights, a
// state dict), all or nothing: each piece is decoded and verified before it is written,
// and tensors updated in place keep an undo record of the values they changed until
// Commit or Rollback. An apply holds the tensors, the undo record (a few bytes per changed
// value) and one decoded piece per thread, never a second copy of the model.
#ifndef ARC_V3_SRC_CHECKPOINT_TENSOR_APPLY_H_
#define ARC_V3_SRC_CHECKPOINT_TENSOR_APPLY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "arc_v3.hpp"
#include "src/checkpoint/container.h"

namespace arc_v3 {
namespace checkpoint {

// Rows [row_begin, row_end) of a tensor (all its rows, or a slice), in writable memory.
struct HeldTensor {
  std::string dtype;
  std::vector<uint64_t> shape;  // the whole tensor's
  uint64_t row_begin = 0, row_end = 0;
  uint8_t* data = nullptr;
  std::shared_ptr<void> owner;  // keeps `data` alive where the holder allocated it (may be null)
};
using HeldTensors = std::map<std::string, HeldTensor>;

// The rows of a tensor an apply keeps, [first, second); empty: not kept.
using RowsWanted = std::function<std::pair<uint64_t, uint64_t>(const TensorEntry&)>;
// Memory for rows [begin, end) of a tensor that is not held as the container needs
// (new, reshaped, other rows, or `in_place` off): fills `held` (data, owner).
using Allocate =
    std::function<Status(const TensorEntry&, uint64_t begin, uint64_t end, HeldTensor* held)>;

class TensorApply {
 public:
  // Decides, for file `file` of the container, what each kept tensor needs: an update in
  // place of its held rows (`in_place`, same dtype, shape and rows) or new memory from
  // `allocate`, decoded onto the held base. Reads no piece. kChecksumMismatch: a delta
  // tensor whose base rows are not held.
  Status Plan(const Reader* reader, size_t file, const HeldTensors& held, const RowsWanted& wanted,
              const Allocate& allocate, bool in_place);
  // Reads, decodes and verifies every piece and group the plan needs (several threads),
  // writing each verified piece: into new memory, or over the held rows in place, whose
  // old values go to the undo record. An error restores the held tensors before it
  // returns. Nothing may read or write the held tensors until Commit or Rollback.
  Status Decode(int threads);
  // How errors name the held tensors (default "the held tensors").
  void set_base_name(std::string name) { base_name_ = std::move(name); }
  // The held tensors after the container: the in-place updates kept, new memory in,
  // tensors the container does not keep gone. Call only after Decode succeeded.
  void Commit(HeldTensors* held);
  // After a successful Decode instead of Commit: the held tensors as they were before it.
  void Rollback();

  uint64_t changed_elements() const { return changed_; }
  uint64_t undo_bytes() const;  // what the undo record holds
  double decode_seconds() const { return decode_seconds_; }

 private:
  struct Target {
    const TensorEntry* tensor = nullptr;
    HeldTensor held;                // where the result goes (new memory, or the held rows in place)
    const uint8_t* base = nullptr;  // the base rows [held.row_begin, ...) for a delta tensor
    bool in_place = false;
  };
  // The old values of the elements one task changed in place, from element `first` of
  // the target's rows: per changed element the LEB128 count of unchanged ones before it,
  // then its old bytes.
  struct Undo {
    size_t target = 0;
    uint64_t first = 0;
    std::vector<uint8_t> record;
  };
  void Restore(const std::vector<Undo>& undo) const;
  struct Task {
    const Piece* piece = nullptr;  // of targets_[target].tensor
    const Group* group = nullptr;
    size_t target = 0;
  };

  const Reader* reader_ = nullptr;
  size_t file_ = 0;
  std::vector<Target> targets_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, const uint8_t*> member_base_;  // of the groups' members
  std::vector<Task> tasks_;
  std::vector<Undo> undo_;
  uint64_t changed_ = 0;
  double decode_seconds_ = 0;
  std::string base_name_ = "the held tensors";
};

}  // namespace checkpoint
}  // namespace arc_v3

#endif  // ARC_V3_SRC_CHECKPOINT_TENSOR_APPLY_H_
