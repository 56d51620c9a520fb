#include "src/checkpoint/inspect.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "src/checkpoint/checkpoint_delta.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"
#include "src/checkpoint/safetensors.h"

namespace arc_v3 {
namespace checkpoint {
namespace {

struct TensorInspection {
  const TensorEntry* entry = nullptr;
  uint64_t elements = 0, bytes = 0;
  uint64_t stored = 0;       // bytes of its pieces
  uint64_t changed = 0;      // elements that change (a whole tensor: 0)
  uint64_t high = 0;         // of them, changes of the sign or exponent field (has_high)
  bool has_high = false;     // arc_v3-coded: `high` and `chunk_modes` are known
  bool counts_known = true;  // false: modelled chunks that only the base can count
  uint64_t chunk_modes[5] = {0, 0, 0, 0, 0};  // arc_v3 chunks by ChunkMode
  std::set<std::string> coders;               // CoderName of each piece
  int64_t group = -1;                         // index in Inspection::groups, or -1
};

struct GroupInspection {
  const FileEntry* file = nullptr;
  const Group* group = nullptr;
  PayloadStats payload;
  bool counted = false;  // the members' changes were counted (a base was given)
  uint64_t changed = 0;  // over its members, when counted
};

struct Inspection {
  const Reader* reader = nullptr;
  bool payloads = true;                   // the arc_v3 payloads are read (else the manifest alone)
  std::vector<TensorInspection> tensors;  // in manifest order
  std::vector<GroupInspection> groups;    // in manifest order
};

// Which chunk coders an arc_v3 payload chose, e.g. "arc_v3:rans+modelled".
std::string ArcV3CoderNames(const uint64_t chunk_modes[5]) {
  static const char* const kModes[5] = {"unchanged", "xor", "modelled", "rans", "rans_history"};
  std::string modes;
  for (int k = 1; k < 5; ++k) {
    if (chunk_modes[k] > 0) modes += (modes.empty() ? "" : "+") + std::string(kModes[k]);
  }
  return std::string(CoderName(Coder::kArcV3)) + ":" +
         (modes.empty() ? std::string(kModes[0]) : modes);
}

ArcV3Chunks Chunks(const uint64_t chunk_modes[5]) {
  ArcV3Chunks c;
  c.unchanged = chunk_modes[0];
  c.xor_streams = chunk_modes[1];
  c.modelled = chunk_modes[2];
  c.rans = chunk_modes[3];
  c.rans_history = chunk_modes[4];
  return c;
}

// The tensor's coders, an arc_v3 payload's named by its chunk modes.
std::string CoderSummary(const TensorInspection& st) {
  std::string coders;
  for (const auto& cn : st.coders) {
    coders += (coders.empty() ? "" : "+");
    coders += cn == CoderName(Coder::kArcV3) && st.has_high ? ArcV3CoderNames(st.chunk_modes) : cn;
  }
  return coders.empty() ? "-" : coders;
}

DeltaTensorInfo TensorInfo(const TensorInspection& st) {
  const TensorEntry& t = *st.entry;
  DeltaTensorInfo ti;
  ti.name = t.name;
  ti.kind = TensorKindName(t.kind);
  ti.dtype = t.dtype;
  ti.shape = t.shape;
  for (const Piece& p : t.pieces) ti.coders.push_back(CoderName(p.coder));
  if (t.grouped()) ti.coders.push_back(CoderName(Coder::kArcV3));  // inside its group's payload
  ti.group = st.group;
  ti.elements = st.elements;
  ti.bytes = st.bytes;
  ti.pieces = t.pieces.size();
  ti.delta_bytes = st.stored;
  ti.coder_summary = CoderSummary(st);
  ti.chunks_known = st.has_high;
  if (st.has_high) ti.chunks = Chunks(st.chunk_modes);
  ti.changes_known = t.kind == TensorKind::kDelta && st.counts_known;
  if (ti.changes_known) {
    ti.changed = st.changed;
    ti.high = st.high;
  }
  return ti;
}

DeltaGroupInfo GroupInfo(const GroupInspection& gs, bool payloads) {
  DeltaGroupInfo gi;
  gi.file = gs.file->name;
  gi.tensors = gs.group->members.size();
  gi.elements = gs.group->elements;
  gi.delta_bytes = gs.group->size;
  gi.chunks_known = payloads;
  gi.chunks = Chunks(gs.payload.chunk_modes);
  gi.coder_summary = payloads ? ArcV3CoderNames(gs.payload.chunk_modes) : CoderName(Coder::kArcV3);
  gi.changes_known = gs.counted;
  gi.changed = gs.changed;
  return gi;
}

// Counts a decoded group's changes into its members' entries (a tensor is in one group at
// most: workers counting different groups share no entry).
void CountMembers(const Checkpoint& base, const GroupInspection& g,
                  const std::vector<uint16_t>& decoded,
                  const std::map<const TensorEntry*, size_t>& index,
                  std::vector<TensorInspection>* tensors) {
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
Status InspectGroups(const Checkpoint* base, int threads,
                     const std::map<const TensorEntry*, size_t>& index, Inspection* out) {
  const Reader& reader = *out->reader;
  std::vector<Status> errors(out->groups.size());
  ParallelFor(out->groups.size(), WorkerCount(threads, out->groups.size()), [&](size_t i, size_t) {
    if (!out->payloads) return;
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
      st.has_high = out->payloads;
      st.counts_known = g.counted;
      std::copy(g.payload.chunk_modes, g.payload.chunk_modes + 5, st.chunk_modes);
      st.coders.insert(CoderName(Coder::kArcV3));
    }
  }
  return Status::Ok();
}

// The statistics of one arc_v3 piece; with its base rows, counted on them.
Status InspectPiece(const Reader& reader, const TensorEntry& t, const Piece& p,
                    const Checkpoint* base, PayloadStats* stats) {
  std::vector<uint8_t> scratch;
  const uint8_t* bytes = nullptr;
  ARC_V3_RETURN_IF_ERROR(reader.ReadPiece(p, &scratch, &bytes));
  const TensorView* info = base == nullptr ? nullptr : base->Find(t.name);
  if (info == nullptr || info->dtype != t.dtype || info->shape != t.shape)
    return delta_stats(bytes, p.size, stats);
  const uint64_t row_bytes = t.row_bytes();
  const size_t n = (p.row_end - p.row_begin) * row_bytes;
  std::vector<uint16_t> rows(n / 2);  // aligned copy of the base rows
  std::memcpy(rows.data(), info->data + p.row_begin * row_bytes, n);
  if (Hash(rows.data(), n) != p.base_xxh3) {
    return Status(ErrorCode::kChecksumMismatch, "wrong base: rows " + std::to_string(p.row_begin) +
                                                    ":" + std::to_string(p.row_end) + " differ");
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
    if (p.coder != Coder::kArcV3 || !out->payloads) return;
    errors[i] =
        InspectPiece(*out->reader, *out->tensors[pieces[i].first].entry, p, base, &payload[i]);
  });
  for (size_t i = 0; i < pieces.size(); ++i) {
    TensorInspection& t = out->tensors[pieces[i].first];
    if (!errors[i].ok()) {
      return Status(errors[i].code(), "tensor '" + t.entry->name + "': " + errors[i].message());
    }
    const Piece& p = *pieces[i].second;
    t.stored += p.size;
    t.coders.insert(CoderName(p.coder));
    if (p.coder == Coder::kArcV3 && !out->payloads) {
      t.counts_known = false;
    } else if (p.coder == Coder::kArcV3) {
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

Status Inspect(const Reader& reader, bool payloads, const Checkpoint* base, int threads,
               DeltaInfo* info) {
  *info = DeltaInfo();
  Inspection out;
  out.reader = &reader;
  out.payloads = payloads || base != nullptr;
  std::map<const TensorEntry*, size_t> index;
  const Manifest& m = reader.manifest();
  for (const FileEntry& f : m.files) {
    for (const TensorEntry& t : f.tensors) {
      TensorInspection st;
      st.entry = &t;
      st.bytes = t.bytes();
      const size_t es = safetensors::DTypeSize(t.dtype);
      st.elements = es ? st.bytes / es : 0;
      index[&t] = out.tensors.size();
      out.tensors.push_back(std::move(st));
    }
    for (const Group& g : f.groups) {
      for (size_t member : g.members)
        out.tensors[index.at(&f.tensors[member])].group = out.groups.size();
      GroupInspection gi;
      gi.file = &f;
      gi.group = &g;
      out.groups.push_back(gi);
    }
  }
  ARC_V3_RETURN_IF_ERROR(InspectGroups(base, threads, index, &out));
  ARC_V3_RETURN_IF_ERROR(InspectPieces(base, threads, &out));
  info->directory = m.directory;
  info->container_version = reader.version();
  info->files = m.files.size();
  info->delta_bytes = reader.source().size();
  info->manifest_bytes = reader.manifest_size();
  for (const TensorInspection& st : out.tensors) info->tensors.push_back(TensorInfo(st));
  for (const GroupInspection& gs : out.groups) info->groups.push_back(GroupInfo(gs, out.payloads));
  info->removed_tensors = m.removed_tensors;
  info->removed_files = m.removed_files;
  return Status::Ok();
}

}  // namespace checkpoint

Status InspectDeltaFile(const std::string& delta_path, const std::string& base_path, int threads,
                        DeltaInfo* info) {
  *info = DeltaInfo();
  checkpoint::Reader reader;
  std::unique_ptr<checkpoint::MappedFile> file;
  Status s = checkpoint::MappedFile::Open(delta_path, &file);
  if (s.ok()) s = checkpoint::Reader::Open(std::move(file), &reader);
  ARC_V3_RETURN_IF_ERROR_IN(delta_path, s);
  checkpoint::Checkpoint base;
  if (!base_path.empty()) ARC_V3_RETURN_IF_ERROR(checkpoint::Checkpoint::Open(base_path, &base));
  return checkpoint::Inspect(reader, true, base_path.empty() ? nullptr : &base, threads, info);
}

}  // namespace arc_v3
