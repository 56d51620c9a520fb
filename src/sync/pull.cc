// Pulling a step into a region's directory (see sync.h): plan the cheapest verified
// route, fetch what it needs, rebuild the files in a stage beside DIR, then commit them
// all at once through a journal.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "src/common/clock.h"
#include "src/common/file_io.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"
#include "src/checkpoint/safetensors.h"
#include "src/checkpoint/strict_json.h"
#include "src/sync/apply_hop.h"
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
using checkpoint::FileEntry;
using checkpoint::Group;
using checkpoint::Piece;
using checkpoint::Reader;
using checkpoint::TensorEntry;
using checkpoint::TensorKind;
using Clock = std::chrono::steady_clock;


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
      const nlohmann::json j = strict_json::Parse(it->second, f->path());
      for (auto e = j.begin(); e != j.end(); ++e) rows[e.key()] = {e.value().at(0).get<uint64_t>(), e.value().at(1).get<uint64_t>()};
    } catch (...) {
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

// A new file of known size, written at offsets or through a mapping, synced on Close.
class OutFile {
 public:
  OutFile() = default;
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  ~OutFile() {
    if (map_ != nullptr) munmap(map_, size_);
    if (fd_ >= 0) close(fd_);
  }
  Status Create(const std::string& path, const std::vector<uint8_t>& header, uint64_t size) {
    path_ = path;
    size_ = size;
    fd_ = open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0644);
    if (fd_ < 0) return file_io::Error(path, "cannot create");
    // Reserved, not only sized: a full disk is an error here, never a SIGBUS on a write
    // through the mapping.
    ARC_V3_RETURN_IF_ERROR(file_io::Reserve(fd_, size, path));
    return Write(header.data(), header.size(), 0);
  }
  Status Write(const uint8_t* data, uint64_t size, uint64_t offset) {
    return file_io::WriteAt(fd_, data, size, offset, path_);
  }
  // Maps the whole file for writing (after Create).
  Status Map() {
    void* map = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (map == MAP_FAILED) return file_io::Error(path_, "cannot map");
    map_ = static_cast<uint8_t*>(map);
    return Status::Ok();
  }
  uint8_t* data() const { return map_; }
  const std::string& path() const { return path_; }
  // Unmaps first: the mapping's pages are then the file's, which the sync writes.
  Status Close(bool sync) {
    if (map_ != nullptr) munmap(map_, size_);
    map_ = nullptr;
    const int fd = fd_;
    fd_ = -1;
    if (sync && fsync(fd) != 0) {
      const Status s = file_io::Error(path_, "cannot sync");
      close(fd);
      return s;
    }
    return close(fd) == 0 ? Status::Ok() : file_io::Error(path_, "cannot close");
  }

 private:
  std::string path_;
  uint64_t size_ = 0;
  int fd_ = -1;
  uint8_t* map_ = nullptr;
};

// The tensors of `file` of which a sidecar holds rows, as a hop's base (read, never written).
checkpoint::HeldTensors HeldOf(const Held& held, const FileEntry& file) {
  checkpoint::HeldTensors out;
  for (const TensorEntry& t : file.tensors) {
    const auto r = held.rows.find(t.name);
    const uint8_t* data = r == held.rows.end() ? nullptr : held.Rows(t, r->second.first, r->second.second);
    if (data == nullptr) continue;
    checkpoint::HeldTensor& h = out[t.name];
    h.dtype = t.dtype;
    h.shape = t.shape;
    h.row_begin = r->second.first;
    h.row_end = r->second.second;
    h.data = const_cast<uint8_t*>(data);
  }
  return out;
}

// A partial pull's side of a hop (see apply_hop.h): each shard's base is its sidecar of the
// hop before (none for an anchor), and its result a new sidecar holding the rows Needed()
// of every tensor, mapped for writing. A shard's files stay open from Open to Commit only.
class SidecarSink : public HopSink {
 public:
  SidecarSink(const Hop& hop, const Select& select, const std::vector<std::string>& bases,
              const std::vector<std::string>& outs, bool sync)
      : hop_(hop), select_(select), bases_(bases), outs_(outs), sync_(sync) {}
  Status Open(size_t k, const Fetched& f, const checkpoint::HeldTensors** base) override {
    Shard& shard = shards_[k];
    if (!hop_.anchor[k]) {
      ARC_V3_RETURN_IF_ERROR(safetensors::File::Open(bases_[k], &shard.base_file));
      Held held;
      ARC_V3_RETURN_IF_ERROR(held.Load(&shard.base_file));
      shard.base = HeldOf(held, f.file());
    }
    *base = &shard.base;
    return Create(f.file(), select_.keep_small[k], outs_[k], &shard);
  }
  Status Allocate(size_t k, const TensorEntry& t, uint64_t, uint64_t, checkpoint::HeldTensor* held) override {
    const Shard& shard = shards_.at(k);
    const auto at = shard.offset.find(t.name);
    if (at == shard.offset.end()) return Status(ErrorCode::kInternal, outs_[k] + " has no room for '" + t.name + "'");
    held->data = shard.out.data() + at->second;
    return Status::Ok();
  }
  bool in_place() const override { return false; }
  Status Commit(size_t k, checkpoint::TensorApply* apply) override {
    checkpoint::HeldTensors written;
    apply->Commit(&written);
    const Status s = shards_.at(k).out.Close(sync_);
    shards_.erase(k);
    return s;
  }

 private:
  struct Shard {
    safetensors::File base_file;
    checkpoint::HeldTensors base;
    OutFile out;
    std::map<std::string, uint64_t> offset;  // of each tensor's rows in `out`
  };
  // The new sidecar of `file`: its header (the rows kept, in kRowsKey), then room for them.
  Status Create(const FileEntry& file, bool keep_small, const std::string& path, Shard* shard) const {
    std::vector<safetensors::TensorInfo> infos;
    nlohmann::json rows = nlohmann::json::object();
    for (const TensorEntry& t : file.tensors) {
      const Need need = Needed(t, select_, keep_small);
      if (need.empty()) continue;
      safetensors::TensorInfo info;
      info.name = t.name;
      info.dtype = t.dtype;
      info.shape = t.shape;
      if (!info.shape.empty()) info.shape[0] = need.end - need.begin;
      info.end = (need.end - need.begin) * t.row_bytes();
      infos.push_back(info);
      rows[t.name] = {need.begin, need.end};
    }
    const std::vector<uint8_t> header = safetensors::BuildHeader(&infos, {{kRowsKey, rows.dump()}});
    uint64_t total = header.size();
    for (const auto& info : infos) {
      total += info.size();
      shard->offset[info.name] = header.size() + info.begin;
    }
    ARC_V3_RETURN_IF_ERROR(shard->out.Create(path, header, total));
    return shard->out.Map();
  }

  const Hop& hop_;
  const Select& select_;
  const std::vector<std::string>& bases_;
  const std::vector<std::string>& outs_;
  const bool sync_;
  std::map<size_t, Shard> shards_;  // those open
};

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
  ARC_V3_RETURN_IF_ERROR(out.Create(out_path, header, total));
  for (size_t i = 0; i < infos.size(); ++i) {
    ARC_V3_RETURN_IF_ERROR(out.Write(sources[i], infos[i].size(), header.size() + infos[i].begin));
  }
  return out.Close(true);
}

Status VerifyObject(const Fetched& f, Store* store, const Trust& trust) {
  std::unique_ptr<checkpoint::MappedFile> file;
  ARC_V3_RETURN_IF_ERROR(checkpoint::MappedFile::Open(f.path, &file));
  const std::string name = store->url() + "/" + f.ref.key;
  // Trusting, the SHA-256 decides before the XXH3 (whose mismatch another route may avoid).
  if (trust.on() && (f.ref.sha256.empty() || DigestHex(Sha256(file->data(), file->size())) != f.ref.sha256)) {
    return Status(ErrorCode::kUntrusted, name + (f.ref.sha256.empty() ? ": its record names no SHA-256"
                                                                       : " differs from its record's SHA-256"));
  }
  if (file->size() != f.ref.size || checkpoint::Hash(file->data(), file->size()) != f.ref.xxh3) {
    return Status(ErrorCode::kCorruptChunk, name + " does not match its record (corrupt or truncated)");
  }
  Reader reader;
  Status s = Reader::Open(std::move(file), &reader);
  if (s.ok()) s = CheckLayout(reader, *f.record, name);
  return InContext(name, s);
}

// A full pull's objects, downloaded and verified on `connections` threads in the order
// the route applies them (hop by hop, shard by shard), while the caller decodes each one
// as soon as it is ready (Wait): a step costs about the larger of download and decode,
// not their sum. Every object is downloaded whatever the decoder meets, so that Finish
// reports what fetching all before applying would: the first failed download in route
// order, else the first failed verification. The destructor waits for the threads.
class ObjectFeed {
 public:
  ObjectFeed(Store* store, const PullOptions& o, const Trust& trust, std::vector<Fetched>* fetched,
             PullReport* report)
      : store_(store), transfer_(o.transfer_options()), trust_(trust), fetched_(*fetched), report_(report),
        state_(fetched->size()) {}
  ~ObjectFeed() { Join(); }

  // Fails only if no thread could be started (any one thread downloads every object).
  // Objects of several parts download one after the other, each on all connections, so
  // that the first arrives first; objects of one part download `connections` at a time.
  Status Start() {
    start_ = Clock::now();
    uint64_t bytes = 0;
    for (const Fetched& f : fetched_) bytes += f.ref.size;
    const uint64_t part = std::max<uint64_t>(1, transfer_.part_bytes);
    const uint64_t parts = fetched_.empty() ? 1 : std::max<uint64_t>(1, (bytes / fetched_.size() + part - 1) / part);
    const int connections = std::max(1, transfer_.connections);
    const size_t workers = WorkerCount(static_cast<int>(std::max<uint64_t>(1, connections / parts)), fetched_.size());
    const Status s = StatusOrCaught([&] {
      for (size_t w = 0; w < workers; ++w) threads_.emplace_back([this] { Work(); });
      return Status::Ok();
    });
    return threads_.empty() && !fetched_.empty() ? s : Status::Ok();
  }

  // Object i's download and verification; the time spent waiting counts in wait_seconds.
  Status Wait(size_t i) {
    const auto start = Clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return state_[i].done; });
    report_->wait_seconds += SecondsSince(start);
    return state_[i].fetch.ok() ? state_[i].verify : state_[i].fetch;
  }

  // Waits for every object; the error fetching all before applying would have met.
  Status Finish() {
    Join();
    for (const Object& object : state_) {
      if (!object.fetch.ok()) return object.fetch;
    }
    for (const Object& object : state_) {
      if (!object.verify.ok()) return object.verify;
    }
    report_->fetched_objects += fetched_.size();
    return Status::Ok();
  }

 private:
  struct Object {
    bool done = false;
    Status fetch, verify;
  };

  void Work() {
    for (size_t i = next_++; i < fetched_.size(); i = next_++) {
      const Fetched& f = fetched_[i];
      Status fetch = StatusOrCaught([&] { return store_->GetToFile(f.ref.key, f.path, f.ref.size, transfer_); });
      const auto verify_start = Clock::now();
      Status verify = fetch.ok() ? StatusOrCaught([&] { return VerifyObject(f, store_, trust_); }) : Status::Ok();
      std::lock_guard<std::mutex> lock(mutex_);
      report_->requests += std::max<uint64_t>(1, (f.ref.size + transfer_.part_bytes - 1) / transfer_.part_bytes);
      if (fetch.ok()) {
        report_->fetched_bytes += f.ref.size;
        report_->verify_seconds += SecondsSince(verify_start);
      }
      state_[i] = Object{true, std::move(fetch), std::move(verify)};
      if (++finished_ == fetched_.size()) report_->fetch_seconds += SecondsSince(start_);
      ready_.notify_all();
    }
  }

  void Join() {
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  Store* store_;
  const StoreOptions transfer_;
  const Trust& trust_;
  const std::vector<Fetched>& fetched_;
  PullReport* report_;
  std::vector<Object> state_;  // guarded by mutex_
  std::atomic<size_t> next_{0};
  size_t finished_ = 0;  // guarded by mutex_
  Clock::time_point start_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<std::thread> threads_;
};

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
        return Status(s.code(), s.message() + " (it records step " + std::to_string(state->step) + ")");
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
    std::unique_ptr<checkpoint::MappedFile> object;
    checkpoint::Reader reader;
    ARC_V3_RETURN_IF_ERROR(checkpoint::MappedFile::Open(fetched[objects[k]].path, &object));
    ARC_V3_RETURN_IF_ERROR(Reader::Open(std::move(object), &reader));
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
          ARC_V3_RETURN_IF_ERROR(safetensors::File::Open(path, &file));
          opened = true;
        }
        const safetensors::TensorInfo* info = file.Find(t.name);
        if (info == nullptr) return differs("tensor '" + t.name + "' is missing from the result");
        sum = checkpoint::TensorChecksum(t, file.data(*info));
      }
      if (sum != r.tensors[i].xxh3) return differs("checksum of tensor '" + t.name + "' is not its result's");
    }
  }
  return Status::Ok();
}

// The files of one hop of a pull, per shard: its base (`current`: DIR's own file or the
// result of the hop before) and its result in the stage.
struct HopFiles {
  const Hop* hop = nullptr;
  const std::vector<size_t>* objects = nullptr;  // its container's index in the fetched
  std::vector<std::string>* current = nullptr;
  std::vector<std::string> outs;
  std::string stage;  // the stage's path, ending in '/'
  bool sync = false;  // the results are synced (the last hop's)

  // Shard k's result becomes its current file; a staged file it replaces is removed.
  void Advance(size_t k) {
    std::error_code ec;
    const std::string& previous = (*current)[k];
    if (!previous.empty() && previous != outs[k] && previous.rfind(stage, 0) == 0) fs::remove(previous, ec);
    (*current)[k] = outs[k];
  }
};

// One hop of a full pull: each shard's file streamed from its base and container.
// Each object is decoded as soon as `feed` has it.
Status ApplyFilesHop(HopFiles* files, const std::vector<Fetched>& fetched, ObjectFeed* feed,
                     checkpoint::RunOptions run, PullReport* report) {
  const Hop& hop = *files->hop;
  run.sync = files->sync;
  for (size_t k = 0; k < hop.m.count; ++k) {
    ARC_V3_RETURN_IF_ERROR(feed->Wait((*files->objects)[k]));
    checkpoint::RunReport applied;
    const Status s = checkpoint::Apply(hop.anchor[k] ? "" : (*files->current)[k],
                                       fetched[(*files->objects)[k]].path, files->outs[k], run, &applied);
    report->decode_seconds += applied.decode_seconds;
    report->write_seconds += applied.write_seconds + applied.sync_seconds;
    ARC_V3_RETURN_IF_ERROR_IN("step " + std::to_string(hop.m.step) + ", shard " + std::to_string(k) + " (" +
                                  hop.m.shards[k].file + ")",
                              s);
    files->Advance(k);
  }
  return Status::Ok();
}

// One hop of a partial pull: each shard's sidecar rebuilt onto its previous one (none for
// an anchor) by the hop engine, one shard at a time, all the pieces fetched before.
Status ApplyRowsHop(HopFiles* files, const Select& select, const std::vector<Fetched>& fetched, int threads,
                    PullReport* report) {
  const Hop& hop = *files->hop;
  HopRun run;
  run.hop = &hop;
  run.select = &select;
  run.fetched = &fetched;
  run.object = files->objects;
  run.threads = threads;
  SidecarSink sink(hop, select, *files->current, files->outs, files->sync);
  for (size_t k = 0; k < hop.m.count; ++k) {
    run.batches = {{k}};
    HopTimes times;
    const Status s = ApplyHop(run, &sink, report, &times);
    report->decode_seconds += times.decode_seconds;
    report->write_seconds += times.commit_seconds;
    ARC_V3_RETURN_IF_ERROR(s);
    files->Advance(k);
  }
  return Status::Ok();
}

// Builds every shard's file (full) or sidecar (partial) hop by hop in the stage; `current`
// starts as DIR's own files (a route from DIR) or empty, and ends as the last hop's.
// A full pull's objects come from `feed`; a partial pull's pieces are all fetched before.
Status ApplyRoute(const Route& route, const Select& select, const std::vector<Fetched>& fetched, ObjectFeed* feed,
                  const std::vector<std::vector<size_t>>& object_of, const Stage& stage, const PullOptions& o,
                  std::vector<std::string>* current, PullReport* report) {
  const bool partial = select.sel.partial();
  for (size_t h = 0; h < route.hops.size(); ++h) {
    HopFiles files;
    files.hop = &route.hops[h];
    files.objects = &object_of[h];
    files.current = current;
    files.stage = stage.Path("");
    files.sync = h + 1 == route.hops.size() && o.checkpoint.sync;
    for (size_t k = 0; k < files.hop->m.count; ++k) {
      const std::string& name = files.hop->m.shards[k].file;
      files.outs.push_back(partial ? stage.Path("rows/" + std::to_string(h) + "-" + name) : stage.Path(name));
    }
    ARC_V3_RETURN_IF_ERROR(partial ? ApplyRowsHop(&files, select, fetched, o.checkpoint.threads, report)
                                   : ApplyFilesHop(&files, fetched, feed, checkpoint::RunOptions(o.checkpoint), report));
    report->steps.push_back(files.hop->m.step);
  }
  return Status::Ok();
}

// The step's model.safetensors.index.json, as its record names it: under trust by its
// signed SHA-256 first (kUntrusted), then by size and XXH3 (kCorruptHeader), then by the
// SHA-256 a signed record gives (kUntrusted: bytes made to pass the XXH3).
Status FetchIndex(Store* store, const ObjectRef& index, const Trust& trust, std::vector<uint8_t>* bytes) {
  const std::string name = store->url() + "/" + index.key;
  if (trust.on() && index.sha256.empty()) {
    return Status(ErrorCode::kUntrusted, name + ": its record names it without a SHA-256");
  }
  ARC_V3_RETURN_IF_ERROR(UnderTrust(trust, store->Get(index.key, kMaxDocumentBytes, bytes, nullptr)));
  if (trust.on() && DigestHex(Sha256(bytes->data(), bytes->size())) != index.sha256) {
    return Status(ErrorCode::kUntrusted, name + " is not the index the step names (its SHA-256 differs)");
  }
  if (bytes->size() != index.size || checkpoint::Hash(bytes->data(), bytes->size()) != index.xxh3) {
    return Status(ErrorCode::kCorruptHeader, name + ": not the index the step names");
  }
  if (!index.sha256.empty() && DigestHex(Sha256(bytes->data(), bytes->size())) != index.sha256) {
    return Status(ErrorCode::kUntrusted, name + " is not the index the step names (its SHA-256 differs)");
  }
  return Status::Ok();
}

// The commit of a pull: the staged files' moves into DIR, the files to remove, the state
// (with the keys it was pulled trusting).
Status BuildJournal(Store* store, const std::string& dir, const DirState* old, const Route& route,
                    const Select& select, const std::vector<Fetched>& fetched,
                    const std::vector<std::vector<size_t>>& object_of, const Stage& stage,
                    const std::vector<std::string>& current, const Trust& trust, Journal* journal,
                    PullReport* report) {
  const Hop& final_hop = route.hops.back();
  const bool partial = select.sel.partial();
  journal->state.store = store->url();
  journal->state.step = final_hop.m.step;
  journal->state.manifest_xxh3 = final_hop.manifest_xxh3;
  journal->state.root_sha256 = final_hop.root_sha256;
  journal->state.incarnation = final_hop.m.incarnation;
  journal->state.trusted_keys = trust.ids();
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
    Status s = FetchIndex(store, *index, trust, &bytes);
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

// Trust stays on once a pull took it: a pull without keys would take anyone's steps.
Status KeptTrust(const std::string& dir, const DirState& state, bool trusting) {
  if (trusting || state.trusted_keys.empty()) return Status::Ok();
  const size_t more = state.trusted_keys.size() - 1;
  return Status(ErrorCode::kUntrusted,
                dir + " was pulled trusting key " + state.trusted_keys[0].substr(0, 16) +
                    (more > 0 ? " and " + std::to_string(more) + " more" : "") +
                    ": a pull without trusted keys would take steps signed by anyone or no one (trust the "
                    "keys again, or reset the directory to pull it without trust)");
}

// Which route a retry must not take: DIR's chain (its objects vanished or are damaged, or
// DIR's rows do not suffice) or the anchor's (its objects are damaged).
enum class Avoid { kNone, kDir, kAnchor };
Status PullLocked(Store* store, const std::string& dir, const PullOptions& o, Avoid avoid, PullReport* report);

// The layouts a partial pull read stay in DIR/.arc_v3/layouts/XXH3.json for the next pull
// (a run's layout rarely changes, so a host pays for them once): a file is used only if its
// bytes hash to its name, and under trust only if its SHA-256 is the one the root names
// (LoadShards). Best effort: a cache that cannot be read or written is skipped.
void LoadLayoutCache(const std::string& dir, LayoutCache* layouts) {
  std::error_code ec;
  std::vector<fs::path> damaged;
  for (auto it = fs::directory_iterator(fs::path(dir) / kStateDir / "layouts", ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() != 21 || name.compare(16, 5, ".json") != 0) continue;
    std::ifstream in(it->path(), std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const uint64_t xxh3 = checkpoint::Hash(bytes.data(), bytes.size());
    Layout layout;
    if (checkpoint::HexU64(xxh3) == name.substr(0, 16) && ParseLayout(bytes, it->path().string(), &layout).ok()) {
      layout.sha256 = DigestHex(Sha256(bytes.data(), bytes.size()));  // what a trusting pull compares
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
    const std::string name = checkpoint::HexU64(g.layout_xxh3) + ".json";
    keep.insert(name);
    const std::string json = LayoutJson(it->second);
    if (checkpoint::Hash(json.data(), json.size()) != g.layout_xxh3) continue;
    // A file of other bytes (of the same XXH3) is replaced by the layout the root names.
    std::ifstream in(folder / name, std::ios::binary);
    if (in && std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()) == json) continue;
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

// A pull that failed on `route` (`s`): pulled once more another way where the rules allow
// (PROTOCOL.md, Pulling, "Route"), else `s` as it is. A chain route from DIR whose pieces
// vanished (not_found), or, applying, whose rows do not suffice (`rows_may_lack`), is
// pulled again by an anchor route; a route that met damage takes the other route. A retry
// (`retried`) is never retried.
Status Recover(Store* store, const std::string& dir, const PullOptions& o, const Route& route, bool retried,
               bool rows_may_lack, const Status& s, PullReport* report) {
  if (s.ok() || retried) return s;
  const bool lacks = rows_may_lack && s.code() == ErrorCode::kChecksumMismatch;
  if (route.from_dir && (s.code() == ErrorCode::kNotFound || lacks)) return Retry(store, dir, o, report);
  if (Damaged(s.code()) && !route.hops.empty()) return Reroute(store, dir, o, route, s, report);
  return s;
}

// A pull's selection of tensors and rows, compiled from its options.
Status CompileSelect(const PullOptions& o, Select* select) {
  select->sel.tensors = o.tensors;
  select->sel.row_begin = o.row_begin;
  select->sel.row_end = o.row_end;
  if (!select->sel.partial() && (o.row_begin != 0 || o.row_end != UINT64_MAX)) select->sel.tensors = ".*";
  try {
    select->pattern = std::regex(select->sel.partial() ? select->sel.tensors : ".*", std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return Status(ErrorCode::kInvalidArgument,
                  "tensor pattern '" + select->sel.tensors + "' is not a regular expression: " + e.what());
  }
  if (o.row_begin > o.row_end) {
    return Status(ErrorCode::kInvalidArgument, "rows " + std::to_string(o.row_begin) + ":" +
                                                   std::to_string(o.row_end) + " are reversed");
  }
  return Status::Ok();
}

// What a pull settled before it fetches: what DIR holds, and the route from it.
struct PullPlan {
  Select select;
  DirState state;
  bool have_state = false;
  Route route;
  LayoutCache layouts;  // of a partial pull
  Trust trust;
  Clock::time_point start;  // of the pull
};

// DIR's state, after a commit a crash interrupted is finished (a reset drops one it cannot
// finish); none (have_state false) in a directory never pulled into or under a reset.
Status ReadDirState(const std::string& dir, const PullOptions& o, PullPlan* plan, PullReport* report) {
  Status s = RecoverJournal(dir);
  if (!s.ok() && o.reset) s = DropJournal(dir);
  if (!s.ok()) return s;
  s = ReadState(dir, &plan->state);
  if (s.ok()) {
    plan->have_state = true;
    report->from_step = plan->state.step;
  } else if (s.code() != ErrorCode::kNotFound && !o.reset) {
    return s;
  }
  return Status::Ok();
}

// One entry per (hop, shard) of the route, downloaded into the stage; `object_of`:
// [hop][shard] -> index in `fetched`.
void ListObjects(const Route& route, const Stage& stage, bool partial, std::vector<Fetched>* fetched,
                 std::vector<std::vector<size_t>>* object_of) {
  object_of->assign(route.hops.size(), {});
  for (size_t h = 0; h < route.hops.size(); ++h) {
    for (size_t k = 0; k < route.hops[h].m.count; ++k) {
      (*object_of)[h].push_back(fetched->size());
      fetched->emplace_back();
      Fetched& f = fetched->back();
      f.hop = h;
      f.shard = k;
      f.ref = RefOf(route.hops[h], k);
      f.record = &route.hops[h].m.shards[k];
      f.path = stage.Path("objects/" + std::to_string(fetched->size() - 1) + ".a3d");
      // A shard none of whose records on the route names a selected tensor needs no byte
      // of its objects (nor do its small tensors: a group is kept whole only for a selected
      // member): a pull of a few shards' tensors reads only those shards' records and objects.
      if (partial) f.skipped = !route.touched[k];
    }
  }
}

// Fetches, applies and verifies the planned route in a stage, then commits it to DIR.
Status TakeRoute(Store* store, const std::string& dir, const PullOptions& o, Avoid avoid, PullPlan* plan,
                 PullReport* report) {
  const bool avoid_dir = avoid != Avoid::kNone;  // a retry does not retry again
  const bool partial = plan->select.sel.partial();
  const Route& route = plan->route;
  Stage stage;
  ARC_V3_RETURN_IF_ERROR(stage.Create(dir));
  std::vector<Fetched> fetched;
  std::vector<std::vector<size_t>> object_of;
  ListObjects(route, stage, partial, &fetched, &object_of);
  const Trust& trust = plan->trust;  // under it, what fails a check is kUntrusted: never rerouted
  std::vector<std::string> current(route.hops.back().m.count);
  for (size_t k = 0; route.from_dir && k < current.size(); ++k) {
    const ShardState& shard = plan->state.shards[k];
    current[k] = (fs::path(dir) / (partial ? shard.rows.path : shard.name)).string();
  }
  // A full pull decodes each object as it arrives; what fetching met is still judged
  // first, as if every object had been fetched before the first was applied.
  Status s, applied;
  if (partial) {
    s = FetchPieces(store, o.transfer_options(), UINT64_MAX, &plan->select, &fetched, report, kPrefetchBudget, trust);
  } else {
    ObjectFeed feed(store, o, trust, &fetched, report);
    s = feed.Start();
    if (s.ok()) {
      applied = ApplyRoute(route, plan->select, fetched, &feed, object_of, stage, o, &current, report);
      s = feed.Finish();
    }
  }
  s = UnderTrust(trust, s);
  if (!s.ok()) return Recover(store, dir, o, route, avoid_dir, false, s, report);
  if (o.hook) ARC_V3_RETURN_IF_ERROR(o.hook("fetched"));

  if (partial) applied = ApplyRoute(route, plan->select, fetched, nullptr, object_of, stage, o, &current, report);
  s = UnderTrust(trust, applied);
  if (!s.ok()) return Recover(store, dir, o, route, avoid_dir, partial, s, report);
  if (!partial) {
    const auto verify = Clock::now();
    s = UnderTrust(trust, VerifyResults(route.hops.back(), fetched, object_of.back(), current));
    report->verify_seconds += SecondsSince(verify);
    if (!s.ok()) return Recover(store, dir, o, route, avoid_dir, false, s, report);
  }

  Journal journal;
  ARC_V3_RETURN_IF_ERROR(BuildJournal(store, dir, plan->have_state ? &plan->state : nullptr, route, plan->select,
                                      fetched, object_of, stage, current, trust, &journal, report));
  if (o.hook) ARC_V3_RETURN_IF_ERROR(o.hook("commit"));
  const auto commit = Clock::now();
  stage.HandOver();
  ARC_V3_RETURN_IF_ERROR(Commit(dir, journal, o.after_move));
  if (partial) SaveLayoutCache(dir, plan->layouts, route.hops.back().m);
  report->commit_seconds = SecondsSince(commit);
  report->total_seconds = SecondsSince(plan->start);
  return Status::Ok();
}

// `avoid`: kDir routes from an anchor even where DIR's step is on the chain (a retry after
// the chain's objects vanished, pruned, while this pull planned, were damaged, or after
// DIR's rows did not suffice for a partial pull's new selection of groups); kAnchor takes
// DIR's chain even where the anchor costs less (its objects were damaged).
Status PullLocked(Store* store, const std::string& dir, const PullOptions& o, Avoid avoid, PullReport* report) {
  const bool avoid_dir = avoid != Avoid::kNone;  // a retry does not retry again
  PullPlan plan;
  plan.start = Clock::now();
  ARC_V3_RETURN_IF_ERROR(CompileSelect(o, &plan.select));
  const bool partial = plan.select.sel.partial();
  ARC_V3_RETURN_IF_ERROR(ReadDirState(dir, o, &plan, report));
  const DirState& state = plan.state;
  const bool have_state = plan.have_state && !o.reset;

  ARC_V3_RETURN_IF_ERROR(LoadTrust(o.trusted_keys, &plan.trust));
  if (have_state) ARC_V3_RETURN_IF_ERROR(KeptTrust(dir, state, plan.trust.on()));
  // Under trust DIR's files are a base only if a trusting pull wrote them: the chain from
  // them then links by SHA-256 (PlanRoute); else the pull goes by an anchor.
  const bool dir_verified = !plan.trust.on() || (!state.trusted_keys.empty() && !state.root_sha256.empty());
  Hop target;
  ARC_V3_RETURN_IF_ERROR(ReadTarget(store, o.step, &target, report, plan.trust));
  if (have_state) {
    // A signed step is still refused where it would take DIR back, or to another run.
    ARC_V3_RETURN_IF_ERROR(CheckProgress(plan.trust, state.step, state.run, target.m, dir));
    // DIR's own files must be what it records before anything is applied onto them.
    const auto verify = Clock::now();
    const Status s = CheckDirectory(dir, &plan.state);
    report->verify_seconds += SecondsSince(verify);
    ARC_V3_RETURN_IF_ERROR(s);
    if (state.step == target.m.step && state.manifest_xxh3 == target.manifest_xxh3 && dir_verified &&
        (!plan.trust.on() || state.root_sha256 == target.root_sha256) && state.selection == plan.select.sel) {
      report->up_to_date = true;
      report->route = "up to date";
      for (const ShardState& sh : state.shards) report->checkpoint_bytes += sh.file.size;
      report->total_seconds = SecondsSince(plan.start);
      return Status::Ok();
    }
  }
  Route& route = plan.route;
  const bool usable = have_state && dir_verified && state.selection == plan.select.sel && avoid != Avoid::kDir;
  RouteFrom from{state.step, state.manifest_xxh3, state.root_sha256, static_cast<uint32_t>(state.shards.size()),
                 state.incarnation};
  from.only_chain = avoid == Avoid::kAnchor;
  if (from.only_chain && !usable) return Status(ErrorCode::kNotFound, "the directory holds no step on the chain");
  Status s = PlanRoute(store, usable ? &from : nullptr, std::move(target), &route, report, plan.trust);
  if (partial) LoadLayoutCache(dir, &plan.layouts);
  if (s.ok()) s = LoadRoute(store, partial ? &plan.select : nullptr, &plan.layouts, &route, report, plan.trust);
  if (!s.ok()) return Recover(store, dir, o, route, avoid_dir, false, s, report);
  report->route = route.name;
  if (o.hook) ARC_V3_RETURN_IF_ERROR(o.hook("planned"));
  return TakeRoute(store, dir, o, avoid, &plan, report);
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
                  dir + " holds files but was never pulled into: they are not replaced unless forced");
  }
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) return Status(ErrorCode::kInvalidArgument, dir + ": cannot create the directory");
  DirLock lock;
  ARC_V3_RETURN_IF_ERROR(lock.Acquire(dir));  // another pull's: never clean up under it
  Status s = PullLocked(store, dir, options, options.anchor_route ? Avoid::kDir : Avoid::kNone, report);
  // A first pull that failed leaves nothing behind: not the directory it made, nor the
  // lock and stage it made inside one that existed (removed while the lock is held).
  const fs::path state_dir = fs::path(dir) / kStateDir;
  if (!s.ok() && !had_state_dir && !fs::exists(state_dir / "state.json", ec) &&
      !fs::exists(state_dir / "commit.json", ec)) {
    fs::remove_all(existed ? state_dir : fs::path(dir), ec);
  }
  return s;
}

Status CheckTrustKept(const std::string& dir, const PullOptions& options) {
  DirState state;
  if (options.reset || !options.trusted_keys.empty() || !ReadState(dir, &state).ok()) return Status::Ok();
  return KeptTrust(dir, state, false);
}

Status DirectoryStep(const std::string& dir, uint64_t* step) {
  DirState state;
  Status s = ReadState(dir, &state);
  if (s.ok()) *step = state.step;
  return s;
}

}  // namespace sync
}  // namespace arc_v3
