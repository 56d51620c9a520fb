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

namespace arc_v3 {
namespace container {
namespace {

namespace fs = std::filesystem;

constexpr char kIndexName[] = "model.safetensors.index.json";

Status IoError(const std::string& path, const char* what) {
  return Status(ErrorCode::kInvalidArgument, path + ": " + what + ": " + std::strerror(errno));
}

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

// The error of a parallel run's first failing task in task order, so that the error
// reported does not depend on the thread count: tasks after a failure are skipped, tasks
// before it still run.
class FirstError {
 public:
  void Set(size_t task, const Status& s) {
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (task < first_task_) {
      first_task_ = task;
      status_ = s;
    }
  }
  bool Skip(size_t task) {
    std::lock_guard<std::mutex> lock(mutex_);
    return task > first_task_;
  }
  bool failed() {
    std::lock_guard<std::mutex> lock(mutex_);
    return !status_.ok();
  }
  Status status() {
    std::lock_guard<std::mutex> lock(mutex_);
    return status_;
  }

 private:
  std::mutex mutex_;
  Status status_;
  size_t first_task_ = SIZE_MAX;
};

Status WriteAll(int fd, const uint8_t* data, uint64_t size, uint64_t offset, const std::string& path) {
  while (size > 0) {
    const ssize_t n = pwrite(fd, data, std::min<uint64_t>(size, 1u << 30), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError(path, "cannot write");
    }
    data += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

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

Status SyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IoError(dir, "cannot open directory");
  const int rc = fsync(fd);
  close(fd);
  return rc == 0 ? Status::Ok() : IoError(dir, "cannot sync directory");
}

// Output files written aside (".NAME.arc_v3-tmp-PID" in the target directory) and renamed
// over their final names only once all of them are complete and synced. Whatever was not
// committed is unlinked on destruction.
// An output path must be in a folder that exists, and may replace a file only when
// `overwrite`.
Status CheckOutput(const std::string& path, bool overwrite) {
  std::error_code ec;
  const fs::path parent = fs::absolute(path, ec).parent_path();
  if (!fs::is_directory(parent, ec)) {
    return Status(ErrorCode::kInvalidArgument, path + ": cannot create: its folder " + parent.string() +
                                                   " does not exist");
  }
  if (!overwrite && fs::exists(path, ec)) {
    return Status(ErrorCode::kAlreadyExists, path + " already exists (not replaced without --force)");
  }
  return Status::Ok();
}

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
    Status s = CheckOutput(final_path, overwrite_);
    if (!s.ok()) return s;
    Entry e;
    e.final_path = final_path;
    const fs::path p(final_path);
    e.temp = (p.parent_path() / ("." + p.filename().string() + ".arc_v3-tmp-" +
                                 std::to_string(getpid()))).string();
    unlink(e.temp.c_str());  // a leftover of a killed run of this same pid
    e.fd = open(e.temp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (e.fd < 0) return IoError(e.temp, "cannot create");
    entries_.push_back(e);
    if (size > 0) {
      const int rc = posix_fallocate(entries_.back().fd, 0, static_cast<off_t>(size));
      if (rc == EOPNOTSUPP || rc == EINVAL) {
        if (ftruncate(entries_.back().fd, static_cast<off_t>(size)) != 0) {
          return IoError(e.temp, "cannot resize");
        }
      } else if (rc != 0) {
        errno = rc;
        return IoError(e.temp, "cannot reserve space");
      }
    }
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
        Status s = SyncDirectory(d.empty() ? "." : d);
        if (!s.ok()) return s;
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
      const Status found = FindBaseTensor(base, t, &(*base_data)[&t]);
      if (!found.ok()) return found;
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
                     std::to_string(p.row_end) + " differ from the delta's base (checksum mismatch)");
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
  Status s = reader.ReadPiece(p, &scratch, &stored);
  if (!s.ok()) return s;
  out->resize(p.row_end);
  return DecodePiece(p, stored, nullptr, p.row_end, 1, out->data());
}

Status OpenDelta(const std::string& path, Reader* reader) {
  std::unique_ptr<MappedFile> file;
  Status s = MappedFile::Open(path, &file);
  if (!s.ok()) return s;
  s = Reader::Open(std::move(file), reader);
  if (!s.ok()) return Status(s.code(), path + ": " + s.message());
  return s;
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
  Status s = GroupBases(base, f, g, needed_by, &base_data, &bytes);
  if (!s.ok()) return s;
  std::vector<uint8_t> scratch;
  const uint8_t* stored = nullptr;
  s = reader.ReadGroup(g, &scratch, &stored);
  if (s.ok()) s = DecodeGroup(g, stored, base_data, bytes, decoded);
  for (size_t k = 0; k < base_data.size() && base.mapped(); ++k) Release(base_data[k], bytes[k]);
  if (!s.ok()) {
    return Status(s.code(), "group of tensor '" + f.tensors[g.members[0]].name + "': " + s.message());
  }
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
      view.tensors.push_back({info.name, info.dtype, info.shape, file.data(info), info.size(), info.begin});
    }
    result.mapped_.push_back(std::move(file));  // the mapping does not move
    s = result.Add(std::move(view));
    if (!s.ok()) return s;
  }
  *checkpoint = std::move(result);
  return Status::Ok();
}

Status Checkpoint::FromMemory(const std::string& file_name, std::vector<TensorView> tensors,
                              Checkpoint* checkpoint) {
  Checkpoint result;
  result.path_ = "memory:" + file_name;
  std::vector<safetensors::TensorInfo> infos;
  for (const TensorView& t : tensors) {
    const size_t element = safetensors::DTypeSize(t.dtype);
    if (element == 0) return Status(ErrorCode::kInvalidArgument, "tensor '" + t.name + "': unknown dtype '" + t.dtype + "'");
    uint64_t bytes = element;
    for (uint64_t d : t.shape) {
      if (d != 0 && bytes > UINT64_MAX / d) return Status(ErrorCode::kInvalidArgument, "tensor '" + t.name + "' is too big");
      bytes *= d;
    }
    if (t.bytes != 0 && t.bytes != bytes) {
      return Status(ErrorCode::kInvalidArgument, "tensor '" + t.name + "' has " + std::to_string(t.bytes) +
                                                     " bytes, its dtype and shape " + std::to_string(bytes));
    }
    if (t.data == nullptr && bytes != 0) return Status(ErrorCode::kInvalidArgument, "tensor '" + t.name + "' has no data");
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
  Status s = result.Add(std::move(view));
  if (!s.ok()) return s;
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

// Codes every piece of `next` against `prev` (see Diff): the container's header and
// manifest in `head`, the pieces' stored bytes in `outputs`, in data-section order.
Status Encode(const Checkpoint& prev, const Checkpoint& next, const RunOptions& options,
              std::vector<uint8_t>* head, std::vector<std::vector<uint8_t>>* outputs, RunReport* report) {
  if (!prev.empty() && prev.directory() != next.directory()) {
    return Status(ErrorCode::kInvalidArgument, "PREV and NEXT must both be files or both directories");
  }
  Manifest m;
  m.directory = next.directory();
  std::vector<const uint8_t*> raw;  // per output file: the bytes its header piece holds
  std::vector<const FileView*> views;
  std::set<std::string> next_names, next_tensors;
  for (const FileView& file : next.files()) {
    FileEntry f;
    f.name = file.name;
    next_names.insert(f.name);
    f.size = file.size;
    f.data_start = file.data_start;
    f.header.row_end = f.data_start;
    // Data-section bytes outside every tensor (alignment padding, if any) travel as fills.
    uint64_t at = f.data_start;
    for (const TensorView& t : file.tensors) {
      if (f.data_start + t.offset > at) f.fills.emplace_back(at, f.data_start + t.offset - at);
      at = std::max(at, f.data_start + t.offset + t.bytes);
    }
    if (f.size > at) f.fills.emplace_back(at, f.size - at);
    if (!f.fills.empty() && file.raw == nullptr) {
      return Status(ErrorCode::kInternal, file.name + ": gaps between tensors of a file in memory");
    }
    uint64_t fill_total = 0;
    for (const auto& r : f.fills) fill_total += r.second;
    f.fill.row_end = fill_total;
    for (const TensorView& info : file.tensors) {
      TensorEntry t;
      t.name = info.name;
      t.dtype = info.dtype;
      t.shape = info.shape;
      t.data_offset = info.offset;
      next_tensors.insert(t.name);
      const TensorView* base = prev.Find(t.name);
      t.kind = base == nullptr ? TensorKind::kAdded
               : (base->dtype != t.dtype || base->shape != t.shape) ? TensorKind::kReshaped
                                                                     : TensorKind::kDelta;
      t.pieces = PlanPieces(t);
      f.tensors.push_back(std::move(t));
    }
    if (options.group && options.format == Format::kDefault) {
      AssignGroups(&f, [&](const TensorEntry& t) {
        const TensorView* base = prev.Find(t.name);
        const uint8_t* target = next.Find(t.name)->data;
        const bool worth = WorthGrouping(base->data, target, t.bytes());
        // Read again when coded: until then they need not stay resident.
        if (prev.mapped()) Release(base->data, t.bytes());
        if (next.mapped()) Release(target, t.bytes());
        return worth;
      });
    }
    m.files.push_back(std::move(f));
    raw.push_back(file.header);
    views.push_back(&file);
  }
  std::unique_ptr<MappedFile> index;
  if (m.directory && !next.index_path().empty()) {
    Status s = MappedFile::Open(next.index_path(), &index);
    if (!s.ok()) return s;
    if (index->size() > 0) {
      FileEntry f;
      f.name = kIndexName;
      next_names.insert(f.name);
      f.size = f.data_start = f.header.row_end = index->size();
      m.files.push_back(std::move(f));
      raw.push_back(index->data());
      views.push_back(nullptr);
    }
  }
  for (const FileView& file : prev.files()) {
    if (m.directory && next_names.count(file.name) == 0) m.removed_files.push_back(file.name);
    for (const TensorView& t : file.tensors) {
      if (next_tensors.count(t.name) == 0) m.removed_tensors.push_back(t.name);
    }
  }
  if (m.directory && !prev.index_path().empty() && next_names.count(kIndexName) == 0) {
    m.removed_files.push_back(kIndexName);
  }

  // Every piece (headers and fills included) is one task; outputs are kept in memory
  // (the delta is small) and written in manifest order afterwards.
  struct EncodeTask {
    const uint8_t* base;
    const uint8_t* target;
    uint64_t bytes;
    size_t element_size;
    bool bf16;
    Piece* piece;
    bool tensor;  // counts towards progress
    FileEntry* file = nullptr;  // with `group`, instead of base, target and piece
    Group* group = nullptr;
    uint64_t rows = 0;  // the piece's tensor's (0: not a tensor's piece)
  };
  const auto base_of = [&prev](const TensorEntry& t) { return prev.Find(t.name)->data; };
  const auto target_of = [&next](const TensorEntry& t) { return next.Find(t.name)->data; };
  std::vector<EncodeTask> tasks;
  uint64_t total = 0;
  for (size_t fi = 0; fi < m.files.size(); ++fi) {
    FileEntry& f = m.files[fi];
    tasks.push_back({nullptr, raw[fi], f.data_start, 1, false, &f.header, false});
    for (size_t ti = 0; ti < f.tensors.size(); ++ti) {
      TensorEntry& t = f.tensors[ti];
      if (t.grouped()) {
        // A group is one task, stored where its first member would be.
        Group& g = f.groups[t.group];
        if (g.members[0] == ti) {
          tasks.push_back({nullptr, nullptr, GroupBytes(g), 2, true, nullptr, true, &f, &g});
          total += GroupBytes(g);
        }
        continue;
      }
      const uint8_t* target = target_of(t);
      const uint8_t* base = t.kind == TensorKind::kDelta ? base_of(t) : nullptr;
      for (Piece& p : t.pieces) {
        const uint64_t offset = p.row_begin * t.row_bytes();
        const uint64_t bytes = PieceBytes(t, p);
        tasks.push_back({base ? base + offset : nullptr, target + offset, bytes,
                         safetensors::DTypeSize(t.dtype), t.dtype == "BF16", &p, true, nullptr, nullptr,
                         t.rows()});
        total += bytes;
      }
    }
  }
  // Fills are gathered into one buffer per file first (tiny in practice).
  std::vector<std::vector<uint8_t>> fill_bytes(m.files.size());
  for (size_t fi = 0; fi < m.files.size(); ++fi) {
    FileEntry& f = m.files[fi];
    if (f.fills.empty()) continue;
    for (const auto& r : f.fills) {
      fill_bytes[fi].insert(fill_bytes[fi].end(), views[fi]->raw + r.first, views[fi]->raw + r.first + r.second);
    }
    tasks.push_back({nullptr, fill_bytes[fi].data(), fill_bytes[fi].size(), 1, false, &f.fill, false});
  }
  if (options.progress_total != nullptr) *options.progress_total = total;

  outputs->assign(tasks.size(), {});
  FirstError error;
  const Status thrown = TryParallelFor(tasks.size(), WorkerCount(options.threads, tasks.size()), [&](size_t i, size_t) {
    if (error.Skip(i)) return;
    const EncodeTask& task = tasks[i];
    if (task.group != nullptr) {
      std::vector<const uint8_t*> base, target;
      std::vector<uint64_t> bytes, base_xxh3;
      for (size_t member : task.group->members) {
        const TensorEntry& t = task.file->tensors[member];
        base.push_back(base_of(t));
        target.push_back(target_of(t));
        bytes.push_back(t.bytes());
        Prefault(base.back(), bytes.back());
        Prefault(target.back(), bytes.back());
      }
      error.Set(i, EncodeGroup(base, target, bytes, options.effort, task.group, &base_xxh3, &(*outputs)[i]));
      for (size_t k = 0; k < base_xxh3.size(); ++k) {
        task.file->tensors[task.group->members[k]].base_xxh3 = base_xxh3[k];
      }
      for (size_t k = 0; k < base.size(); ++k) {
        if (prev.mapped()) Release(base[k], bytes[k]);
        if (next.mapped()) Release(target[k], bytes[k]);
      }
      if (options.progress_done != nullptr) *options.progress_done += task.bytes;
      if (options.hook) error.Set(i, options.hook("piece"));
      return;
    }
    Prefault(task.base, task.bytes);
    Prefault(task.target, task.bytes);
    error.Set(i, EncodePiece(task.base, task.target, task.bytes, task.element_size, task.bf16,
                             options.effort, task.piece, &(*outputs)[i], options.format));
    if (task.tensor) {  // fills are copies, not mapped
      if (prev.mapped()) Release(task.base, task.bytes);
      if (next.mapped()) Release(task.target, task.bytes);
    }
    if (task.tensor && options.progress_done != nullptr) *options.progress_done += task.bytes;
    if (task.tensor && options.hook) error.Set(i, options.hook("piece"));
  });
  if (!thrown.ok()) return thrown;
  if (error.failed()) return error.status();

  // The data section's order: the manifest's, or with row_order headers, fills and groups
  // first, then the pieces by the fraction of their tensor's rows they start at (ties in
  // manifest order), so that the pieces of rows [0, B) of every tensor are one range.
  std::vector<size_t> order(tasks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (options.row_order) {
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
  for (FileEntry& f : m.files) {
    for (TensorEntry& t : f.tensors) {
      if (t.grouped()) continue;  // base_xxh3 is the member's own, set by EncodeGroup
      std::vector<uint64_t> base_hashes, target_hashes;
      for (const Piece& p : t.pieces) {
        base_hashes.push_back(p.base_xxh3);
        target_hashes.push_back(p.target_xxh3);
      }
      t.base_xxh3 = t.kind == TensorKind::kDelta ? CombineHashes(base_hashes) : 0;
      t.target_xxh3 = CombineHashes(target_hashes);
    }
  }
  *head = SerializeHeaderAndManifest(m, offset);
  if (report != nullptr) {
    report->files = m.files.size();
    report->pieces = tasks.size();
    report->tensors = next_tensors.size();
    report->target_bytes = 0;
    for (const FileEntry& f : m.files) report->target_bytes += f.size;
    report->delta_bytes = head->size() + offset;
  }
  return Status::Ok();
}

}  // namespace

Status Diff(const Checkpoint& prev, const Checkpoint& next, const std::string& delta_path,
            const RunOptions& options, RunReport* report) {
  Status s = CheckOutput(delta_path, options.overwrite);  // before the work, not after
  if (!s.ok()) return s;
  std::vector<uint8_t> head;
  std::vector<std::vector<uint8_t>> outputs;
  s = Encode(prev, next, options, &head, &outputs, report);
  if (!s.ok()) return s;
  uint64_t size = head.size();
  for (const auto& o : outputs) size += o.size();
  AsideFiles out(options.overwrite);
  size_t index = 0;
  s = out.Create(fs::absolute(delta_path).string(), size, &index);
  if (!s.ok()) return s;
  s = WriteAll(out.fd(index), head.data(), head.size(), 0, out.temp(index));
  uint64_t at = head.size();
  for (size_t i = 0; i < outputs.size() && s.ok(); ++i) {
    s = WriteAll(out.fd(index), outputs[i].data(), outputs[i].size(), at, out.temp(index));
    at += outputs[i].size();
  }
  if (s.ok()) s = out.SyncAndClose(options.sync);
  if (s.ok()) s = out.Commit(options.sync);
  if (!s.ok()) return s;
  if (report != nullptr) report->written = {delta_path};
  return Status::Ok();
}

Status Diff(const Checkpoint& prev, const Checkpoint& next, const RunOptions& options,
            std::vector<uint8_t>* delta, RunReport* report) {
  std::vector<uint8_t> head;
  std::vector<std::vector<uint8_t>> outputs;
  Status s = Encode(prev, next, options, &head, &outputs, report);
  if (!s.ok()) return s;
  *delta = std::move(head);
  for (const auto& o : outputs) delta->insert(delta->end(), o.begin(), o.end());
  return Status::Ok();
}

Status Diff(const std::string& prev_path, const std::string& next_path, const std::string& delta_path,
            const RunOptions& options, RunReport* report) {
  Checkpoint prev, next;
  Status s = Checkpoint::Open(prev_path, &prev);
  if (!s.ok()) return s;
  s = Checkpoint::Open(next_path, &next);
  if (!s.ok()) return s;
  return Diff(prev, next, delta_path, options, report);
}

Status Apply(const std::string& prev_path, const std::string& delta_path, const std::string& out_path,
             const RunOptions& options, RunReport* report) {
  Reader reader;
  Status s = OpenDelta(delta_path, &reader);
  if (!s.ok()) return s;
  Checkpoint base;
  s = Checkpoint::Open(prev_path, &base);
  if (!s.ok()) return s;
  const Manifest& m = reader.manifest();
  std::map<const TensorEntry*, const uint8_t*> base_data;
  s = MatchBase(base, m, &base_data);
  if (!s.ok()) return s;

  // Where the files go: a directory for directory deltas (created if needed); for a file
  // delta, `out_path` itself, or the target's name inside `out_path` if that is a directory.
  std::error_code ec;
  std::vector<std::string> finals;
  if (m.directory) {
    fs::create_directories(out_path, ec);
    if (!fs::is_directory(out_path, ec)) {
      return Status(ErrorCode::kInvalidArgument, out_path + ": cannot create the output directory");
    }
    for (const FileEntry& f : m.files) finals.push_back((fs::path(out_path) / f.name).string());
  } else {
    finals.push_back(fs::is_directory(out_path, ec) ? (fs::path(out_path) / m.files[0].name).string()
                                                    : out_path);
  }
  const bool in_place = fs::equivalent(m.directory ? out_path : finals[0], prev_path, ec);

  AsideFiles out(options.overwrite || in_place);
  std::vector<Task> tasks;
  uint64_t total = 0;
  for (size_t fi = 0; fi < m.files.size(); ++fi) {
    const FileEntry& f = m.files[fi];
    size_t index = 0;
    s = out.Create(fs::absolute(finals[fi]).string(), f.size, &index);
    if (!s.ok()) return s;
    std::vector<uint8_t> bytes;
    s = DecodeBytes(reader, f.header, &bytes);
    if (!s.ok()) return Status(s.code(), f.name + " header: " + s.message());
    s = WriteAll(out.fd(index), bytes.data(), bytes.size(), 0, out.temp(index));
    if (!s.ok()) return s;
    if (!f.fills.empty()) {
      s = DecodeBytes(reader, f.fill, &bytes);
      if (!s.ok()) return Status(s.code(), f.name + " fill: " + s.message());
      uint64_t at = 0;
      for (const auto& r : f.fills) {
        s = WriteAll(out.fd(index), bytes.data() + at, r.second, r.first, out.temp(index));
        if (!s.ok()) return s;
        at += r.second;
      }
    }
    for (const TensorEntry& t : f.tensors) {
      const auto it = base_data.find(&t);
      for (const Piece& p : t.pieces) {
        tasks.push_back({index, &t, &p,
                         it == base_data.end() ? nullptr : it->second + p.row_begin * t.row_bytes()});
        total += PieceBytes(t, p);
      }
    }
    for (const Group& g : f.groups) {
      Task task;
      task.file = index;
      task.group = &g;
      tasks.push_back(task);
      total += GroupBytes(g);
    }
  }
  if (options.progress_total != nullptr) *options.progress_total = total;

  const size_t workers = WorkerCount(options.threads, tasks.size());
  std::vector<std::vector<uint8_t>> buffers(workers);
  std::vector<std::vector<uint8_t>> scratch(workers);
  std::vector<std::vector<uint16_t>> group_buffers(workers);
  std::atomic<int64_t> decode_ns{0}, write_ns{0};
  FirstError error;
  const Status thrown = TryParallelFor(tasks.size(), workers, [&](size_t i, size_t w) {
    if (error.Skip(i)) return;
    const Task& task = tasks[i];
    if (task.group != nullptr) {
      const FileEntry& f = m.files[task.file];
      const auto start = std::chrono::steady_clock::now();
      Status st = ApplyGroup(base, reader, f, *task.group, &group_buffers[w], "");
      decode_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
      const uint8_t* decoded = reinterpret_cast<const uint8_t*>(group_buffers[w].data());
      const auto write_start = std::chrono::steady_clock::now();
      for (size_t k = 0; k < task.group->members.size() && st.ok(); ++k) {
        const TensorEntry& t = f.tensors[task.group->members[k]];
        st = WriteAll(out.fd(task.file), decoded, t.bytes(), f.data_start + t.data_offset,
                      out.temp(task.file));
        if (options.sync) StartWriteback(out.fd(task.file), f.data_start + t.data_offset, t.bytes());
        decoded += t.bytes();
      }
      write_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - write_start).count();
      if (!st.ok()) return error.Set(i, st);
      if (options.progress_done != nullptr) *options.progress_done += GroupBytes(*task.group);
      if (options.hook) error.Set(i, options.hook("piece"));
      return;
    }
    const TensorEntry& t = *task.tensor;
    const Piece& p = *task.piece;
    const uint64_t bytes = PieceBytes(t, p);
    const auto fail = [&](const Status& e) {
      error.Set(i, e.code() == ErrorCode::kChecksumMismatch
                    ? e
                    : Status(e.code(), "tensor '" + t.name + "': " + e.message()));
    };
    // The base rows are hashed only when decoding fails: every coder XORs the base into
    // its result, so a wrong base fails the target checksum, and the base check then
    // names the cause (the verify command still checks every base up front).
    const auto fail_checking_base = [&](const Status& e) {
      const Status base_check =
          task.base != nullptr ? CheckBaseRows(t, p, task.base) : Status::Ok();
      fail(base_check.ok() ? e : base_check);
    };
    Prefault(task.base, bytes);
    const uint8_t* stored = nullptr;
    Status st = reader.ReadPiece(p, &scratch[w], &stored);
    if (!st.ok()) return fail_checking_base(st);
    buffers[w].resize(bytes);
    const auto start = std::chrono::steady_clock::now();
    st = DecodePiece(p, stored, task.base, bytes, safetensors::DTypeSize(t.dtype), buffers[w].data());
    const auto decoded = std::chrono::steady_clock::now();
    decode_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(decoded - start).count();
    if (!st.ok()) return fail_checking_base(st);
    const uint64_t at = m.files[task.file].data_start + t.data_offset + p.row_begin * t.row_bytes();
    if (base.mapped()) Release(task.base, bytes);
    st = WriteAll(out.fd(task.file), buffers[w].data(), bytes, at, out.temp(task.file));
    write_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - decoded).count();
    if (!st.ok()) return fail(st);
    if (options.sync) StartWriteback(out.fd(task.file), at, bytes);
    if (options.progress_done != nullptr) *options.progress_done += bytes;
    if (options.hook) error.Set(i, options.hook("piece"));
  });
  if (!thrown.ok()) return thrown;
  if (error.failed()) return error.status();
  const auto sync_start = std::chrono::steady_clock::now();
  s = out.SyncAndClose(options.sync);
  if (!s.ok()) return s;
  if (options.hook) {
    s = options.hook("rename");
    if (!s.ok()) return s;
  }
  s = out.Commit(options.sync);
  if (!s.ok()) return s;
  if (in_place) {
    // The new checkpoint is complete; shards it no longer has go last.
    for (const std::string& name : m.removed_files) {
      fs::remove(fs::path(out_path) / name, ec);
    }
  }
  if (report != nullptr) {
    report->files = m.files.size();
    report->pieces = tasks.size();
    report->tensors = 0;
    report->target_bytes = 0;
    for (const FileEntry& f : m.files) {
      report->tensors += f.tensors.size();
      report->target_bytes += f.size;
    }
    report->delta_bytes = reader.source().size();
    report->written = finals;
    report->decode_seconds = decode_ns * 1e-9;
    report->write_seconds = write_ns * 1e-9;
    report->sync_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - sync_start).count();
  }
  return Status::Ok();
}

Status Verify(const std::string& prev_path, const std::string& delta_path, const RunOptions& options,
              RunReport* report) {
  Reader reader;
  Status s = OpenDelta(delta_path, &reader);
  if (!s.ok()) return s;
  Checkpoint base;
  s = Checkpoint::Open(prev_path, &base);
  if (!s.ok()) return s;
  std::map<const TensorEntry*, const uint8_t*> base_data;
  s = MatchBase(base, reader.manifest(), &base_data);
  if (!s.ok()) return s;
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
      if (!st.ok()) {
        error.Set(i, Status(st.code(), "group of tensor '" + f.tensors[task.group->members[0]].name +
                                           "': " + st.message()));
      }
      if (options.progress_done != nullptr) *options.progress_done += GroupBytes(*task.group);
      return;
    }
    const uint64_t bytes = PieceBytes(*task.tensor, *task.piece);
    error.Set(i, CheckBaseRows(*task.tensor, *task.piece, task.base));
    if (base.mapped()) Release(task.base, bytes);
    // The piece itself must be intact too, or apply would fail later.
    const uint8_t* stored = nullptr;
    const Status st = reader.ReadPiece(*task.piece, &scratch[w], &stored);
    if (!st.ok()) error.Set(i, Status(st.code(), "tensor '" + task.tensor->name + "': " + st.message()));
    if (options.progress_done != nullptr) *options.progress_done += bytes;
  });
  if (!thrown.ok()) return thrown;
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
      Status s = ApplyGroup(base, delta, *file, group, &cache->decoded, t.name);
      if (!s.ok()) return s;
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
    const Status found = FindBaseTensor(base, t, &base_data);
    if (!found.ok()) return found;
  }
  std::vector<const Piece*> pieces;
  for (const Piece& p : t.pieces) {
    if (p.row_end > row_begin && p.row_begin < row_end) pieces.push_back(&p);
  }
  FirstError error;
  const Status thrown = TryParallelFor(pieces.size(), WorkerCount(threads, pieces.size()), [&](size_t i, size_t) {
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
    if (!st.ok()) return error.Set(i, Status(st.code(), "tensor '" + t.name + "': " + st.message()));
    const uint64_t first = std::max(p.row_begin, row_begin), last = std::min(p.row_end, row_end);
    std::memcpy(out + (first - row_begin) * row_bytes, decoded.data() + (first - p.row_begin) * row_bytes,
                (last - first) * row_bytes);
  });
  if (!thrown.ok()) return thrown;
  return error.status();
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
    return Status(ErrorCode::kInvalidArgument, "bad --tensors regex '" + tensor_regex + "': " + e.what());
  }
  if (row_begin > row_end) return Status(ErrorCode::kInvalidArgument, "row range is reversed");
  Reader reader;
  Status s = OpenDelta(delta_path, &reader);
  if (!s.ok()) return s;
  Checkpoint base;
  s = Checkpoint::Open(prev_path, &base);
  if (!s.ok()) return s;
  std::vector<const TensorEntry*> selected;
  std::vector<safetensors::TensorInfo> infos;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const FileEntry& f : reader.manifest().files) {
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
      selected.push_back(&t);
      infos.push_back(info);
      ranges.emplace_back(first, last);
    }
  }
  if (selected.empty()) {
    return Status(ErrorCode::kInvalidArgument, "no tensor of the delta matches '" + tensor_regex + "'");
  }
  // The output is sized by what backs it: delta tensors by the base (the manifest bounds
  // the others by their stored bytes).
  for (const TensorEntry* t : selected) {
    const uint8_t* data = nullptr;
    if (t->kind == TensorKind::kDelta) s = FindBaseTensor(base, *t, &data);
    if (!s.ok()) return s;
  }
  std::map<std::string, std::string> metadata;
  if (row_begin != 0 || row_end != UINT64_MAX) {
    metadata["arc_v3_rows"] = std::to_string(row_begin) + ":" +
                              (row_end == UINT64_MAX ? std::string() : std::to_string(row_end));
  }
  const std::vector<uint8_t> header = safetensors::BuildHeader(&infos, metadata);
  uint64_t total = 0;
  for (const auto& info : infos) total += info.size();
  if (options.progress_total != nullptr) *options.progress_total = total;
  AsideFiles out(options.overwrite);
  size_t index = 0;
  s = out.Create(fs::absolute(out_path).string(), header.size() + total, &index);
  if (!s.ok()) return s;
  s = WriteAll(out.fd(index), header.data(), header.size(), 0, out.temp(index));
  if (!s.ok()) return s;
  std::vector<uint8_t> buffer;
  GroupCache cache;
  for (size_t i = 0; i < selected.size(); ++i) {
    buffer.resize(infos[i].size());
    s = ApplyRowsCached(base, reader, *selected[i], ranges[i].first, ranges[i].second,
                        buffer.data(), options.threads, &cache);
    if (!s.ok()) return s;
    s = WriteAll(out.fd(index), buffer.data(), buffer.size(), header.size() + infos[i].begin,
                 out.temp(index));
    if (!s.ok()) return s;
    if (options.progress_done != nullptr) *options.progress_done += buffer.size();
  }
  s = out.SyncAndClose(options.sync);
  if (s.ok()) s = out.Commit(options.sync);
  if (!s.ok()) return s;
  if (report != nullptr) {
    report->files = 1;
    report->tensors = selected.size();
    report->target_bytes = header.size() + total;
    report->delta_bytes = reader.source().size();
    report->written = {out_path};
  }
  return Status::Ok();
}

}  // namespace container
}  // namespace arc_v3
