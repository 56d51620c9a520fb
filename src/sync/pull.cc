// Pulling a step into a region's directory (see sync.h): plan the cheapest verified
// route, fetch what it needs, rebuild the files in a stage beside DIR, then commit them
// all at once through a journal.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "src/common/parallel.h"
#include "src/checkpoint/safetensors.h"
#include "src/sync/dir_state.h"
#include "src/sync/route.h"
#include "src/sync/sync.h"

namespace arc_v3 {
namespace sync {
namespace {

// What a partial pull fetches ahead, in all: the rest of its pieces are read as they are
// decoded, so that its memory does not grow with the checkpoint.
constexpr uint64_t kPrefetchBudget = uint64_t{64} << 20;

namespace fs = std::filesystem;
using container::FileEntry;
using container::Group;
using container::Piece;
using container::Reader;
using container::TensorEntry;
using container::TensorKind;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Sidecar metadata: per tensor, the rows [begin, end) it holds.
constexpr char kRowsKey[] = "arc_v3_rows";

// The rows a partial pull's sidecar file holds, by tensor name: its metadata.
struct Held {
  const safetensors::File* file = nullptr;
  std::map<std::string, std::pair<uint64_t, uint64_t>> rows;

  Status Load(const safetensors::File* f) {
    file = f;
    const auto it = f->metadata().find(kRowsKey);
    if (it == f->metadata().end()) return Status(ErrorCode::kCorruptHeader, f->path() + " lacks its row ranges");
    try {
      const nlohmann::json j = nlohmann::json::parse(it->second);
      for (auto e = j.begin(); e != j.end(); ++e) rows[e.key()] = {e.value().at(0).get<uint64_t>(), e.value().at(1).get<uint64_t>()};
    } catch (const std::exception&) {
      return Status(ErrorCode::kCorruptHeader, f->path() + ": unreadable row ranges");
    }
    return Status::Ok();
  }
  // Base rows [begin, end) of `t`, or nullptr if not held.
  const uint8_t* Rows(const TensorEntry& t, uint64_t begin, uint64_t end) const {
    if (file == nullptr) return nullptr;
    const auto r = rows.find(t.name);
    const safetensors::TensorInfo* info = file->Find(t.name);
    if (r == rows.end() || info == nullptr || info->dtype != t.dtype) return nullptr;
    if (begin < r->second.first || end > r->second.second) return nullptr;
    if (info->size() != (r->second.second - r->second.first) * t.row_bytes()) return nullptr;
    return file->data(*info) + (begin - r->second.first) * t.row_bytes();
  }
};

Status WriteAt(int fd, const uint8_t* data, uint64_t size, uint64_t offset, const std::string& path) {
  while (size > 0) {
    const ssize_t n = pwrite(fd, data, std::min<uint64_t>(size, 1u << 30), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status(ErrorCode::kInvalidArgument, path + ": cannot write: " + std::strerror(errno));
    data += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

// A new file of known size, written at offsets and synced on Close.
class OutFile {
 public:
  ~OutFile() {
    if (fd_ >= 0) close(fd_);
  }
  Status Create(const std::string& path, const std::vector<uint8_t>& header, uint64_t size) {
    path_ = path;
    fd_ = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    if (fd_ < 0) return Status(ErrorCode::kInvalidArgument, path + ": cannot create: " + std::strerror(errno));
    if (ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      return Status(ErrorCode::kInvalidArgument, path + ": cannot resize: " + std::strerror(errno));
    }
    return Write(header.data(), header.size(), 0);
  }
  Status Write(const uint8_t* data, uint64_t size, uint64_t offset) { return WriteAt(fd_, data, size, offset, path_); }
  Status Close(bool sync) {
    const int fd = fd_;
    fd_ = -1;
    if (sync && fsync(fd) != 0) {
      close(fd);
      return Status(ErrorCode::kInvalidArgument, path_ + ": cannot sync");
    }
    return close(fd) == 0 ? Status::Ok() : Status(ErrorCode::kInvalidArgument, path_ + ": cannot close");
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// One hop of a partial pull for one shard: decodes the rows Needed() of every tensor of
// the container onto the base rows `held` (the previous hop's sidecar; none for an
// anchor) into a new sidecar file at `out`.
Status ApplyRowsHop(const Fetched& fetched, const Held& held, const Select& select, bool keep_small,
                    const std::string& out_path, bool sync, int threads, PullReport* report) {
  const Reader& reader = fetched.reader;
  const FileEntry& f = fetched.file();
  std::vector<const TensorEntry*> tensors;
  std::vector<Need> needs;
  std::vector<safetensors::TensorInfo> infos;
  nlohmann::json rows = nlohmann::json::object();
  for (const TensorEntry& t : f.tensors) {
    const Need need = Needed(t, select, keep_small);
    if (need.empty()) continue;
    safetensors::TensorInfo info;
    info.name = t.name;
    info.dtype = t.dtype;
    info.shape = t.shape;
    if (!info.shape.empty()) info.shape[0] = need.end - need.begin;
    info.end = (need.end - need.begin) * t.row_bytes();
    // Outputs are sized by what backs them: a delta tensor's rows by the held base (the
    // manifest bounds the others by their stored bytes).
    if (t.kind == TensorKind::kDelta && held.Rows(t, need.begin, need.end) == nullptr) {
      return Status(ErrorCode::kChecksumMismatch, "wrong base: tensor '" + t.name + "' rows " +
                                                      std::to_string(need.begin) + ":" + std::to_string(need.end) +
                                                      " are not held");
    }
    tensors.push_back(&t);
    needs.push_back(need);
    infos.push_back(info);
    rows[t.name] = {need.begin, need.end};
  }
  const std::vector<uint8_t> header = safetensors::BuildHeader(&infos, {{kRowsKey, rows.dump()}});
  uint64_t total = header.size();
  for (const auto& info : infos) total += info.size();
  OutFile out;
  Status s = out.Create(out_path, header, total);
  if (!s.ok()) return s;

  // Tasks: a piece of an ungrouped tensor, or a group (all its members are kept).
  struct Task {
    size_t tensor = 0;
    const Piece* piece = nullptr;
    const Group* group = nullptr;
  };
  std::vector<Task> tasks;
  std::map<uint64_t, size_t> index;  // tensor position in `tensors`, by manifest index
  for (size_t i = 0; i < tensors.size(); ++i) index[static_cast<uint64_t>(tensors[i] - f.tensors.data())] = i;
  std::set<uint64_t> groups;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorEntry& t = *tensors[i];
    if (t.grouped()) {
      if (groups.insert(t.group).second) tasks.push_back({i, nullptr, &f.groups[t.group]});
      continue;
    }
    for (const Piece& p : t.pieces) {
      if (p.row_end > needs[i].begin && p.row_begin < needs[i].end) tasks.push_back({i, &p, nullptr});
    }
  }
  const auto wrong_base = [](const TensorEntry& t, const std::string& what) {
    return Status(ErrorCode::kChecksumMismatch, "wrong base: tensor '" + t.name + "' " + what);
  };
  std::mutex mutex;
  Status first;
  std::atomic<int64_t> decode_ns{0}, write_ns{0};
  const Status thrown = TryParallelFor(tasks.size(), WorkerCount(threads, tasks.size()), [&](size_t ti, size_t) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!first.ok()) return;
    }
    const Task& task = tasks[ti];
    std::vector<uint8_t> scratch, decoded;
    const uint8_t* stored = nullptr;
    Status st;
    const auto start = Clock::now();
    Clock::time_point mid;
    if (task.group != nullptr) {
      std::vector<const uint8_t*> bases;
      std::vector<uint64_t> bytes;
      for (size_t member : task.group->members) {
        const TensorEntry& m = f.tensors[member];
        const uint8_t* base = held.Rows(m, 0, m.rows());
        if (base == nullptr) st = wrong_base(m, "is not held in full (a group needs every member)");
        else if (container::Hash(base, m.bytes()) != m.base_xxh3) st = wrong_base(m, "differs from the delta's base");
        bases.push_back(base);
        bytes.push_back(m.bytes());
      }
      std::vector<uint16_t> out16;
      if (st.ok()) st = reader.ReadGroup(*task.group, &scratch, &stored);
      if (st.ok()) st = container::DecodeGroup(*task.group, stored, bases, bytes, &out16);
      mid = Clock::now();
      const uint8_t* at = reinterpret_cast<const uint8_t*>(out16.data());
      for (size_t member : task.group->members) {
        const TensorEntry& m = f.tensors[member];
        const auto it = index.find(member);
        if (st.ok() && it != index.end()) {
          st = out.Write(at, m.bytes(), header.size() + infos[it->second].begin);
        }
        at += m.bytes();
      }
    } else {
      const TensorEntry& t = *tensors[task.tensor];
      const Piece& p = *task.piece;
      const uint64_t bytes = (p.row_end - p.row_begin) * t.row_bytes();
      const uint8_t* base = nullptr;
      if (t.kind == TensorKind::kDelta) {
        base = held.Rows(t, p.row_begin, p.row_end);
        if (base == nullptr) st = wrong_base(t, "rows " + std::to_string(p.row_begin) + ":" + std::to_string(p.row_end) + " are not held");
      }
      if (st.ok()) st = reader.ReadPiece(p, &scratch, &stored);
      if (st.ok()) {
        decoded.resize(bytes);
        st = container::DecodePiece(p, stored, base, bytes, safetensors::DTypeSize(t.dtype), decoded.data());
        if (!st.ok() && base != nullptr && container::Hash(base, bytes) != p.base_xxh3) {
          st = wrong_base(t, "rows " + std::to_string(p.row_begin) + ":" + std::to_string(p.row_end) + " differ from the delta's base");
        } else if (!st.ok()) {
          st = Status(st.code(), "tensor '" + t.name + "': " + st.message());
        }
      }
      mid = Clock::now();
      if (st.ok()) {
        st = out.Write(decoded.data(), bytes,
                       header.size() + infos[task.tensor].begin + (p.row_begin - needs[task.tensor].begin) * t.row_bytes());
      }
    }
    decode_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(mid - start).count();
    write_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - mid).count();
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mutex);
      if (first.ok()) first = st;
    }
  });
  if (!thrown.ok()) return thrown;
  if (!first.ok()) return first;
  report->decode_seconds += decode_ns * 1e-9;
  report->write_seconds += write_ns * 1e-9;
  return out.Close(sync);
}

// The user's view of a partial pull: the selected tensors, cut to the selected rows, from
// the last hop's sidecar.
Status ExportSelection(const safetensors::File& rows_file, const Held& held, const FileEntry& file,
                       const Select& select, const std::string& out_path) {
  const Selection& sel = select.sel;
  std::vector<safetensors::TensorInfo> infos;
  std::vector<const uint8_t*> sources;
  for (const TensorEntry& t : file.tensors) {
    if (!std::regex_match(t.name, select.pattern)) continue;
    const uint64_t rows = t.rows();
    const uint64_t a = t.shape.empty() ? 0 : std::min(sel.row_begin, rows);
    const uint64_t b = t.shape.empty() ? 1 : std::min(sel.row_end, rows);
    safetensors::TensorInfo info;
    info.name = t.name;
    info.dtype = t.dtype;
    info.shape = t.shape;
    if (!info.shape.empty()) info.shape[0] = b - a;
    info.end = (b - a) * t.row_bytes();
    const uint8_t* data = info.end == 0 ? nullptr : held.Rows(t, a, b);
    if (info.end != 0 && data == nullptr) {
      return Status(ErrorCode::kInternal, rows_file.path() + " lacks rows of tensor '" + t.name + "'");
    }
    infos.push_back(info);
    sources.push_back(data);
  }
  std::map<std::string, std::string> metadata;
  metadata[kRowsKey] = std::to_string(sel.row_begin) + ":" +
                       (sel.row_end == UINT64_MAX ? std::string() : std::to_string(sel.row_end));
  const std::vector<uint8_t> header = safetensors::BuildHeader(&infos, metadata);
  uint64_t total = header.size();
  for (const auto& info : infos) total += info.size();
  OutFile out;
  Status s = out.Create(out_path, header, total);
  for (size_t i = 0; i < infos.size() && s.ok(); ++i) {
    s = out.Write(sources[i], infos[i].size(), header.size() + infos[i].begin);
  }
  if (!s.ok()) return s;
  return out.Close(true);
}

Status VerifyObject(const Fetched& f, Store* store, const Trust& trust) {
  std::unique_ptr<container::MappedFile> file;
  Status s = container::MappedFile::Open(f.path, &file);
  if (!s.ok()) return s;
  const std::string name = store->url() + "/" + f.ref.key;
  // Trusting, the SHA-256 decides before the XXH3 (whose mismatch another route may avoid).
  if (trust.on() && (f.ref.sha256.empty() || DigestHex(Sha256(file->data(), file->size())) != f.ref.sha256)) {
    return Status(ErrorCode::kUntrusted, name + (f.ref.sha256.empty() ? ": its record names no SHA-256"
                                                                       : " differs from its record's SHA-256"));
  }
  if (file->size() != f.ref.size || container::Hash(file->data(), file->size()) != f.ref.xxh3) {
    return Status(ErrorCode::kCorruptChunk, name + " does not match its record (corrupt or truncated)");
  }
  Reader reader;
  s = Reader::Open(std::move(file), &reader);
  if (s.ok()) s = CheckLayout(reader, name);
  return s.ok() ? s : Status(s.code(), name + ": " + s.message());
}

Status FetchWhole(Store* store, const PullOptions& o, const Trust& trust, std::vector<Fetched>* fetched,
                  PullReport* report) {
  std::mutex mutex;
  Status first;
  const auto start = Clock::now();
  const Status thrown = TryParallelFor(fetched->size(), WorkerCount(std::max(1, o.store.connections), fetched->size()), [&](size_t i, size_t) {
    Fetched& f = (*fetched)[i];
    Status s = store->GetToFile(f.ref.key, f.path, f.ref.size, o.store);
    std::lock_guard<std::mutex> lock(mutex);
    report->requests += std::max<uint64_t>(1, (f.ref.size + o.store.part_bytes - 1) / o.store.part_bytes);
    if (s.ok()) report->fetched_bytes += f.ref.size;
    if (!s.ok() && first.ok()) first = s;
  });
  if (!thrown.ok()) return thrown;
  report->fetch_seconds += Since(start);
  if (!first.ok()) return first;
  const auto verify = Clock::now();
  const Status verify_thrown = TryParallelFor(fetched->size(), WorkerCount(o.run.threads, fetched->size()), [&](size_t i, size_t) {
    Status s = VerifyObject((*fetched)[i], store, trust);
    std::lock_guard<std::mutex> lock(mutex);
    if (!s.ok() && first.ok()) first = s;
  });
  if (!verify_thrown.ok()) return verify_thrown;
  report->verify_seconds += Since(verify);
  report->fetched_objects += fetched->size();
  return first;
}

// Removes the stage directory (and whatever a killed pull left in it) when done.
class Stage {
 public:
  ~Stage() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  Status Create(const std::string& dir) {
    path_ = (fs::path(dir) / kStateDir / "stage").string();
    std::error_code ec;
    fs::remove_all(path_, ec);
    fs::create_directories(fs::path(path_) / "objects", ec);
    if (!ec) fs::create_directories(fs::path(path_) / "rows", ec);
    if (!ec) fs::create_directories(fs::path(dir) / kStateDir / "rows", ec);
    if (ec) return Status(ErrorCode::kInvalidArgument, path_ + ": cannot create: " + ec.message());
    return Status::Ok();
  }
  std::string Path(const std::string& name) const { return (fs::path(path_) / name).string(); }
  // From now on the commit journal owns the stage (recovery renames out of it): the stage
  // is left for RunJournal to remove.
  void HandOver() { path_.clear(); }
  // Relative to DIR, for the journal.
  static std::string Relative(const std::string& name) { return std::string(kStateDir) + "/stage/" + name; }

 private:
  std::string path_;
};

// Checks DIR's files against its state (cheaply, by size and time; by contents where
// those changed). Refreshes the recorded times of files whose contents still match.
Status CheckDirectory(const std::string& dir, DirState* state) {
  bool retimed_any = false;
  for (ShardState& shard : state->shards) {
    for (FileRecord* f : {&shard.file, &shard.rows}) {
      if (f->path.empty()) continue;
      bool retimed = false;
      Status s = CheckFile(dir, f, &retimed);
      if (!s.ok()) {
        return Status(s.code(), s.message() + " (it records step " + std::to_string(state->step) +
                                    "; pull --reset rebuilds it from an anchor)");
      }
      retimed_any = retimed_any || retimed;
    }
  }
  return retimed_any ? WriteState(dir, *state) : Status::Ok();
}

// Checks the step manifest's result checksums against the last hop's containers (the
// pieces' checksums, which apply verified) and, for tensors a group checks together,
// against the rebuilt files themselves.
Status VerifyResults(const Hop& hop, const std::vector<Fetched>& fetched, const std::vector<size_t>& objects,
                     const std::vector<std::string>& files) {
  for (size_t k = 0; k < hop.m.count; ++k) {
    const ShardRecord& r = hop.m.shards[k];
    const std::string path = files[k];
    std::unique_ptr<container::MappedFile> object;
    container::Reader reader;
    Status s = container::MappedFile::Open(fetched[objects[k]].path, &object);
    if (s.ok()) s = Reader::Open(std::move(object), &reader);
    if (!s.ok()) return s;
    const std::vector<TensorEntry>& tensors = reader.manifest().files[0].tensors;
    const auto differs = [&](const std::string& what) {
      return Status(ErrorCode::kCorruptHeader, "step " + std::to_string(hop.m.step) + " shard " +
                                                   std::to_string(k) + ": the record's " + what);
    };
    if (tensors.size() != r.tensors.size()) return differs("tensor list differs from the delta's");
    safetensors::File file;
    bool opened = false;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorEntry& t = tensors[i];
      if (t.name != r.tensors[i].name) return differs("tensor list differs from the delta's");
      uint64_t sum = t.target_xxh3;
      if (t.grouped()) {
        if (!opened) {
          s = safetensors::File::Open(path, &file);
          if (!s.ok()) return s;
          opened = true;
        }
        const safetensors::TensorInfo* info = file.Find(t.name);
        if (info == nullptr) return differs("tensor '" + t.name + "' is missing from the result");
        sum = container::TensorChecksum(t, file.data(*info));
      }
      if (sum != r.tensors[i].xxh3) return differs("checksum of tensor '" + t.name + "' is not its result's");
    }
  }
  return Status::Ok();
}

// Builds every shard's file (full) or sidecar (partial) hop by hop in the stage; `current`
// starts as DIR's own files (a route from DIR) or empty, and ends as the last hop's.
Status ApplyRoute(const Route& route, const Select& select, const std::vector<Fetched>& fetched,
                  const std::vector<std::vector<size_t>>& object_of, const Stage& stage, const PullOptions& o,
                  std::vector<std::string>* current, PullReport* report) {
  const bool partial = select.sel.partial();
  container::RunOptions run = o.run;
  for (size_t h = 0; h < route.hops.size(); ++h) {
    const Hop& hop = route.hops[h];
    const bool last = h + 1 == route.hops.size();
    for (size_t k = 0; k < hop.m.count; ++k) {
      const bool anchor = hop.anchor[k];
      const std::string name = hop.m.shards[k].file;
      const std::string out = partial ? stage.Path("rows/" + std::to_string(h) + "-" + name) : stage.Path(name);
      Status s;
      if (partial) {
        safetensors::File base_file;
        Held held;
        if (!anchor) {
          s = safetensors::File::Open((*current)[k], &base_file);
          if (s.ok()) s = held.Load(&base_file);
        }
        if (s.ok()) {
          s = ApplyRowsHop(fetched[object_of[h][k]], held, select, select.keep_small[k], out,
                           last && o.run.sync, run.threads, report);
        }
      } else {
        run.sync = last && o.run.sync;
        container::RunReport applied;
        s = container::Apply(anchor ? "" : (*current)[k], fetched[object_of[h][k]].path, out, run, &applied);
        report->decode_seconds += applied.decode_seconds;
        report->write_seconds += applied.write_seconds + applied.sync_seconds;
      }
      if (!s.ok()) {
        return Status(s.code(), "step " + std::to_string(hop.m.step) + ", shard " + std::to_string(k) + " (" + name +
                                    "): " + s.message());
      }
      std::error_code ec;
      const std::string& previous = (*current)[k];
      if (!previous.empty() && previous != out && previous.rfind(stage.Path(""), 0) == 0) fs::remove(previous, ec);
      (*current)[k] = out;
    }
    report->steps.push_back(hop.m.step);
  }
  return Status::Ok();
}

// The commit of a pull: the staged files' moves into DIR, the files to remove, the state.
Status BuildJournal(Store* store, const std::string& dir, const DirState* old, const Route& route,
                    const Select& select, const std::vector<Fetched>& fetched,
                    const std::vector<std::vector<size_t>>& object_of, const Stage& stage,
                    const std::vector<std::string>& current, Journal* journal, PullReport* report) {
  const Hop& final_hop = route.hops.back();
  const bool partial = select.sel.partial();
  journal->state.store = store->url();
  journal->state.step = final_hop.m.step;
  journal->state.manifest_xxh3 = final_hop.manifest_xxh3;
  journal->state.run = final_hop.m.run;
  journal->state.selection = select.sel;
  std::set<std::string> names;
  for (size_t k = 0; k < final_hop.m.count; ++k) {
    const ShardRecord& r = final_hop.m.shards[k];
    ShardState shard;
    shard.name = r.file;
    names.insert(r.file);
    Status s;
    if (partial) {
      // The user's file: the selected rows, from the last sidecar.
      safetensors::File rows_file;
      Held held;
      s = safetensors::File::Open(current[k], &rows_file);
      if (s.ok()) s = held.Load(&rows_file);
      if (s.ok()) s = ExportSelection(rows_file, held, fetched[object_of.back()[k]].file(), select, stage.Path(r.file));
      const std::string staged_rows = "rows/" + fs::path(current[k]).filename().string();
      if (s.ok()) s = RecordFile(dir, Stage::Relative(staged_rows), &shard.rows);
      if (s.ok()) s = RecordFile(dir, Stage::Relative(r.file), &shard.file);
      shard.rows.path = std::string(kStateDir) + "/rows/" + r.file;
      journal->moves.emplace_back(Stage::Relative(staged_rows), shard.rows.path);
    } else {
      shard.file.tensors = r.tensors;
      struct stat st;
      const std::string staged = stage.Path(r.file);
      if (::stat(staged.c_str(), &st) != 0) return Status(ErrorCode::kInternal, staged + " is missing");
      if (static_cast<uint64_t>(st.st_size) != r.file_size) {
        return Status(ErrorCode::kCorruptHeader, "step " + std::to_string(final_hop.m.step) + " shard " +
                                                     std::to_string(k) + ": the record's file size is not the result's");
      }
      shard.file.size = static_cast<uint64_t>(st.st_size);
      shard.file.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    }
    if (!s.ok()) return s;
    shard.file.path = r.file;
    report->checkpoint_bytes += shard.file.size;
    journal->moves.emplace_back(Stage::Relative(r.file), r.file);
    journal->state.shards.push_back(std::move(shard));
  }
  // A full pull carries the step's model.safetensors.index.json (a partial one holds only
  // some tensors: an index of them all would mislead a loader).
  const ObjectRef* index = partial ? nullptr : final_hop.m.index();
  if (index != nullptr) {
    std::vector<uint8_t> bytes;
    Status s = store->Get(index->key, kMaxDocumentBytes, &bytes, nullptr);
    if (s.ok() && (bytes.size() != index->size || container::Hash(bytes.data(), bytes.size()) != index->xxh3)) {
      s = Status(ErrorCode::kCorruptHeader, store->url() + "/" + index->key + ": not the index the step names");
    }
    ++report->requests;
    ++report->fetched_objects;
    report->fetched_bytes += bytes.size();
    OutFile out;
    if (s.ok()) s = out.Create(stage.Path(kIndexFileName), bytes, bytes.size());
    if (s.ok()) s = out.Close(true);
    if (!s.ok()) return s;
    journal->moves.emplace_back(Stage::Relative(kIndexFileName), kIndexFileName);
    journal->state.index = true;
  }
  if (old != nullptr) {
    for (const ShardState& o : old->shards) {
      const bool gone = names.count(o.name) == 0;
      if (gone) journal->removes.push_back(o.name);
      if (!o.rows.path.empty() && (gone || !partial)) journal->removes.push_back(o.rows.path);
    }
    if (old->index && index == nullptr) journal->removes.push_back(kIndexFileName);
  }
  return Status::Ok();
}

// Which route a retry must not take: DIR's chain (its objects vanished or are damaged, or
// DIR's rows do not suffice) or the anchor's (its objects are damaged).
enum class Avoid { kNone, kDir, kAnchor };
Status PullLocked(Store* store, const std::string& dir, const PullOptions& o, Avoid avoid, PullReport* report);

// The layouts a partial pull read stay in DIR/.arc_v3/layouts/XXH3.json for the next pull
// (a run's layout rarely changes, so a host pays for them once): a file is used only if its
// bytes hash to its name. Best effort: a cache that cannot be read or written is skipped.
void LoadLayoutCache(const std::string& dir, LayoutCache* layouts) {
  std::error_code ec;
  std::vector<fs::path> damaged;
  for (auto it = fs::directory_iterator(fs::path(dir) / kStateDir / "layouts", ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() != 21 || name.compare(16, 5, ".json") != 0) continue;
    std::ifstream in(it->path(), std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const uint64_t xxh3 = container::Hash(bytes.data(), bytes.size());
    Layout layout;
    if (container::HexU64(xxh3) == name.substr(0, 16) && ParseLayout(bytes, it->path().string(), &layout).ok()) {
      (*layouts)[xxh3] = std::move(layout);
    } else {
      damaged.push_back(it->path());  // fetched again, and rewritten
    }
  }
  for (const fs::path& path : damaged) fs::remove(path, ec);
}

void SaveLayoutCache(const std::string& dir, const LayoutCache& layouts, const StepManifest& step) {
  std::error_code ec;
  const fs::path folder = fs::path(dir) / kStateDir / "layouts";
  fs::create_directories(folder, ec);
  std::set<std::string> keep;
  for (const StepManifest::Group& g : step.groups) {
    const auto it = layouts.find(g.layout_xxh3);
    if (it == layouts.end()) continue;
    const std::string name = container::HexU64(g.layout_xxh3) + ".json";
    keep.insert(name);
    if (fs::exists(folder / name, ec)) continue;
    const std::string json = LayoutJson(it->second);
    if (container::Hash(json.data(), json.size()) != g.layout_xxh3) continue;
    const fs::path tmp = folder / ("." + name + ".tmp");
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(json.data(), static_cast<std::streamsize>(json.size()));
    }
    fs::rename(tmp, folder / name, ec);
  }
  for (auto it = fs::directory_iterator(folder, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (keep.count(it->path().filename().string()) == 0) fs::remove(it->path(), ec);
  }
}

// Pulls again by an anchor route; the report counts that pull alone.
Status Retry(Store* store, const std::string& dir, const PullOptions& o, PullReport* report) {
  *report = PullReport();
  return PullLocked(store, dir, o, Avoid::kDir, report);
}

// A route met a damaged object or document: the pull takes the other route, if there is
// one, and says so; else it fails with what it met.
Status Reroute(Store* store, const std::string& dir, const PullOptions& o, const Route& route, const Status& met,
               PullReport* report) {
  PullReport other;
  const Status s = PullLocked(store, dir, o, route.from_dir ? Avoid::kDir : Avoid::kAnchor, &other);
  if (!s.ok()) return NoOtherRoute(met, route.name, s);
  *report = std::move(other);
  report->rerouted = ReroutedNote(met, report->route, route.name);
  return s;
}

// `avoid`: kDir routes from an anchor even where DIR's step is on the chain (a retry after
// the chain's objects vanished, pruned, while this pull planned, were damaged, or after
// DIR's rows did not suffice for a partial pull's new selection of groups); kAnchor takes
// DIR's chain even where the anchor costs less (its objects were damaged).
Status PullLocked(Store* store, const std::string& dir, const PullOptions& o, Avoid avoid, PullReport* report) {
  const bool avoid_dir = avoid != Avoid::kNone;  // a retry does not retry again
  const auto start = Clock::now();
  Select select;
  select.sel.tensors = o.tensors;
  select.sel.row_begin = o.row_begin;
  select.sel.row_end = o.row_end;
  if (!select.sel.partial() && (o.row_begin != 0 || o.row_end != UINT64_MAX)) select.sel.tensors = ".*";
  const bool partial = select.sel.partial();
  try {
    select.pattern = std::regex(partial ? select.sel.tensors : ".*", std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return Status(ErrorCode::kInvalidArgument, "bad --tensors regex '" + select.sel.tensors + "': " + e.what());
  }
  if (o.row_begin > o.row_end) return Status(ErrorCode::kInvalidArgument, "--rows A:B needs A <= B");

  // A commit a crash interrupted is finished first (a reset drops one it cannot finish).
  Status s = RecoverJournal(dir);
  if (!s.ok() && o.reset) s = DropJournal(dir);
  if (!s.ok()) return Status(s.code(), s.message() + " (pull --reset rebuilds the directory from an anchor)");
  DirState state;
  bool have_state = false;
  s = ReadState(dir, &state);
  if (s.ok()) {
    have_state = true;
    report->from_step = state.step;
  } else if (s.code() != ErrorCode::kNotFound && !o.reset) {
    return Status(s.code(), s.message() + " (pull --reset rebuilds it from an anchor)");
  }

  Trust trust;
  s = LoadTrust(o.trust, &trust);
  if (!s.ok()) return s;
  Hop target;
  s = ReadTarget(store, o.step, &target, report, trust);
  if (!s.ok()) return s;
  const uint64_t step = target.m.step;
  if (have_state && !o.reset) {
    // A signed step is still refused where it would take DIR back, or to another run.
    s = CheckProgress(trust, state.step, state.run, target.m, dir, " (--reset takes it)");
    if (!s.ok()) return s;
  }

  // DIR's own files must be what it records before anything is applied onto them.
  if (have_state && !o.reset) {
    const auto verify = Clock::now();
    s = CheckDirectory(dir, &state);
    report->verify_seconds += Since(verify);
    if (!s.ok()) return s;
    if (state.step == step && state.manifest_xxh3 == target.manifest_xxh3 && state.selection == select.sel) {
      report->up_to_date = true;
      report->route = "up to date";
      for (const ShardState& sh : state.shards) report->checkpoint_bytes += sh.file.size;
      report->total_seconds = Since(start);
      return Status::Ok();
    }
  }
  Route route;
  const bool usable = have_state && !o.reset && state.selection == select.sel && avoid != Avoid::kDir;
  RouteFrom from{state.step, state.manifest_xxh3, static_cast<uint32_t>(state.shards.size())};
  from.only_chain = avoid == Avoid::kAnchor;
  if (from.only_chain && !usable) return Status(ErrorCode::kNotFound, "the directory holds no step on the chain");
  s = PlanRoute(store, usable ? &from : nullptr, std::move(target), &route, report, trust);
  LayoutCache layouts;
  if (partial) LoadLayoutCache(dir, &layouts);
  if (s.ok()) s = LoadRoute(store, partial ? &select : nullptr, &layouts, &route, report, trust);
  if (s.code() == ErrorCode::kNotFound && route.from_dir && !avoid_dir) return Retry(store, dir, o, report);
  if (Damaged(s.code()) && !avoid_dir && !route.hops.empty()) return Reroute(store, dir, o, route, s, report);
  if (!s.ok()) return s;
  report->route = route.name;
  if (o.hook) {
    s = o.hook("planned");
    if (!s.ok()) return s;
  }

  Stage stage;
  s = stage.Create(dir);
  if (!s.ok()) return s;
  std::vector<Fetched> fetched;
  std::vector<std::vector<size_t>> object_of(route.hops.size());  // [hop][shard] -> index in `fetched`
  for (size_t h = 0; h < route.hops.size(); ++h) {
    for (size_t k = 0; k < route.hops[h].m.count; ++k) {
      object_of[h].push_back(fetched.size());
      fetched.emplace_back();
      fetched.back().hop = h;
      fetched.back().shard = k;
      fetched.back().ref = RefOf(route.hops[h], k);
      fetched.back().path = stage.Path("objects/" + std::to_string(fetched.size() - 1) + ".a3d");
    }
  }
  if (partial) {
    // A shard none of whose records on the route names a selected tensor needs no byte of
    // its objects (nor do its small tensors: a group is kept whole only for a selected
    // member): a pull of a few shards' tensors reads only those shards' records and objects.
    for (Fetched& f : fetched) f.skipped = !route.touched[f.shard];
  }
  s = partial ? FetchPieces(store, o.store, UINT64_MAX, &select, &fetched, report, kPrefetchBudget, trust)
              : FetchWhole(store, o, trust, &fetched, report);
  if (s.code() == ErrorCode::kNotFound && route.from_dir && !avoid_dir) return Retry(store, dir, o, report);
  if (Damaged(s.code()) && !avoid_dir) return Reroute(store, dir, o, route, s, report);
  if (!s.ok()) return s;
  if (o.hook) {
    s = o.hook("fetched");
    if (!s.ok()) return s;
  }

  std::vector<std::string> current(route.hops.back().m.count);
  if (route.from_dir) {
    for (size_t k = 0; k < current.size(); ++k) {
      current[k] = (fs::path(dir) / (partial ? state.shards[k].rows.path : state.shards[k].name)).string();
    }
  }
  s = ApplyRoute(route, select, fetched, object_of, stage, o, &current, report);
  if (!s.ok() && partial && route.from_dir && !avoid_dir && s.code() == ErrorCode::kChecksumMismatch) {
    return Retry(store, dir, o, report);  // DIR's rows lack what this selection now needs
  }
  if (Damaged(s.code()) && !avoid_dir) return Reroute(store, dir, o, route, s, report);
  if (!s.ok()) return s;
  if (!partial) {
    const auto verify = Clock::now();
    s = VerifyResults(route.hops.back(), fetched, object_of.back(), current);
    report->verify_seconds += Since(verify);
    if (Damaged(s.code()) && !avoid_dir) return Reroute(store, dir, o, route, s, report);
    if (!s.ok()) return s;
  }

  Journal journal;
  s = BuildJournal(store, dir, have_state ? &state : nullptr, route, select, fetched, object_of, stage, current,
                   &journal, report);
  if (!s.ok()) return s;
  if (o.hook) {
    s = o.hook("commit");
    if (!s.ok()) return s;
  }
  const auto commit = Clock::now();
  stage.HandOver();
  s = Commit(dir, journal, o.after_move);
  if (!s.ok()) return s;
  if (partial) SaveLayoutCache(dir, layouts, route.hops.back().m);
  report->commit_seconds = Since(commit);
  report->total_seconds = Since(start);
  return Status::Ok();
}

}  // namespace


Status Pull(Store* store, const std::string& dir, const PullOptions& options, PullReport* report) {
  *report = PullReport();
  std::error_code ec;
  const bool existed = fs::exists(dir, ec);
  const bool had_state_dir = fs::exists(fs::path(dir) / kStateDir, ec);
  if (existed && !fs::is_directory(dir, ec)) {
    return Status(ErrorCode::kInvalidArgument, dir + " is not a directory");
  }
  // A directory of other files is not a region's: pulling would replace files of the same
  // names. It is taken only when asked to.
  if (existed && !had_state_dir && !options.force && !options.reset &&
      fs::directory_iterator(dir, ec) != fs::directory_iterator()) {
    return Status(ErrorCode::kAlreadyExists,
                  dir + " holds files but was never pulled into (not replaced without --force)");
  }
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) return Status(ErrorCode::kInvalidArgument, dir + ": cannot create the directory");
  DirLock lock;
  Status s = lock.Acquire(dir);
  if (!s.ok()) return s;  // another pull's: never clean up under it
  s = PullLocked(store, dir, options, Avoid::kNone, report);
  // A first pull that failed leaves nothing behind: not the directory it made, nor the
  // lock and stage it made inside one that existed (removed while the lock is held).
  const fs::path state_dir = fs::path(dir) / kStateDir;
  if (!s.ok() && !had_state_dir && !fs::exists(state_dir / "state.json", ec) &&
      !fs::exists(state_dir / "commit.json", ec)) {
    fs::remove_all(existed ? state_dir : fs::path(dir), ec);
  }
  return s;
}

Status DirectoryStep(const std::string& dir, uint64_t* step) {
  DirState state;
  Status s = ReadState(dir, &state);
  if (s.ok()) *step = state.step;
  return s;
}

}  // namespace sync
}  // namespace arc_v3
