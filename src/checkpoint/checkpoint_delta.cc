// Checkpoint-level diff / apply / verify (see checkpoint_delta.h).
#include "src/checkpoint/checkpoint_delta.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <regex>
#include <set>

#include "src/common/parallel.h"
#include "src/common/file_io.h"
#include "src/common/status_macros.h"

namespace arc_v3 {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr char kIndexName[] = "model.safetensors.index.json";

Status IoError(const std::string& path, const char* what) { return file_io::Error(path, what); }

// Maps the pages of a mapped input range in one call instead of one fault per page (on a
// warm page cache the faults otherwise cost about a fifth of diff's time). Best effort:
// kernels before 5.14 lack MADV_POPULATE_READ and the pages fault in as usual.
void Prefault(const uint8_t* data, uint64_t size) {
#ifdef MADV_POPULATE_READ
  if (data == nullptr || size == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(data) + size;
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ);
#else
  (void)data;
  (void)size;
#endif
}

// Drops the pages of a mapped input range that has been used from this process's page
// tables (they stay in the page cache; never call it on anonymous memory, whose contents
// it would discard), so that resident memory stays about the pieces in
// flight rather than growing to the whole checkpoint. Only pages wholly inside the range
// are released: a page shared with a neighbouring piece would merely fault in again.
void Release(const uint8_t* data, uint64_t size) {
  if (data == nullptr || size == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + size) & ~(page - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

std::string BaseName(const std::string& path) { return fs::path(path).filename().string(); }

// Starts writing [offset, offset + size) of a file to disk without waiting, so that the disk
// works while the other pieces are decoded and the final fsync has little left to do.
// Only a hint: fsync still decides durability, and a failure here is ignored.
void StartWriteback(int fd, uint64_t offset, uint64_t size) {
#if defined(__linux__) && defined(SYNC_FILE_RANGE_WRITE)
  sync_file_range(fd, static_cast<off_t>(offset), static_cast<off_t>(size), SYNC_FILE_RANGE_WRITE);
#else
  (void)fd, (void)offset, (void)size;
#endif
}

// An output path must be in a folder that exists, and may replace a file only when
// `overwrite`.
Status CheckOutput(const std::string& path, bool overwrite) {
  std::error_code ec;
  const fs::path parent = fs::absolute(path, ec).parent_path();
  if (!fs::is_directory(parent, ec)) {
    return Status(ErrorCode::kInvalidArgument,
                  path + ": cannot create: its folder " + parent.string() + " does not exist");
  }
  if (!overwrite && fs::exists(path, ec)) {
    return Status(ErrorCode::kAlreadyExists,
                  path + " already exists: it is not replaced unless asked to overwrite");
  }
  return Status::Ok();
}

// Output files written aside (".NAME.arc_v3-tmp-PID" in the target directory) and renamed
// over their final names only once all of them are complete and synced. Whatever was not
// committed is unlinked on destruction.
class AsideFiles {
 public:
  explicit AsideFiles(bool overwrite) : overwrite_(overwrite) {}
  ~AsideFiles() {
    for (Entry& e : entries_) {
      if (e.fd >= 0) close(e.fd);
      if (!e.committed) unlink(e.temp.c_str());
    }
  }
  // Returns the index of the new file; its size is reserved up front so that a full disk
  // fails here, with a clear error, rather than halfway through.
  Status Create(const std::string& final_path, uint64_t size, size_t* index) {
    ARC_V3_RETURN_IF_ERROR(CheckOutput(final_path, overwrite_));
    Entry e;
    e.final_path = final_path;
    const fs::path p(final_path);
    e.temp = (p.parent_path() /
              ("." + p.filename().string() + ".arc_v3-tmp-" + std::to_string(getpid())))
                 .string();
    unlink(e.temp.c_str());  // a leftover of a killed run of this same pid
    e.fd = open(e.temp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (e.fd < 0) return IoError(e.temp, "cannot create");
    entries_.push_back(e);
    ARC_V3_RETURN_IF_ERROR(file_io::Reserve(entries_.back().fd, size, e.temp));
    *index = entries_.size() - 1;
    return Status::Ok();
  }
  int fd(size_t i) const { return entries_[i].fd; }
  const std::string& temp(size_t i) const { return entries_[i].temp; }

  Status SyncAndClose(bool sync) {
    for (Entry& e : entries_) {
      if (sync && fsync(e.fd) != 0) return IoError(e.temp, "cannot sync");
      if (close(e.fd) != 0) {
        e.fd = -1;
        return IoError(e.temp, "cannot close");
      }
      e.fd = -1;
    }
    return Status::Ok();
  }
  Status Commit(bool sync) {
    std::set<std::string> dirs;
    for (Entry& e : entries_) {
      if (rename(e.temp.c_str(), e.final_path.c_str()) != 0) {
        return IoError(e.final_path, "cannot rename into place");
      }
      e.committed = true;
      dirs.insert(fs::path(e.final_path).parent_path().string());
    }
    if (sync) {
      for (const std::string& d : dirs) {
        ARC_V3_RETURN_IF_ERROR(file_io::SyncDirectory(d.empty() ? "." : d));
      }
    }
    return Status::Ok();
  }

 private:
  struct Entry {
    std::string final_path, temp;
    int fd = -1;
    bool committed = false;
  };
  bool overwrite_;
  std::vector<Entry> entries_;
};

// Splits a tensor into row blocks of about kPieceElements elements.
std::vector<Piece> PlanPieces(const TensorEntry& t) {
  std::vector<Piece> pieces;
  const uint64_t rows = t.rows();
  const uint64_t elements_per_row = t.row_bytes() / safetensors::DTypeSize(t.dtype);
  if (rows == 0 || elements_per_row == 0) return pieces;
  const uint64_t rows_per_piece = std::max<uint64_t>(1, kPieceElements / elements_per_row);
  for (uint64_t r = 0; r < rows; r += rows_per_piece) {
    Piece p;
    p.row_begin = r;
    p.row_end = std::min(rows, r + rows_per_piece);
    pieces.push_back(p);
  }
  return pieces;
}

std::string Shape(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status WrongBase(const std::string& what) {
  return Status(ErrorCode::kChecksumMismatch, "wrong base: " + what);
}

// The base data of one delta tensor, which must have the dtype and shape it expects.
Status FindBaseTensor(const Checkpoint& base, const TensorEntry& t, const uint8_t** data) {
  const TensorView* view = base.Find(t.name);
  if (view == nullptr) return WrongBase("tensor '" + t.name + "' is missing from " + base.path());
  if (view->dtype != t.dtype || view->shape != t.shape) {
    return WrongBase("tensor '" + t.name + "' is " + view->dtype + " " + Shape(view->shape) +
                     " in the base, the delta expects " + t.dtype + " " + Shape(t.shape));
  }
  *data = view->data;
  return Status::Ok();
}

// Finds the base of every delta tensor, with the dtype and shape the delta expects.
Status MatchBase(const Checkpoint& base, const Manifest& m,
                 std::map<const TensorEntry*, const uint8_t*>* base_data) {
  if (!base.path().empty() && base.directory() != m.directory) {
    return Status(ErrorCode::kInvalidArgument,
                  m.directory ? "the delta is of a checkpoint directory; PREV is a file"
                              : "the delta is of a single file; PREV is a directory");
  }
  for (const FileEntry& f : m.files) {
    for (const TensorEntry& t : f.tensors) {
      if (t.kind != TensorKind::kDelta) continue;
      ARC_V3_RETURN_IF_ERROR(FindBaseTensor(base, t, &(*base_data)[&t]));
    }
  }
  return Status::Ok();
}

// Bytes of a tensor's rows that a piece covers.
uint64_t PieceBytes(const TensorEntry& t, const Piece& p) {
  return (p.row_end - p.row_begin) * t.row_bytes();
}

Status CheckBaseRows(const TensorEntry& t, const Piece& p, const uint8_t* base_rows) {
  const uint64_t bytes = PieceBytes(t, p);
  if (Hash(base_rows, bytes) != p.base_xxh3) {
    return WrongBase("tensor '" + t.name + "' rows " + std::to_string(p.row_begin) + ":" +
                     std::to_string(p.row_end) +
                     " differ from the delta's base (checksum mismatch)");
  }
  return Status::Ok();
}

// Puts the file's BF16 delta tensors that `worth_grouping` picks (small ones with few
// changes: WorthGrouping) into groups of at most kPieceElements elements, in file order
// (src/checkpoint/FORMAT.md, "Group (version 2)").
void AssignGroups(FileEntry* f, const std::function<bool(const TensorEntry&)>& worth_grouping) {
  for (size_t i = 0; i < f->tensors.size(); ++i) {
    TensorEntry& t = f->tensors[i];
    const uint64_t elements = t.bytes() / 2;
    if (t.kind != TensorKind::kDelta || t.dtype != "BF16" || elements == 0 ||
        elements >= kGroupBelowElements || !worth_grouping(t)) {
      continue;
    }
    if (f->groups.empty() || f->groups.back().elements + elements > kPieceElements) {
      f->groups.emplace_back();
    }
    Group& g = f->groups.back();
    g.members.push_back(i);
    g.elements += elements;
    t.group = f->groups.size() - 1;
    t.pieces.clear();
  }
}

// The base bytes of every member of a group, checked against the manifest: a mismatch
// names the member (and, for a partial apply of another tensor, what it is needed for).
Status GroupBases(const Checkpoint& base, const FileEntry& f, const Group& g,
                  const std::string& needed_by, std::vector<const uint8_t*>* data,
                  std::vector<uint64_t>* bytes) {
  data->clear();
  bytes->clear();
  for (size_t member : g.members) {
    const TensorEntry& t = f.tensors[member];
    const uint8_t* rows = nullptr;
    Status s = FindBaseTensor(base, t, &rows);
    if (s.ok()) {
      Prefault(rows, t.bytes());
      if (Hash(rows, t.bytes()) != t.base_xxh3) {
        s = WrongBase("tensor '" + t.name + "' differs from the delta's base (checksum mismatch)");
      }
    }
    if (!s.ok()) {
      if (needed_by.empty() || needed_by == t.name) return s;
      return Status(s.code(), s.message() + "; it shares a group with '" + needed_by + "'");
    }
    data->push_back(rows);
    bytes->push_back(t.bytes());
  }
  return Status::Ok();
}

// Decodes a small non-tensor piece (header, fills) into a vector.
Status DecodeBytes(const Reader& reader, const Piece& p, std::vector<uint8_t>* out) {
  std::vector<uint8_t> scratch;
  const uint8_t* stored = nullptr;
  ARC_V3_RETURN_IF_ERROR(reader.ReadPiece(p, &scratch, &stored));
  out->resize(p.row_end);
  return DecodePiece(p, stored, nullptr, p.row_end, 1, out->data());
}

Status OpenDelta(const std::string& path, Reader* reader) {
  std::unique_ptr<MappedFile> file;
  ARC_V3_RETURN_IF_ERROR(MappedFile::Open(path, &file));
  return InContext(path, Reader::Open(std::move(file), reader));
}

// One piece of work: a piece of one tensor of one output file, or a group of tensors.
struct Task {
  size_t file = 0;  // index into the manifest's files (and the aside files)
  const TensorEntry* tensor = nullptr;
  const Piece* piece = nullptr;
  const uint8_t* base = nullptr;  // base rows of the piece, or nullptr
  const Group* group = nullptr;   // set instead of tensor, piece and base
};

uint64_t GroupBytes(const Group& g) { return g.elements * 2; }

}  // namespace

Status ApplyGroup(const Checkpoint& base, const Reader& reader, const FileEntry& f, const Group& g,
                  std::vector<uint16_t>* decoded, const std::string& needed_by) {
  std::vector<const uint8_t*> base_data;
  std::vector<uint64_t> bytes;
  ARC_V3_RETURN_IF_ERROR(GroupBases(base, f, g, needed_by, &base_data, &bytes));
  std::vector<uint8_t> scratch;
  const uint8_t* stored = nullptr;
  Status s = reader.ReadGroup(g, &scratch, &stored);
  if (s.ok()) s = DecodeGroup(g, stored, base_data, bytes, decoded);
  for (size_t k = 0; k < base_data.size() && base.mapped(); ++k) Release(base_data[k], bytes[k]);
  ARC_V3_RETURN_IF_ERROR_IN("group of tensor '" + f.tensors[g.members[0]].name + "'", s);
  return Status::Ok();
}

uint64_t TensorChecksum(const TensorEntry& t, const uint8_t* data) {
  std::vector<uint64_t> hashes;
  for (const Piece& p : PlanPieces(t)) {
    hashes.push_back(Hash(data + p.row_begin * t.row_bytes(), PieceBytes(t, p)));
  }
  return CombineHashes(hashes);
}

Status Checkpoint::Add(FileView file) {
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    const std::string& name = file.tensors[i].name;
    if (by_name_.count(name) != 0) {
      return Status(ErrorCode::kInvalidArgument, path_ + ": tensor '" + name + "' is in two files");
    }
    by_name_[name] = {files_.size(), i};
  }
  files_.push_back(std::move(file));
  return Status::Ok();
}

Status Checkpoint::Open(const std::string& path, Checkpoint* checkpoint) {
  Checkpoint result;
  result.path_ = path;
  if (path.empty()) {  // no base: every tensor is added
    *checkpoint = std::move(result);
    return Status::Ok();
  }
  std::error_code ec;
  result.directory_ = fs::is_directory(path, ec);
  std::vector<std::string> paths;
  Status s = safetensors::ListCheckpointFiles(path, &paths);
  if (!s.ok()) return Status(ErrorCode::kInvalidArgument, s.message());
  if (result.directory_) {
    const fs::path index = fs::path(path) / kIndexName;
    if (fs::is_regular_file(index, ec)) result.index_path_ = index.string();
  }
  for (const std::string& p : paths) {
    safetensors::File file;
    s = safetensors::File::Open(p, &file);
    if (!s.ok()) return Status(ErrorCode::kInvalidArgument, s.message());
    FileView view;
    view.name = BaseName(p);
    view.header = file.raw();
    view.data_start = file.data_start();
    view.size = file.file_size();
    view.raw = file.raw();
    for (const safetensors::TensorInfo& info : file.tensors()) {
      view.tensors.push_back(
          {info.name, info.dtype, info.shape, file.data(info), info.size(), info.begin});
    }
    result.mapped_.push_back(std::move(file));  // the mapping does not move
    ARC_V3_RETURN_IF_ERROR(result.Add(std::move(view)));
  }
  *checkpoint = std::move(result);
  return Status::Ok();
}

Status Checkpoint::FromMemory(const std::string& file_name, const std::vector<NamedTensor>& tensors,
                              Checkpoint* checkpoint) {
  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (const NamedTensor& t : tensors) {
    TensorView v;
    v.name = t.name;
    v.dtype = t.dtype;
    v.shape = t.shape;
    v.data = static_cast<const uint8_t*>(t.data);
    views.push_back(std::move(v));
  }
  return FromMemory(file_name, std::move(views), checkpoint);
}

Status Checkpoint::FromMemory(const std::string& file_name, std::vector<TensorView> tensors,
                              Checkpoint* checkpoint) {
  Checkpoint result;
  result.path_ = "memory:" + file_name;
  std::vector<safetensors::TensorInfo> infos;
  for (const TensorView& t : tensors) {
    const size_t element = safetensors::DTypeSize(t.dtype);
    if (element == 0)
      return Status(ErrorCode::kInvalidArgument,
                    "tensor '" + t.name + "': unknown dtype '" + t.dtype + "'");
    uint64_t bytes = element;
    for (uint64_t d : t.shape) {
      if (d != 0 && bytes > UINT64_MAX / d)
        return Status(ErrorCode::kInvalidArgument, "tensor '" + t.name + "' is too big");
      bytes *= d;
    }
    if (t.bytes != 0 && t.bytes != bytes) {
      return Status(ErrorCode::kInvalidArgument,
                    "tensor '" + t.name + "' has " + std::to_string(t.bytes) +
                        " bytes, its dtype and shape " + std::to_string(bytes));
    }
    if (t.data == nullptr && bytes != 0)
      return Status(ErrorCode::kInvalidArgument, "tensor '" + t.name + "' has no data");
    safetensors::TensorInfo info;
    info.name = t.name;
    info.dtype = t.dtype;
    info.shape = t.shape;
    info.end = bytes;
    infos.push_back(info);
  }
  result.headers_.push_back(safetensors::BuildHeader(&infos, {}));
  const std::vector<uint8_t>& header = result.headers_.back();
  FileView view;
  view.name = file_name;
  view.header = header.data();
  view.data_start = header.size();
  view.size = header.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    tensors[i].bytes = infos[i].size();
    tensors[i].offset = infos[i].begin;
    view.size += infos[i].size();
  }
  view.tensors = std::move(tensors);
  ARC_V3_RETURN_IF_ERROR(result.Add(std::move(view)));
  *checkpoint = std::move(result);
  return Status::Ok();
}

const TensorView* Checkpoint::Find(const std::string& name, const FileView** file) const {
  const auto it = by_name_.find(name);
  if (it == by_name_.end()) return nullptr;
  if (file != nullptr) *file = &files_[it->second.first];
  return &files_[it->second.first].tensors[it->second.second];
}

namespace {

// The data of a tensor that `checkpoint` holds (Encode asks only for tensors it has).
const uint8_t* DataOf(const Checkpoint& checkpoint, const TensorEntry& t) {
  return checkpoint.Find(t.name)->data;
}

// Data-section bytes outside every tensor (alignment padding, if any) travel as fills:
// sets the file's fills and the length of its fill piece.
Status PlanFills(const FileView& file, FileEntry* f) {
  uint64_t at = f->data_start;
  for (const TensorView& t : file.tensors) {
    if (f->data_start + t.offset > at) f->fills.emplace_back(at, f->data_start + t.offset - at);
    at = std::max(at, f->data_start + t.offset + t.bytes);
  }
  if (f->size > at) f->fills.emplace_back(at, f->size - at);
  if (!f->fills.empty() && file.raw == nullptr) {
    return Status(ErrorCode::kInternal, file.name + ": gaps between tensors of a file in memory");
  }
  uint64_t fill_total = 0;
  for (const auto& r : f->fills) fill_total += r.second;
  f->fill.row_end = fill_total;
  return Status::Ok();
}

// The manifest entry of one file of `next`: its header, fills, tensors (each a delta of
// its namesake in `prev`, or carried whole) with their pieces planned, and its groups.
Status PlanFile(const Checkpoint& prev, const Checkpoint& next, const FileView& file,
                const RunOptions& options, FileEntry* f) {
  f->name = file.name;
  f->size = file.size;
  f->data_start = file.data_start;
  f->header.row_end = f->data_start;
  ARC_V3_RETURN_IF_ERROR(PlanFills(file, f));
  for (const TensorView& info : file.tensors) {
    TensorEntry t;
    t.name = info.name;
    t.dtype = info.dtype;
    t.shape = info.shape;
    t.data_offset = info.offset;
    const TensorView* base = prev.Find(t.name);
    t.kind = base == nullptr                                      ? TensorKind::kAdded
             : (base->dtype != t.dtype || base->shape != t.shape) ? TensorKind::kReshaped
                                                                  : TensorKind::kDelta;
    t.pieces = PlanPieces(t);
    f->tensors.push_back(std::move(t));
  }
  if (options.group && options.format == Format::kDefault) {
    AssignGroups(f, [&](const TensorEntry& t) {
      const uint8_t* base = DataOf(prev, t);
      const uint8_t* target = DataOf(next, t);
      const bool worth = WorthGrouping(base, target, t.bytes());
      // Read again when coded: until then they need not stay resident.
      if (prev.mapped()) Release(base, t.bytes());
      if (next.mapped()) Release(target, t.bytes());
      return worth;
    });
  }
  return Status::Ok();
}

// What Encode codes: the manifest (pieces' offsets and tensors' checksums still unset)
// and, per manifest file, the bytes its header piece holds and its view (nullptr for the
// index, which is all header).
struct EncodePlan {
  Manifest m;
  std::vector<const uint8_t*> raw;
  std::vector<const FileView*> views;
  std::set<std::string> next_tensors;
  std::unique_ptr<MappedFile> index;  // what raw points into for the index
};

Status PlanEncode(const Checkpoint& prev, const Checkpoint& next, const RunOptions& options,
                  EncodePlan* plan) {
  if (!prev.empty() && prev.directory() != next.directory()) {
    return Status(ErrorCode::kInvalidArgument,
                  "PREV and NEXT must both be files or both directories");
  }
  Manifest& m = plan->m;
  m.directory = next.directory();
  std::set<std::string> next_names;
  for (const FileView& file : next.files()) {
    FileEntry f;
    ARC_V3_RETURN_IF_ERROR(PlanFile(prev, next, file, options, &f));
    next_names.insert(f.name);
    for (const TensorEntry& t : f.tensors) plan->next_tensors.insert(t.name);
    m.files.push_back(std::move(f));
    plan->raw.push_back(file.header);
    plan->views.push_back(&file);
  }
  if (m.directory && !next.index_path().empty()) {
    ARC_V3_RETURN_IF_ERROR(MappedFile::Open(next.index_path(), &plan->index));
    if (plan->index->size() > 0) {
      FileEntry f;
      f.name = kIndexName;
      next_names.insert(f.name);
      f.size = f.data_start = f.header.row_end = plan->index->size();
      m.files.push_back(std::move(f));
      plan->raw.push_back(plan->index->data());
      plan->views.push_back(nullptr);
    }
  }
  for (const FileView& file : prev.files()) {
    if (m.directory && next_names.count(file.name) == 0) m.removed_files.push_back(file.name);
    for (const TensorView& t : file.tensors) {
      if (plan->next_tensors.count(t.name) == 0) m.removed_tensors.push_back(t.name);
    }
  }
  if (m.directory && !prev.index_path().empty() && next_names.count(kIndexName) == 0) {
    m.removed_files.push_back(kIndexName);
  }
  return Status::Ok();
}

// One task of Encode: a piece (headers and fills included) or a group.
struct EncodeTask {
  const uint8_t* base;
  const uint8_t* target;
  uint64_t bytes;
  size_t element_size;
  bool bf16;
  Piece* piece;
  bool tensor;                // counts towards progress
  FileEntry* file = nullptr;  // with `group`, instead of base, target and piece
  Group* group = nullptr;
  uint64_t rows = 0;  // the piece's tensor's (0: not a tensor's piece)
};

// Every piece (headers and fills included) and group of the plan as one task, in manifest
// order, the fills of each file gathered into `fill_bytes` first (tiny in practice).
// Returns the tensor bytes the tasks cover.
uint64_t PlanEncodeTasks(const Checkpoint& prev, const Checkpoint& next, EncodePlan* plan,
                         std::vector<std::vector<uint8_t>>* fill_bytes,
                         std::vector<EncodeTask>* tasks) {
  std::vector<FileEntry>& files = plan->m.files;
  uint64_t total = 0;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    FileEntry& f = files[fi];
    tasks->push_back({nullptr, plan->raw[fi], f.data_start, 1, false, &f.header, false});
    for (size_t ti = 0; ti < f.tensors.size(); ++ti) {
      TensorEntry& t = f.tensors[ti];
      if (t.grouped()) {
        // A group is one task, stored where its first member would be.
        Group& g = f.groups[t.group];
        if (g.members[0] == ti) {
          tasks->push_back({nullptr, nullptr, GroupBytes(g), 2, true, nullptr, true, &f, &g});
          total += GroupBytes(g);
        }
        continue;
      }
      const uint8_t* target = DataOf(next, t);
      const uint8_t* base = t.kind == TensorKind::kDelta ? DataOf(prev, t) : nullptr;
      for (Piece& p : t.pieces) {
        const uint64_t offset = p.row_begin * t.row_bytes();
        const uint64_t bytes = PieceBytes(t, p);
        tasks->push_back({base ? base + offset : nullptr, target + offset, bytes,
                          safetensors::DTypeSize(t.dtype), t.dtype == "BF16", &p, true, nullptr,
                          nullptr, t.rows()});
        total += bytes;
      }
    }
  }
  fill_bytes->assign(files.size(), {});
  for (size_t fi = 0; fi < files.size(); ++fi) {
    FileEntry& f = files[fi];
    if (f.fills.empty()) continue;
    std::vector<uint8_t>& bytes = (*fill_bytes)[fi];
    const uint8_t* raw = plan->views[fi]->raw;
    for (const auto& r : f.fills) {
      bytes.insert(bytes.end(), raw + r.first, raw + r.first + r.second);
    }
    tasks->push_back({nullptr, bytes.data(), bytes.size(), 1, false, &f.fill, false});
  }
  return total;
}

// Codes a group task into `out`, setting its members' base_xxh3.
Status EncodeGroupTask(const Checkpoint& prev, const Checkpoint& next, const EncodeTask& task,
                       int effort, std::vector<uint8_t>* out) {
  std::vector<const uint8_t*> base, target;
  std::vector<uint64_t> bytes, base_xxh3;
  for (size_t member : task.group->members) {
    const TensorEntry& t = task.file->tensors[member];
    base.push_back(DataOf(prev, t));
    target.push_back(DataOf(next, t));
    bytes.push_back(t.bytes());
    Prefault(base.back(), bytes.back());
    Prefault(target.back(), bytes.back());
  }
  const Status s = EncodeGroup(base, target, bytes, effort, task.group, &base_xxh3, out);
  for (size_t k = 0; k < base_xxh3.size(); ++k) {
    task.file->tensors[task.group->members[k]].base_xxh3 = base_xxh3[k];
  }
  for (size_t k = 0; k < base.size(); ++k) {
    if (prev.mapped()) Release(base[k], bytes[k]);
    if (next.mapped()) Release(target[k], bytes[k]);
  }
  return s;
}

// Codes a piece task into `out`.
Status EncodePieceTask(const Checkpoint& prev, const Checkpoint& next, const EncodeTask& task,
                       const RunOptions& options, std::vector<uint8_t>* out) {
  Prefault(task.base, task.bytes);
  Prefault(task.target, task.bytes);
  const Status s = EncodePiece(task.base, task.target, task.bytes, task.element_size, task.bf16,
                               options.effort, task.piece, out, options.format);
  if (task.tensor) {  // fills are copies, not mapped
    if (prev.mapped()) Release(task.base, task.bytes);
    if (next.mapped()) Release(task.target, task.bytes);
  }
  return s;
}

// Codes every task in parallel into `outputs` (kept in memory: the delta is small),
// reporting progress and calling the hook after each tensor's task.
Status RunEncodeTasks(const Checkpoint& prev, const Checkpoint& next,
                      const std::vector<EncodeTask>& tasks, const RunOptions& options,
                      std::vector<std::vector<uint8_t>>* outputs) {
  outputs->assign(tasks.size(), {});
  FirstError error;
  const size_t workers = WorkerCount(options.threads, tasks.size());
  const Status thrown = TryParallelFor(tasks.size(), workers, [&](size_t i, size_t) {
    if (error.Skip(i)) return;
    const EncodeTask& task = tasks[i];
    error.Set(i, task.group != nullptr
                     ? EncodeGroupTask(prev, next, task, options.effort, &(*outputs)[i])
                     : EncodePieceTask(prev, next, task, options, &(*outputs)[i]));
    if (!task.tensor) return;
    if (options.progress_done != nullptr) *options.progress_done += task.bytes;
    if (options.hook) error.Set(i, options.hook("piece"));
  });
  ARC_V3_RETURN_IF_ERROR(thrown);
  return error.status();
}

// Puts the outputs in data-section order and assigns each piece and group its offset;
// returns the data section's size. The order is the manifest's, or with `row_order`
// headers, fills and groups first, then the pieces by the fraction of their tensor's rows
// they start at (ties in manifest order), so that the pieces of rows [0, B) of every
// tensor are one range.
uint64_t LayOutData(const std::vector<EncodeTask>& tasks, bool row_order,
                    std::vector<std::vector<uint8_t>>* outputs) {
  std::vector<size_t> order(tasks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (row_order) {
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const EncodeTask& x = tasks[a];
      const EncodeTask& y = tasks[b];
      if ((x.rows == 0) != (y.rows == 0)) return x.rows == 0;
      if (x.rows == 0) return false;
      return static_cast<unsigned __int128>(x.piece->row_begin) * y.rows <
             static_cast<unsigned __int128>(y.piece->row_begin) * x.rows;
    });
    std::vector<std::vector<uint8_t>> sorted(order.size());
    for (size_t i = 0; i < order.size(); ++i) sorted[i] = std::move((*outputs)[order[i]]);
    outputs->swap(sorted);
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const EncodeTask& task = tasks[order[i]];
    (task.group != nullptr ? task.group->offset : task.piece->offset) = offset;
    offset += (*outputs)[i].size();
  }
  return offset;
}

// Sets the checksums of every ungrouped tensor from its pieces' (a grouped tensor's
// base_xxh3 is the member's own, set by EncodeGroup).
void SetTensorChecksums(Manifest* m) {
  for (FileEntry& f : m->files) {
    for (TensorEntry& t : f.tensors) {
      if (t.grouped()) continue;
      std::vector<uint64_t> base_hashes, target_hashes;
      for (const Piece& p : t.pieces) {
        base_hashes.push_back(p.base_xxh3);
        target_hashes.push_back(p.target_xxh3);
      }
      t.base_xxh3 = t.kind == TensorKind::kDelta ? CombineHashes(base_hashes) : 0;
      t.target_xxh3 = CombineHashes(target_hashes);
    }
  }
}

// Codes every piece of `next` against `prev` (see Diff): the container's header and
// manifest in `head`, the pieces' stored bytes in `outputs`, in data-section order.
Status Encode(const Checkpoint& prev, const Checkpoint& next, const RunOptions& options,
              std::vector<uint8_t>* head, std::vector<std::vector<uint8_t>>* outputs,
              RunReport* report) {
  EncodePlan plan;
  ARC_V3_RETURN_IF_ERROR(PlanEncode(prev, next, options, &plan));
  std::vector<std::vector<uint8_t>> fill_bytes;
  std::vector<EncodeTask> tasks;
  const uint64_t total = PlanEncodeTasks(prev, next, &plan, &fill_bytes, &tasks);
  if (options.progress_total != nullptr) *options.progress_total = total;
  ARC_V3_RETURN_IF_ERROR(RunEncodeTasks(prev, next, tasks, options, outputs));
  const uint64_t data_size = LayOutData(tasks, options.row_order, outputs);
  SetTensorChecksums(&plan.m);
  *head = SerializeHeaderAndManifest(plan.m, data_size);
  if (report != nullptr) {
    report->files = plan.m.files.size();
    report->pieces = tasks.size();
    report->tensors = plan.next_tensors.size();
    report->target_bytes = 0;
    for (const FileEntry& f : plan.m.files) report->target_bytes += f.size;
    report->delta_bytes = head->size() + data_size;
  }
  return Status::Ok();
}

}  // namespace

Status Diff(const Checkpoint& prev, const Checkpoint& next, const std::string& delta_path,
            const RunOptions& options, RunReport* report) {
  ARC_V3_RETURN_IF_ERROR(CheckOutput(delta_path, options.overwrite));  // before the work, not after
  std::vector<uint8_t> head;
  std::vector<std::vector<uint8_t>> outputs;
  ARC_V3_RETURN_IF_ERROR(Encode(prev, next, options, &head, &outputs, report));
  uint64_t size = head.size();
  for (const auto& o : outputs) size += o.size();
  AsideFiles out(options.overwrite);
  size_t index = 0;
  ARC_V3_RETURN_IF_ERROR(out.Create(fs::absolute(delta_path).string(), size, &index));
  ARC_V3_RETURN_IF_ERROR(
      file_io::WriteAt(out.fd(index), head.data(), head.size(), 0, out.temp(index)));
  uint64_t at = head.size();
  for (const auto& o : outputs) {
    ARC_V3_RETURN_IF_ERROR(
        file_io::WriteAt(out.fd(index), o.data(), o.size(), at, out.temp(index)));
    at += o.size();
  }
  ARC_V3_RETURN_IF_ERROR(out.SyncAndClose(options.sync));
  ARC_V3_RETURN_IF_ERROR(out.Commit(options.sync));
  if (report != nullptr) report->written = {delta_path};
  return Status::Ok();
}

Status Diff(const Checkpoint& prev, const Checkpoint& next, const RunOptions& options,
            std::vector<uint8_t>* delta, RunReport* report) {
  std::vector<uint8_t> head;
  std::vector<std::vector<uint8_t>> outputs;
  ARC_V3_RETURN_IF_ERROR(Encode(prev, next, options, &head, &outputs, report));
  *delta = std::move(head);
  for (const auto& o : outputs) delta->insert(delta->end(), o.begin(), o.end());
  return Status::Ok();
}

Status Diff(const std::string& prev_path, const std::string& next_path,
            const std::string& delta_path, const RunOptions& options, RunReport* report) {
  Checkpoint prev, next;
  ARC_V3_RETURN_IF_ERROR(Checkpoint::Open(prev_path, &prev));
  ARC_V3_RETURN_IF_ERROR(Checkpoint::Open(next_path, &next));
  return Diff(prev, next, delta_path, options, report);
}

namespace {

// The inputs of an apply or a verify: the delta (its manifest validated) and the base.
struct DeltaAndBase {
  Reader reader;
  Checkpoint base;
};

// The step Apply, ApplyPartial and Verify start with: opens the delta, then the base.
Status OpenDeltaAndBase(const std::string& prev_path, const std::string& delta_path,
                        DeltaAndBase* inputs) {
  ARC_V3_RETURN_IF_ERROR(OpenDelta(delta_path, &inputs->reader));
  return Checkpoint::Open(prev_path, &inputs->base);
}

// Where Apply's files go: into directory `out_path` for directory deltas (created if
// needed); for a file delta, `out_path` itself, or the target's name inside `out_path` if
// that is a directory.
Status OutputPaths(const Manifest& m, const std::string& out_path,
                   std::vector<std::string>* finals) {
  std::error_code ec;
  if (m.directory) {
    fs::create_directories(out_path, ec);
    if (!fs::is_directory(out_path, ec)) {
      return Status(ErrorCode::kInvalidArgument, out_path + ": cannot create the output directory");
    }
    for (const FileEntry& f : m.files) finals->push_back((fs::path(out_path) / f.name).string());
  } else {
    finals->push_back(fs::is_directory(out_path, ec)
                          ? (fs::path(out_path) / m.files[0].name).string()
                          : out_path);
  }
  return Status::Ok();
}

// Decodes a file's header and fills and writes them to its aside file `index`.
Status WriteHeaderAndFills(const Reader& reader, const FileEntry& f, const AsideFiles& out,
                           size_t index) {
  std::vector<uint8_t> bytes;
  ARC_V3_RETURN_IF_ERROR_IN(f.name + " header", DecodeBytes(reader, f.header, &bytes));
  ARC_V3_RETURN_IF_ERROR(
      file_io::WriteAt(out.fd(index), bytes.data(), bytes.size(), 0, out.temp(index)));
  if (f.fills.empty()) return Status::Ok();
  ARC_V3_RETURN_IF_ERROR_IN(f.name + " fill", DecodeBytes(reader, f.fill, &bytes));
  uint64_t at = 0;
  for (const auto& r : f.fills) {
    ARC_V3_RETURN_IF_ERROR(
        file_io::WriteAt(out.fd(index), bytes.data() + at, r.second, r.first, out.temp(index)));
    at += r.second;
  }
  return Status::Ok();
}

// Appends a task per piece and group of a file written to aside file `index`; returns the
// bytes they cover.
uint64_t PlanFileTasks(const FileEntry& f, size_t index,
                       const std::map<const TensorEntry*, const uint8_t*>& base_data,
                       std::vector<Task>* tasks) {
  uint64_t total = 0;
  for (const TensorEntry& t : f.tensors) {
    const auto it = base_data.find(&t);
    const bool delta = it != base_data.end();
    for (const Piece& p : t.pieces) {
      tasks->push_back({index, &t, &p, delta ? it->second + p.row_begin * t.row_bytes() : nullptr});
      total += PieceBytes(t, p);
    }
  }
  for (const Group& g : f.groups) {
    Task task;
    task.file = index;
    task.group = &g;
    tasks->push_back(task);
    total += GroupBytes(g);
  }
  return total;
}

int64_t NanosecondsSince(std::chrono::steady_clock::time_point start) {
  const auto elapsed = std::chrono::steady_clock::now() - start;
  return std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count();
}

// What the tasks of an Apply share: the inputs, the output files, buffers per worker and
// the time spent decoding and writing.
struct ApplyRun {
  ApplyRun(const DeltaAndBase& inputs, const AsideFiles& outputs, bool sync_outputs, size_t workers)
      : reader(inputs.reader),
        base(inputs.base),
        out(outputs),
        sync(sync_outputs),
        buffers(workers),
        scratch(workers),
        group_buffers(workers) {}
  const Reader& reader;
  const Checkpoint& base;
  const AsideFiles& out;
  bool sync;
  std::vector<std::vector<uint8_t>> buffers, scratch;
  std::vector<std::vector<uint16_t>> group_buffers;
  std::atomic<int64_t> decode_ns{0}, write_ns{0};
};

// Decodes a group (checking its members' bases) on worker `w` and writes its members.
Status ApplyGroupTask(const Task& task, size_t w, ApplyRun* run) {
  const FileEntry& f = run->reader.manifest().files[task.file];
  const auto start = std::chrono::steady_clock::now();
  Status st = ApplyGroup(run->base, run->reader, f, *task.group, &run->group_buffers[w], "");
  run->decode_ns += NanosecondsSince(start);
  const uint8_t* decoded = reinterpret_cast<const uint8_t*>(run->group_buffers[w].data());
  const auto write_start = std::chrono::steady_clock::now();
  const int fd = run->out.fd(task.file);
  for (size_t k = 0; k < task.group->members.size() && st.ok(); ++k) {
    const TensorEntry& t = f.tensors[task.group->members[k]];
    st = file_io::WriteAt(fd, decoded, t.bytes(), f.data_start + t.data_offset,
                          run->out.temp(task.file));
    if (run->sync) StartWriteback(fd, f.data_start + t.data_offset, t.bytes());
    decoded += t.bytes();
  }
  run->write_ns += NanosecondsSince(write_start);
  return st;
}

// Decodes a piece on worker `w` and writes it. Errors name the tensor; the base rows are
// hashed only when decoding fails: every coder XORs the base into its result, so a wrong
// base fails the target checksum, and the base check then names the cause (the verify
// command still checks every base up front).
Status ApplyPieceTask(const Task& task, size_t w, ApplyRun* run) {
  const TensorEntry& t = *task.tensor;
  const Piece& p = *task.piece;
  const uint64_t bytes = PieceBytes(t, p);
  const auto named = [&](const Status& e) {
    return e.code() == ErrorCode::kChecksumMismatch ? e : InContext("tensor '" + t.name + "'", e);
  };
  const auto checking_base = [&](const Status& e) {
    const Status base_check = task.base != nullptr ? CheckBaseRows(t, p, task.base) : Status::Ok();
    return named(base_check.ok() ? e : base_check);
  };
  Prefault(task.base, bytes);
  const uint8_t* stored = nullptr;
  Status st = run->reader.ReadPiece(p, &run->scratch[w], &stored);
  if (!st.ok()) return checking_base(st);
  std::vector<uint8_t>& buffer = run->buffers[w];
  buffer.resize(bytes);
  const auto start = std::chrono::steady_clock::now();
  st = DecodePiece(p, stored, task.base, bytes, safetensors::DTypeSize(t.dtype), buffer.data());
  const auto decoded = std::chrono::steady_clock::now();
  run->decode_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(decoded - start).count();
  if (!st.ok()) return checking_base(st);
  const FileEntry& f = run->reader.manifest().files[task.file];
  const uint64_t at = f.data_start + t.data_offset + p.row_begin * t.row_bytes();
  if (run->base.mapped()) Release(task.base, bytes);
  st = file_io::WriteAt(run->out.fd(task.file), buffer.data(), bytes, at, run->out.temp(task.file));
  run->write_ns += NanosecondsSince(decoded);
  if (!st.ok()) return named(st);
  if (run->sync) StartWriteback(run->out.fd(task.file), at, bytes);
  return Status::Ok();
}

// Runs Apply's tasks in parallel, reporting progress and calling the hook after each.
Status RunApplyTasks(const std::vector<Task>& tasks, const RunOptions& options, ApplyRun* run) {
  FirstError error;
  const Status thrown = TryParallelFor(tasks.size(), run->buffers.size(), [&](size_t i, size_t w) {
    if (error.Skip(i)) return;
    const Task& task = tasks[i];
    const Status st =
        task.group != nullptr ? ApplyGroupTask(task, w, run) : ApplyPieceTask(task, w, run);
    if (!st.ok()) return error.Set(i, st);
    if (options.progress_done != nullptr) {
      *options.progress_done +=
          task.group != nullptr ? GroupBytes(*task.group) : PieceBytes(*task.tensor, *task.piece);
    }
    if (options.hook) error.Set(i, options.hook("piece"));
  });
  ARC_V3_RETURN_IF_ERROR(thrown);
  return error.status();
}

// Syncs and renames Apply's outputs (the hook runs in between); an in-place apply then
// removes the shards the new checkpoint no longer has.
Status CommitApply(const Manifest& m, const std::string& out_path, bool in_place,
                   const RunOptions& options, AsideFiles* out) {
  ARC_V3_RETURN_IF_ERROR(out->SyncAndClose(options.sync));
  if (options.hook) ARC_V3_RETURN_IF_ERROR(options.hook("rename"));
  ARC_V3_RETURN_IF_ERROR(out->Commit(options.sync));
  if (in_place) {
    std::error_code ec;
    for (const std::string& name : m.removed_files) fs::remove(fs::path(out_path) / name, ec);
  }
  return Status::Ok();
}

}  // namespace

Status Apply(const std::string& prev_path, const std::string& delta_path,
             const std::string& out_path, const RunOptions& options, RunReport* report) {
  DeltaAndBase inputs;
  ARC_V3_RETURN_IF_ERROR(OpenDeltaAndBase(prev_path, delta_path, &inputs));
  const Manifest& m = inputs.reader.manifest();
  std::map<const TensorEntry*, const uint8_t*> base_data;
  ARC_V3_RETURN_IF_ERROR(MatchBase(inputs.base, m, &base_data));
  std::vector<std::string> finals;
  ARC_V3_RETURN_IF_ERROR(OutputPaths(m, out_path, &finals));
  std::error_code ec;
  const bool in_place = fs::equivalent(m.directory ? out_path : finals[0], prev_path, ec);

  AsideFiles out(options.overwrite || in_place);
  std::vector<Task> tasks;
  uint64_t total = 0;
  for (size_t fi = 0; fi < m.files.size(); ++fi) {
    size_t index = 0;
    ARC_V3_RETURN_IF_ERROR(out.Create(fs::absolute(finals[fi]).string(), m.files[fi].size, &index));
    ARC_V3_RETURN_IF_ERROR(WriteHeaderAndFills(inputs.reader, m.files[fi], out, index));
    total += PlanFileTasks(m.files[fi], index, base_data, &tasks);
  }
  if (options.progress_total != nullptr) *options.progress_total = total;

  ApplyRun run(inputs, out, options.sync, WorkerCount(options.threads, tasks.size()));
  ARC_V3_RETURN_IF_ERROR(RunApplyTasks(tasks, options, &run));
  const auto sync_start = std::chrono::steady_clock::now();
  ARC_V3_RETURN_IF_ERROR(CommitApply(m, out_path, in_place, options, &out));
  if (report != nullptr) {
    report->files = m.files.size();
    report->pieces = tasks.size();
    report->tensors = 0;
    report->target_bytes = 0;
    for (const FileEntry& f : m.files) {
      report->tensors += f.tensors.size();
      report->target_bytes += f.size;
    }
    report->delta_bytes = inputs.reader.source().size();
    report->written = finals;
    report->decode_seconds = run.decode_ns * 1e-9;
    report->write_seconds = run.write_ns * 1e-9;
    report->sync_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - sync_start).count();
  }
  return Status::Ok();
}

Status Verify(const std::string& prev_path, const std::string& delta_path,
              const RunOptions& options, RunReport* report) {
  DeltaAndBase inputs;
  ARC_V3_RETURN_IF_ERROR(OpenDeltaAndBase(prev_path, delta_path, &inputs));
  const Reader& reader = inputs.reader;
  const Checkpoint& base = inputs.base;
  std::map<const TensorEntry*, const uint8_t*> base_data;
  ARC_V3_RETURN_IF_ERROR(MatchBase(base, reader.manifest(), &base_data));
  std::vector<Task> tasks;
  uint64_t total = 0;
  for (const auto& entry : base_data) {
    for (const Piece& p : entry.first->pieces) {
      tasks.push_back({0, entry.first, &p, entry.second + p.row_begin * entry.first->row_bytes()});
      total += PieceBytes(*entry.first, p);
    }
  }
  const Manifest& m = reader.manifest();
  for (size_t fi = 0; fi < m.files.size(); ++fi) {
    for (const Group& g : m.files[fi].groups) {
      Task task;
      task.file = fi;
      task.group = &g;
      tasks.push_back(task);
      total += GroupBytes(g);
    }
  }
  if (options.progress_total != nullptr) *options.progress_total = total;
  const size_t workers = WorkerCount(options.threads, tasks.size());
  std::vector<std::vector<uint8_t>> scratch(workers);
  FirstError error;
  const Status thrown = TryParallelFor(tasks.size(), workers, [&](size_t i, size_t w) {
    if (error.Skip(i)) return;
    const Task& task = tasks[i];
    if (task.group != nullptr) {
      std::vector<const uint8_t*> member_bases;
      std::vector<uint64_t> bytes;
      const FileEntry& f = m.files[task.file];
      error.Set(i, GroupBases(base, f, *task.group, "", &member_bases, &bytes));
      const uint8_t* stored = nullptr;
      const Status st = reader.ReadGroup(*task.group, &scratch[w], &stored);
      if (!st.ok())
        error.Set(
            i, InContext("group of tensor '" + f.tensors[task.group->members[0]].name + "'", st));
      if (options.progress_done != nullptr) *options.progress_done += GroupBytes(*task.group);
      return;
    }
    const uint64_t bytes = PieceBytes(*task.tensor, *task.piece);
    error.Set(i, CheckBaseRows(*task.tensor, *task.piece, task.base));
    if (base.mapped()) Release(task.base, bytes);
    // The piece itself must be intact too, or apply would fail later.
    const uint8_t* stored = nullptr;
    const Status st = reader.ReadPiece(*task.piece, &scratch[w], &stored);
    if (!st.ok())
      error.Set(i, Status(st.code(), "tensor '" + task.tensor->name + "': " + st.message()));
    if (options.progress_done != nullptr) *options.progress_done += bytes;
  });
  ARC_V3_RETURN_IF_ERROR(thrown);
  if (error.failed()) return error.status();
  if (report != nullptr) {
    report->files = m.files.size();
    report->tensors = base_data.size();  // grouped tensors included
    report->pieces = tasks.size();
    report->target_bytes = total;
    report->delta_bytes = reader.source().size();
  }
  return Status::Ok();
}

namespace {

// The group a partial apply decoded last: members of a group are usually selected together.
struct GroupCache {
  const Group* group = nullptr;
  std::vector<uint16_t> decoded;
};

Status ApplyRowsCached(const Checkpoint& base, const Reader& delta, const TensorEntry& t,
                       uint64_t row_begin, uint64_t row_end, uint8_t* out, int threads,
                       GroupCache* cache) {
  row_end = std::min(row_end, t.rows());
  if (row_begin > row_end) return Status(ErrorCode::kInvalidArgument, "row range is reversed");
  const uint64_t row_bytes = t.row_bytes();
  if (t.grouped()) {
    // Groups hold small tensors only: decode the whole group, keep the rows.
    const FileEntry* file = nullptr;
    for (const FileEntry& f : delta.manifest().files) {
      for (const TensorEntry& entry : f.tensors) {
        if (&entry == &t) file = &f;
      }
    }
    if (file == nullptr) {
      return Status(ErrorCode::kInvalidArgument, "tensor '" + t.name + "' is not from this delta");
    }
    const Group& group = file->groups[t.group];
    if (cache->group != &group) {
      cache->group = nullptr;
      ARC_V3_RETURN_IF_ERROR(ApplyGroup(base, delta, *file, group, &cache->decoded, t.name));
      cache->group = &group;
    }
    const uint8_t* at = reinterpret_cast<const uint8_t*>(cache->decoded.data());
    for (size_t member : group.members) {
      if (&file->tensors[member] == &t) break;
      at += file->tensors[member].bytes();
    }
    if (row_end > row_begin) {
      std::memcpy(out, at + row_begin * row_bytes, (row_end - row_begin) * row_bytes);
    }
    return Status::Ok();
  }
  const uint8_t* base_data = nullptr;
  if (t.kind == TensorKind::kDelta) {
    ARC_V3_RETURN_IF_ERROR(FindBaseTensor(base, t, &base_data));
  }
  std::vector<const Piece*> pieces;
  for (const Piece& p : t.pieces) {
    if (p.row_end > row_begin && p.row_begin < row_end) pieces.push_back(&p);
  }
  FirstError error;
  const Status thrown =
      TryParallelFor(pieces.size(), WorkerCount(threads, pieces.size()), [&](size_t i, size_t) {
        if (error.Skip(i)) return;
        const Piece& p = *pieces[i];
        const uint8_t* base_rows = base_data ? base_data + p.row_begin * row_bytes : nullptr;
        if (base_rows != nullptr) {
          Status st = CheckBaseRows(t, p, base_rows);
          if (!st.ok()) return error.Set(i, st);
        }
        std::vector<uint8_t> scratch, decoded(PieceBytes(t, p));
        const uint8_t* stored = nullptr;
        Status st = delta.ReadPiece(p, &scratch, &stored);
        if (st.ok()) {
          st = DecodePiece(p, stored, base_rows, decoded.size(), safetensors::DTypeSize(t.dtype),
                           decoded.data());
        }
        if (!st.ok())
          return error.Set(i, Status(st.code(), "tensor '" + t.name + "': " + st.message()));
        const uint64_t first = std::max(p.row_begin, row_begin),
                       last = std::min(p.row_end, row_end);
        std::memcpy(out + (first - row_begin) * row_bytes,
                    decoded.data() + (first - p.row_begin) * row_bytes, (last - first) * row_bytes);
      });
  ARC_V3_RETURN_IF_ERROR(thrown);
  return error.status();
}

// The tensors of a partial apply: those whose name matches, each sliced to its rows.
struct PartialSelection {
  std::vector<const TensorEntry*> tensors;
  std::vector<safetensors::TensorInfo> infos;         // as the output holds them
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // the rows of each
};

void SelectTensors(const Manifest& m, const std::regex& pattern, uint64_t row_begin,
                   uint64_t row_end, PartialSelection* selected) {
  for (const FileEntry& f : m.files) {
    for (const TensorEntry& t : f.tensors) {
      if (!std::regex_match(t.name, pattern)) continue;
      const uint64_t first = t.shape.empty() ? 0 : std::min(row_begin, t.rows());
      const uint64_t last = t.shape.empty() ? 1 : std::min(row_end, t.rows());
      safetensors::TensorInfo info;
      info.name = t.name;
      info.dtype = t.dtype;
      info.shape = t.shape;
      if (!info.shape.empty()) info.shape[0] = last - first;
      info.end = (last - first) * t.row_bytes();
      selected->tensors.push_back(&t);
      selected->infos.push_back(info);
      selected->ranges.emplace_back(first, last);
    }
  }
}

// Decodes the selected rows of every selected tensor and writes them after the `header`
// bytes of aside file `index`.
Status WriteSelected(const DeltaAndBase& inputs, const PartialSelection& selected, uint64_t header,
                     const RunOptions& options, const AsideFiles& out, size_t index) {
  std::vector<uint8_t> buffer;
  GroupCache cache;
  for (size_t i = 0; i < selected.tensors.size(); ++i) {
    buffer.resize(selected.infos[i].size());
    ARC_V3_RETURN_IF_ERROR(ApplyRowsCached(inputs.base, inputs.reader, *selected.tensors[i],
                                           selected.ranges[i].first, selected.ranges[i].second,
                                           buffer.data(), options.threads, &cache));
    ARC_V3_RETURN_IF_ERROR(file_io::WriteAt(out.fd(index), buffer.data(), buffer.size(),
                                            header + selected.infos[i].begin, out.temp(index)));
    if (options.progress_done != nullptr) *options.progress_done += buffer.size();
  }
  return Status::Ok();
}

}  // namespace

Status ApplyRows(const Checkpoint& base, const Reader& delta, const TensorEntry& t,
                 uint64_t row_begin, uint64_t row_end, uint8_t* out, int threads) {
  GroupCache cache;
  return ApplyRowsCached(base, delta, t, row_begin, row_end, out, threads, &cache);
}

Status ApplyPartial(const std::string& prev_path, const std::string& delta_path,
                    const std::string& tensor_regex, uint64_t row_begin, uint64_t row_end,
                    const std::string& out_path, const RunOptions& options, RunReport* report) {
  std::regex pattern;
  try {
    pattern = std::regex(tensor_regex, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return Status(ErrorCode::kInvalidArgument,
                  "tensor pattern '" + tensor_regex + "' is not a regular expression: " + e.what());
  }
  if (row_begin > row_end) return Status(ErrorCode::kInvalidArgument, "row range is reversed");
  DeltaAndBase inputs;
  ARC_V3_RETURN_IF_ERROR(OpenDeltaAndBase(prev_path, delta_path, &inputs));
  PartialSelection selected;
  SelectTensors(inputs.reader.manifest(), pattern, row_begin, row_end, &selected);
  if (selected.tensors.empty()) {
    return Status(ErrorCode::kInvalidArgument,
                  "no tensor of the delta matches '" + tensor_regex + "'");
  }
  // The output is sized by what backs it: delta tensors by the base (the manifest bounds
  // the others by their stored bytes).
  for (const TensorEntry* t : selected.tensors) {
    const uint8_t* data = nullptr;
    if (t->kind == TensorKind::kDelta) {
      ARC_V3_RETURN_IF_ERROR(FindBaseTensor(inputs.base, *t, &data));
    }
  }
  std::map<std::string, std::string> metadata;
  if (row_begin != 0 || row_end != UINT64_MAX) {
    metadata["arc_v3_rows"] = std::to_string(row_begin) + ":" +
                              (row_end == UINT64_MAX ? std::string() : std::to_string(row_end));
  }
  const std::vector<uint8_t> header = safetensors::BuildHeader(&selected.infos, metadata);
  uint64_t total = 0;
  for (const auto& info : selected.infos) total += info.size();
  if (options.progress_total != nullptr) *options.progress_total = total;
  AsideFiles out(options.overwrite);
  size_t index = 0;
  ARC_V3_RETURN_IF_ERROR(
      out.Create(fs::absolute(out_path).string(), header.size() + total, &index));
  ARC_V3_RETURN_IF_ERROR(
      file_io::WriteAt(out.fd(index), header.data(), header.size(), 0, out.temp(index)));
  ARC_V3_RETURN_IF_ERROR(WriteSelected(inputs, selected, header.size(), options, out, index));
  ARC_V3_RETURN_IF_ERROR(out.SyncAndClose(options.sync));
  ARC_V3_RETURN_IF_ERROR(out.Commit(options.sync));
  if (report != nullptr) {
    report->files = 1;
    report->tensors = selected.tensors.size();
    report->target_bytes = header.size() + total;
    report->delta_bytes = inputs.reader.source().size();
    report->written = {out_path};
  }
  return Status::Ok();
}

}  // namespace checkpoint
}  // namespace arc_v3

namespace arc_v3 {

Status DiffCheckpoints(const std::string& prev, const std::string& next,
                       const std::string& delta_path, const CheckpointOptions& options,
                       CheckpointReport* report) {
  return checkpoint::Diff(prev, next, delta_path, checkpoint::RunOptions(options), report);
}

Status ApplyDelta(const std::string& prev, const std::string& delta_path, const std::string& out,
                  const CheckpointOptions& options, CheckpointReport* report) {
  return checkpoint::Apply(prev, delta_path, out, checkpoint::RunOptions(options), report);
}

Status ApplyDeltaPart(const std::string& prev, const std::string& delta_path,
                      const std::string& tensor_regex, uint64_t row_begin, uint64_t row_end,
                      const std::string& out_path, const CheckpointOptions& options,
                      CheckpointReport* report) {
  return checkpoint::ApplyPartial(prev, delta_path, tensor_regex, row_begin, row_end, out_path,
                                  checkpoint::RunOptions(options), report);
}

Status VerifyDelta(const std::string& prev, const std::string& delta_path,
                   const CheckpointOptions& options, CheckpointReport* report) {
  return checkpoint::Verify(prev, delta_path, checkpoint::RunOptions(options), report);
}

}  // namespace arc_v3
