// Staged apply of a container onto tensors in memory (see tensor_apply.h).
#include "src/checkpoint/tensor_apply.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>

#include "src/common/parallel.h"
#include "src/common/status_macros.h"
#include "src/checkpoint/safetensors.h"

namespace arc_v3 {
namespace checkpoint {
namespace {

Status WrongBase(const std::string& what) {
  return Status(ErrorCode::kChecksumMismatch, "wrong base: " + what);
}

std::string Rows(uint64_t begin, uint64_t end) {
  return std::to_string(begin) + ":" + std::to_string(end);
}

std::string Shape(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The held rows of a tensor of the container's dtype and shape, or null.
const HeldTensor* HeldAs(const HeldTensors& held, const TensorEntry& t) {
  const auto it = held.find(t.name);
  if (it == held.end() || it->second.dtype != t.dtype || it->second.shape != t.shape)
    return nullptr;
  return &it->second;
}

}  // namespace

Status TensorApply::Plan(const Reader* reader, size_t file, const HeldTensors& held,
                         const RowsWanted& wanted, const Allocate& allocate, bool in_place) {
  reader_ = reader;
  file_ = file;
  targets_.clear();
  by_name_.clear();
  tasks_.clear();
  undo_.clear();
  changed_ = 0;
  const FileEntry& f = reader->manifest().files[file];
  std::set<uint64_t> groups;
  for (const TensorEntry& t : f.tensors) {
    const std::pair<uint64_t, uint64_t> rows = wanted(t);
    if (rows.first >= rows.second || t.bytes() == 0) continue;
    if (rows.second > t.rows())
      return Status(ErrorCode::kInternal, "rows past the end of '" + t.name + "'");
    const uint64_t rb = t.row_bytes();
    Target target;
    target.tensor = &t;
    const HeldTensor* h = HeldAs(held, t);
    if (t.kind == TensorKind::kDelta) {
      const auto any = held.find(t.name);
      if (any == held.end())
        return WrongBase("tensor '" + t.name + "' is missing from " + base_name_);
      if (h == nullptr) {
        return WrongBase("tensor '" + t.name + "' is " + any->second.dtype + " " +
                         Shape(any->second.shape) + " in " + base_name_ + ", the delta expects " +
                         t.dtype + " " + Shape(t.shape));
      }
      if (h->row_begin > rows.first || h->row_end < rows.second) {
        return WrongBase("rows " + Rows(rows.first, rows.second) + " of tensor '" + t.name +
                         "' are not held (only " + Rows(h->row_begin, h->row_end) + ")");
      }
      target.base = h->data + (rows.first - h->row_begin) * rb;
    }
    if (in_place && h != nullptr && h->row_begin == rows.first && h->row_end == rows.second) {
      target.held = *h;
      target.in_place = true;
    } else {
      target.held.dtype = t.dtype;
      target.held.shape = t.shape;
      target.held.row_begin = rows.first;
      target.held.row_end = rows.second;
      ARC_V3_RETURN_IF_ERROR(allocate(t, rows.first, rows.second, &target.held));
    }
    if (t.grouped()) {
      if (groups.insert(t.group).second)
        tasks_.push_back({nullptr, &f.groups[t.group], targets_.size()});
    } else {
      for (const Piece& p : t.pieces) {
        if (p.row_end <= rows.first || p.row_begin >= rows.second) continue;
        if (p.row_begin < rows.first || p.row_end > rows.second) {
          return Status(ErrorCode::kInternal, "rows " + Rows(rows.first, rows.second) + " of '" +
                                                  t.name + "' cut a piece (rows " +
                                                  Rows(p.row_begin, p.row_end) + ")");
        }
        tasks_.push_back({&p, nullptr, targets_.size()});
      }
    }
    by_name_[t.name] = targets_.size();
    targets_.push_back(std::move(target));
  }
  // A group decodes onto every member's base: each must be held whole.
  member_base_.clear();
  for (uint64_t g : groups) {
    for (size_t member : f.groups[g].members) {
      const TensorEntry& m = f.tensors[member];
      const HeldTensor* h = HeldAs(held, m);
      if (h == nullptr || h->row_begin != 0 || h->row_end != m.rows()) {
        return WrongBase("tensor '" + m.name +
                         "' is not held whole (its group needs every member)");
      }
      member_base_[m.name] = h->data;
    }
  }
  return Status::Ok();
}

namespace {

// Appends to `undo` the old value of every element of `held` (`count` of `element` bytes)
// that differs from `decoded`, then writes `decoded` over `held`. Throws only before
// anything is written. Returns the number of changed elements.
uint64_t WriteKeepingOld(const uint8_t* decoded, uint8_t* held, uint64_t count, size_t element,
                         std::vector<uint8_t>* undo) {
  uint64_t changed = 0, gap = 0;
  const uint64_t bytes = count * element;
  // Whole 8-byte words first (unchanged words are the common case).
  const uint64_t per_word = element <= 8 && 8 % element == 0 ? 8 / element : 1;
  for (uint64_t e = 0; e < count;) {
    if (per_word > 1 && e % per_word == 0 && e + per_word <= count &&
        std::memcmp(decoded + e * element, held + e * element, 8) == 0) {
      e += per_word;
      gap += per_word;
      continue;
    }
    if (std::memcmp(decoded + e * element, held + e * element, element) != 0) {
      for (; gap >= 0x80; gap >>= 7) undo->push_back(static_cast<uint8_t>(gap | 0x80));
      undo->push_back(static_cast<uint8_t>(gap));
      undo->insert(undo->end(), held + e * element, held + (e + 1) * element);
      gap = 0;
      ++changed;
    } else {
      ++gap;
    }
    ++e;
  }
  std::memcpy(held, decoded, bytes);
  return changed;
}

// Checks the bases of a group's members (`member_base`: each held whole) and decodes the
// group into `decoded`: the members' target bytes, back to back.
Status DecodeHeldGroup(const Reader& reader, const FileEntry& f, const Group& g,
                       const std::map<std::string, const uint8_t*>& member_base,
                       std::vector<uint8_t>* scratch, std::vector<uint16_t>* decoded) {
  std::vector<const uint8_t*> bases;
  std::vector<uint64_t> bytes;
  for (size_t member : g.members) {
    const TensorEntry& m = f.tensors[member];
    bases.push_back(member_base.at(m.name));  // Plan checked every member is held
    bytes.push_back(m.bytes());
  }
  for (size_t k = 0; k < bases.size(); ++k) {
    const TensorEntry& m = f.tensors[g.members[k]];
    if (Hash(bases[k], m.bytes()) != m.base_xxh3) {
      return WrongBase("tensor '" + m.name + "' differs from the delta's base (checksum mismatch)");
    }
  }
  const uint8_t* stored = nullptr;
  Status s = reader.ReadGroup(g, scratch, &stored);
  if (s.ok()) s = DecodeGroup(g, stored, bases, bytes, decoded);
  if (!s.ok()) {
    const std::string& first = f.tensors[g.members[0]].name;
    return Status(s.code(), "group of tensor '" + first + "': " + s.message());
  }
  return Status::Ok();
}

// Reads and decodes the rows of tensor `e` that piece `p` covers onto `base` (nullptr:
// none) into `out`. A failure names the tensor, or the wrong base when the base rows
// differ from the delta's.
Status DecodeHeldPiece(const Reader& reader, const TensorEntry& e, const Piece& p,
                       const uint8_t* base, std::vector<uint8_t>* scratch, uint8_t* out) {
  const uint64_t bytes = (p.row_end - p.row_begin) * e.row_bytes();
  const uint8_t* stored = nullptr;
  Status s = reader.ReadPiece(p, scratch, &stored);
  if (s.ok()) s = DecodePiece(p, stored, base, bytes, safetensors::DTypeSize(e.dtype), out);
  if (s.ok()) return s;
  if (base != nullptr && Hash(base, bytes) != p.base_xxh3) {
    return WrongBase("tensor '" + e.name + "' rows " + Rows(p.row_begin, p.row_end) +
                     " differ from the delta's base (checksum mismatch)");
  }
  return Status(s.code(), "tensor '" + e.name + "': " + s.message());
}

}  // namespace

Status TensorApply::Decode(int threads) {
  const auto start = std::chrono::steady_clock::now();
  const FileEntry& f = reader_->manifest().files[file_];
  const size_t workers = WorkerCount(threads, tasks_.size());
  std::vector<std::vector<uint8_t>> scratch(workers), buffers(workers);
  std::vector<std::vector<uint16_t>> group_buffers(workers);
  std::vector<std::vector<Undo>> undo(tasks_.size());  // per task
  std::vector<uint64_t> changed(tasks_.size(), 0);
  FirstError first;
  // Writes `decoded` over rows of an in-place target from element `at`, keeping the old values.
  const auto write_in_place = [&](size_t i, size_t target, const uint8_t* decoded, uint64_t bytes,
                                  uint64_t at, size_t element) {
    const Target& t = targets_[target];
    undo[i].emplace_back();
    Undo& u = undo[i].back();
    u.target = target;
    u.first = at / element;
    changed[i] += WriteKeepingOld(decoded, t.held.data + at, bytes / element, element, &u.record);
  };
  const Status thrown = TryParallelFor(tasks_.size(), workers, [&](size_t i, size_t w) {
    if (first.Skip(i)) return;
    const Task& task = tasks_[i];
    if (task.group != nullptr) {
      const Status s =
          DecodeHeldGroup(*reader_, f, *task.group, member_base_, &scratch[w], &group_buffers[w]);
      if (!s.ok()) return first.Set(i, s);
      // Every member decoded and verified: now written.
      const uint8_t* at = reinterpret_cast<const uint8_t*>(group_buffers[w].data());
      for (size_t member : task.group->members) {
        const TensorEntry& m = f.tensors[member];
        const auto kept = by_name_.find(m.name);
        if (kept != by_name_.end()) {  // else a member decoded for its group only
          const Target& t = targets_[kept->second];
          if (t.in_place) {
            write_in_place(i, kept->second, at, m.bytes(), 0, 2);
          } else {
            std::memcpy(t.held.data, at, m.bytes());
          }
        }
        at += m.bytes();
      }
      return;
    }
    const Target& t = targets_[task.target];
    const Piece& p = *task.piece;
    const uint64_t rb = t.tensor->row_bytes();
    const uint64_t bytes = (p.row_end - p.row_begin) * rb;
    const uint64_t at = (p.row_begin - t.held.row_begin) * rb;
    uint8_t* out = t.held.data + at;
    if (t.in_place) {
      buffers[w].resize(bytes);
      out = buffers[w].data();
    }
    const uint8_t* base = t.base != nullptr ? t.base + at : nullptr;
    const Status s = DecodeHeldPiece(*reader_, *t.tensor, p, base, &scratch[w], out);
    if (!s.ok()) return first.Set(i, s);
    const size_t element = safetensors::DTypeSize(t.tensor->dtype);
    if (t.in_place) write_in_place(i, task.target, out, bytes, at, element);
  });
  undo_.clear();
  for (std::vector<Undo>& u : undo) {
    for (Undo& one : u) undo_.push_back(std::move(one));
  }
  decode_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!thrown.ok() || !first.status().ok()) {
    Rollback();
    return thrown.ok() ? first.status() : thrown;
  }
  changed_ = 0;
  for (uint64_t c : changed) changed_ += c;
  return Status::Ok();
}

void TensorApply::Restore(const std::vector<Undo>& undo) const {
  for (const Undo& u : undo) {
    const Target& t = targets_[u.target];
    const size_t element = safetensors::DTypeSize(t.tensor->dtype);
    uint64_t e = u.first;
    for (size_t k = 0; k < u.record.size();) {
      uint64_t gap = 0;
      for (int shift = 0;; shift += 7) {
        const uint8_t b = u.record[k++];
        gap |= uint64_t{b & 0x7fu} << shift;
        if ((b & 0x80) == 0) break;
      }
      e += gap;
      std::memcpy(t.held.data + e * element, u.record.data() + k, element);
      k += element;
      ++e;
    }
  }
}

void TensorApply::Rollback() {
  Restore(undo_);
  undo_.clear();
  targets_.clear();  // new memory is released with its owner
  by_name_.clear();
  tasks_.clear();
  changed_ = 0;
}

void TensorApply::Commit(HeldTensors* held) {
  undo_.clear();
  HeldTensors next;
  for (Target& t : targets_) next[t.tensor->name] = std::move(t.held);
  *held = std::move(next);
  targets_.clear();
  by_name_.clear();
  tasks_.clear();
}

uint64_t TensorApply::undo_bytes() const {
  uint64_t bytes = 0;
  for (const Undo& u : undo_) bytes += u.record.size();
  return bytes;
}

}  // namespace checkpoint
}  // namespace arc_v3
