#include "src/checkpoint/inspect.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <utility>

#include "src/checkpoint/checkpoint_delta.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"
#include "src/checkpoint/safetensors.h"

namespace arc_v3 {
namespace checkpoint {
namespace {

// Counts a decoded group's changes into its members' entries (a tensor is in one group at
// most: workers counting different groups share no entry).
void CountMembers(const Checkpoint& base, const GroupInspection& g, const std::vector<uint16_t>& decoded,
                  const std::map<const TensorEntry*, size_t>& index, std::vector<TensorInspection>* tensors) {
  const uint16_t* next = decoded.data();
  for (size_t member : g.group->members) {
    const TensorEntry& t = g.file->tensors[member];
    const uint8_t* prev = base.Find(t.name)->data;  // ApplyGroup found it
    TensorInspection& st = (*tensors)[index.at(&t)];
    for (uint64_t e = 0; e < st.elements; ++e, ++next) {
      uint16_t old_bits;
      std::memcpy(&old_bits, prev + 2 * e, 2);  // base tensors may be unaligned
      const uint16_t flipped = static_cast<uint16_t>(old_bits ^ *next);
      st.changed += flipped != 0;
      st.high += (flipped & 0xFF80) != 0;  // sign or exponent field
    }
  }
}

// Groups: their payloads' chunk coders, and with the base each member's changes, counted
// on the decoded group (a group's bytes are not split among its members).
Status InspectGroups(const Checkpoint* base, int threads, const std::map<const TensorEntry*, size_t>& index,
                     Inspection* out) {
  const Reader& reader = out->reader;
  std::vector<Status> errors(out->groups.size());
  ParallelFor(out->groups.size(), WorkerCount(threads, out->groups.size()), [&](size_t i, size_t) {
    GroupInspection& g = out->groups[i];
    std::vector<uint8_t> scratch;
    const uint8_t* bytes = nullptr;
    errors[i] = reader.ReadGroup(*g.group, &scratch, &bytes);
    if (errors[i].ok()) errors[i] = delta_stats(bytes, g.group->size, &g.payload);
    if (!errors[i].ok() || base == nullptr) return;
    std::vector<uint16_t> decoded;
    errors[i] = ApplyGroup(*base, reader, *g.file, *g.group, &decoded, "");
    if (!errors[i].ok()) return;
    CountMembers(*base, g, decoded, index, &out->tensors);
    g.counted = true;
  });
  for (size_t i = 0; i < out->groups.size(); ++i) {
    GroupInspection& g = out->groups[i];
    if (!errors[i].ok()) {
      const TensorEntry& first = g.file->tensors[g.group->members[0]];
      return Status(errors[i].code(), "group " + std::to_string(i) + " (tensor '" + first.name +
                                          "' ...): " + errors[i].message());
    }
    for (size_t member : g.group->members) {
      const size_t k = index.at(&g.file->tensors[member]);
      TensorInspection& st = out->tensors[k];
      g.changed += st.changed;
      st.has_high = true;
      st.counts_known = g.counted;
      std::copy(g.payload.chunk_modes, g.payload.chunk_modes + 5, st.chunk_modes);
      st.coders.insert(CoderName(Coder::kArcV3));
    }
  }
  return Status::Ok();
}

// The statistics of one arc_v3 piece; with its base rows, counted on them.
Status InspectPiece(const Reader& reader, const TensorEntry& t, const Piece& p, const Checkpoint* base,
                    PayloadStats* stats) {
  std::vector<uint8_t> scratch;
  const uint8_t* bytes = nullptr;
  ARC_V3_RETURN_IF_ERROR(reader.ReadPiece(p, &scratch, &bytes));
  const TensorView* info = base == nullptr ? nullptr : base->Find(t.name);
  if (info == nullptr || info->dtype != t.dtype || info->shape != t.shape) return delta_stats(bytes, p.size, stats);
  const uint64_t row_bytes = t.row_bytes();
  const size_t n = (p.row_end - p.row_begin) * row_bytes;
  std::vector<uint16_t> rows(n / 2);  // aligned copy of the base rows
  std::memcpy(rows.data(), info->data + p.row_begin * row_bytes, n);
  if (Hash(rows.data(), n) != p.base_xxh3) {
    return Status(ErrorCode::kChecksumMismatch,
                  "wrong base: rows " + std::to_string(p.row_begin) + ":" + std::to_string(p.row_end) + " differ");
  }
  return delta_stats(rows.data(), rows.size(), bytes, p.size, stats);
}

Status InspectPieces(const Checkpoint* base, int threads, Inspection* out) {
  std::vector<std::pair<size_t, const Piece*>> pieces;  // (tensor, piece)
  for (size_t i = 0; i < out->tensors.size(); ++i) {
    for (const Piece& p : out->tensors[i].entry->pieces) pieces.emplace_back(i, &p);
  }
  std::vector<PayloadStats> payload(pieces.size());
  std::vector<Status> errors(pieces.size());
  ParallelFor(pieces.size(), WorkerCount(threads, pieces.size()), [&](size_t i, size_t) {
    const Piece& p = *pieces[i].second;
    if (p.coder != Coder::kArcV3) return;
    errors[i] = InspectPiece(out->reader, *out->tensors[pieces[i].first].entry, p, base, &payload[i]);
  });
  for (size_t i = 0; i < pieces.size(); ++i) {
    TensorInspection& t = out->tensors[pieces[i].first];
    if (!errors[i].ok()) {
      return Status(errors[i].code(), "tensor '" + t.entry->name + "': " + errors[i].message());
    }
    const Piece& p = *pieces[i].second;
    t.stored += p.size;
    t.coders.insert(CoderName(p.coder));
    if (p.coder == Coder::kArcV3) {
      t.changed += payload[i].changed;
      t.high += payload[i].exponent_or_sign;
      t.has_high = true;
      t.counts_known = t.counts_known && payload[i].counts_known;
      for (int k = 0; k < 5; ++k) t.chunk_modes[k] += payload[i].chunk_modes[k];
    } else {
      t.changed += p.changed;
    }
  }
  return Status::Ok();
}

}  // namespace

Status Inspect(const std::string& path, const std::string& base_path, int threads, Inspection* out) {
  *out = Inspection();
  std::unique_ptr<MappedFile> file;
  Status s = MappedFile::Open(path, &file);
  if (s.ok()) s = Reader::Open(std::move(file), &out->reader);
  if (!s.ok()) return Status(s.code(), path + ": " + s.message());
  Checkpoint base;
  if (!base_path.empty()) {
    ARC_V3_RETURN_IF_ERROR(Checkpoint::Open(base_path, &base));
  }
  std::map<const TensorEntry*, size_t> index;
  for (const FileEntry& f : out->reader.manifest().files) {
    for (const TensorEntry& t : f.tensors) {
      TensorInspection st;
      st.entry = &t;
      st.bytes = t.bytes();
      const size_t es = safetensors::DTypeSize(t.dtype);
      st.elements = es ? st.bytes / es : 0;
      index[&t] = out->tensors.size();
      out->tensors.push_back(std::move(st));
    }
    for (const Group& g : f.groups) {
      for (size_t member : g.members) out->tensors[index.at(&f.tensors[member])].group = out->groups.size();
      GroupInspection gi;
      gi.file = &f;
      gi.group = &g;
      out->groups.push_back(gi);
    }
  }
  const Checkpoint* with = base_path.empty() ? nullptr : &base;
  s = InspectGroups(with, threads, index, out);
  if (s.ok()) s = InspectPieces(with, threads, out);
  return s;
}

std::string ArcV3CoderNames(const uint64_t chunk_modes[5]) {
  static const char* const kModes[5] = {"unchanged", "xor", "modelled", "rans", "rans_history"};
  std::string modes;
  for (int k = 1; k < 5; ++k) {
    if (chunk_modes[k] > 0) modes += (modes.empty() ? "" : "+") + std::string(kModes[k]);
  }
  return std::string(CoderName(Coder::kArcV3)) + ":" + (modes.empty() ? std::string(kModes[0]) : modes);
}

}  // namespace checkpoint
}  // namespace arc_v3
