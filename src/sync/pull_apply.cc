// Applying a pull's route in its stage (pull.cc plans and commits): the stage directory,
// the feed that downloads a full pull's objects while they are decoded, the hops that
// rebuild each shard's file (full) or row sidecar (partial), the check of the results, and
// the journal that commits them to DIR. Internal to src/sync.
#include "src/sync/pull_apply.h"

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

namespace fs = std::filesystem;
using checkpoint::FileEntry;
using checkpoint::Reader;
using checkpoint::TensorEntry;

// Sidecar metadata: per tensor, the rows [begin, end) it holds.
constexpr char kRowsKey[] = "arc_v3_rows";

// The rows a partial pull's sidecar file holds, by tensor name: its metadata.
struct Held {
  const safetensors::File* file = nullptr;
  std::map<std::string, std::pair<uint64_t, uint64_t>> rows;

  Status Load(const safetensors::File* f) {
    file = f;
    const auto it = f->metadata().find(kRowsKey);
    if (it == f->metadata().end())
      return Status(ErrorCode::kCorruptHeader, f->path() + " lacks its row ranges");
    try {
      const nlohmann::json j = strict_json::Parse(it->second, f->path());
      for (auto e = j.begin(); e != j.end(); ++e)
        rows[e.key()] = {e.value().at(0).get<uint64_t>(), e.value().at(1).get<uint64_t>()};
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
    const uint8_t* data =
        r == held.rows.end() ? nullptr : held.Rows(t, r->second.first, r->second.second);
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
  Status Allocate(size_t k, const TensorEntry& t, uint64_t, uint64_t,
                  checkpoint::HeldTensor* held) override {
    const Shard& shard = shards_.at(k);
    const auto at = shard.offset.find(t.name);
    if (at == shard.offset.end())
      return Status(ErrorCode::kInternal, outs_[k] + " has no room for '" + t.name + "'");
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
  Status Create(const FileEntry& file, bool keep_small, const std::string& path,
                Shard* shard) const {
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
      return Status(ErrorCode::kInternal,
                    rows_file.path() + " lacks rows of tensor '" + t.name + "'");
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

}  // namespace

Status VerifyObject(const Fetched& f, Store* store, const Trust& trust) {
  std::unique_ptr<checkpoint::MappedFile> file;
  ARC_V3_RETURN_IF_ERROR(checkpoint::MappedFile::Open(f.path, &file));
  const std::string name = store->url() + "/" + f.ref.key;
  // Trusting, the SHA-256 decides before the XXH3 (whose mismatch another route may avoid).
  if (trust.on() &&
      (f.ref.sha256.empty() || DigestHex(Sha256(file->data(), file->size())) != f.ref.sha256)) {
    return Status(ErrorCode::kUntrusted,
                  name + (f.ref.sha256.empty() ? ": its record names no SHA-256"
                                               : " differs from its record's SHA-256"));
  }
  if (file->size() != f.ref.size || checkpoint::Hash(file->data(), file->size()) != f.ref.xxh3) {
    return Status(ErrorCode::kCorruptChunk,
                  name + " does not match its record (corrupt or truncated)");
  }
  Reader reader;
  Status s = Reader::Open(std::move(file), &reader);
  if (s.ok()) s = CheckLayout(reader, *f.record, name);
  return InContext(name, s);
}

// The result checksums of the last hop's files (ungrouped tensors: the containers'
// target_xxh3, which apply verified; grouped ones hashed from the rebuilt files), kept in
// each record's `results`, and their tensor-list checksums checked against the records'.
Status VerifyResults(Hop* hop, const std::vector<Fetched>& fetched,
                     const std::vector<size_t>& objects, const std::vector<std::string>& files) {
  for (size_t k = 0; k < hop->m.count; ++k) {
    ShardRecord& r = hop->m.shards[k];
    std::unique_ptr<checkpoint::MappedFile> object;
    checkpoint::Reader reader;
    ARC_V3_RETURN_IF_ERROR(checkpoint::MappedFile::Open(fetched[objects[k]].path, &object));
    ARC_V3_RETURN_IF_ERROR(Reader::Open(std::move(object), &reader));
    const auto differs = [&](const std::string& what) {
      return Status(ErrorCode::kCorruptHeader, "step " + std::to_string(hop->m.step) + " shard " +
                                                   std::to_string(k) + ": " + what);
    };
    safetensors::File file;
    bool opened = false;
    r.results.clear();
    for (const TensorEntry* entry : DataOrder(reader.manifest().files[0].tensors)) {
      const TensorEntry& t = *entry;
      uint64_t sum = t.target_xxh3;
      if (t.grouped()) {
        if (!opened) {
          ARC_V3_RETURN_IF_ERROR(safetensors::File::Open(files[k], &file));
          opened = true;
        }
        const safetensors::TensorInfo* info = file.Find(t.name);
        if (info == nullptr) return differs("tensor '" + t.name + "' is missing from the result");
        sum = checkpoint::TensorChecksum(t, file.data(*info));
      }
      r.results.push_back({t.name, sum});
    }
    if (TensorListChecksum(r.results) != r.tensors_xxh3) {
      return differs("the results' tensor-list checksum is not the record's tensors_xxh3");
    }
  }
  return Status::Ok();
}

namespace {

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
    if (!previous.empty() && previous != outs[k] && previous.rfind(stage, 0) == 0)
      fs::remove(previous, ec);
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
    const Status s =
        checkpoint::Apply(hop.anchor[k] ? "" : (*files->current)[k],
                          fetched[(*files->objects)[k]].path, files->outs[k], run, &applied);
    report->decode_seconds += applied.decode_seconds;
    report->write_seconds += applied.write_seconds + applied.sync_seconds;
    ARC_V3_RETURN_IF_ERROR_IN("step " + std::to_string(hop.m.step) + ", shard " +
                                  std::to_string(k) + " (" + hop.m.shards[k].file + ")",
                              s);
    files->Advance(k);
  }
  return Status::Ok();
}

// One hop of a partial pull: each shard's sidecar rebuilt onto its previous one (none for
// an anchor) by the hop engine, one shard at a time, all the pieces fetched before.
Status ApplyRowsHop(HopFiles* files, const Select& select, const std::vector<Fetched>& fetched,
                    int threads, PullReport* report) {
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

}  // namespace

// Builds every shard's file (full) or sidecar (partial) hop by hop in the stage; `current`
// starts as DIR's own files (a route from DIR) or empty, and ends as the last hop's.
// A full pull's objects come from `feed`; a partial pull's pieces are all fetched before.
Status ApplyRoute(StagedRoute* plan, ObjectFeed* feed, const PullOptions& o, PullReport* report) {
  const Route& route = *plan->route;
  const Select& select = *plan->select;
  const Stage& stage = *plan->stage;
  const std::vector<Fetched>& fetched = plan->fetched;
  const std::vector<std::vector<size_t>>& object_of = plan->object_of;
  std::vector<std::string>* current = &plan->current;
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
      files.outs.push_back(partial ? stage.Path("rows/" + std::to_string(h) + "-" + name)
                                   : stage.Path(name));
    }
    const checkpoint::RunOptions run(o.checkpoint);
    ARC_V3_RETURN_IF_ERROR(partial ? ApplyRowsHop(&files, select, fetched, run.threads, report)
                                   : ApplyFilesHop(&files, fetched, feed, run, report));
    report->steps.push_back(files.hop->m.step);
  }
  return Status::Ok();
}

namespace {

// The step's model.safetensors.index.json, as its record names it: under trust by its
// signed SHA-256 first (kUntrusted), then by size and XXH3 (kCorruptHeader), then by the
// SHA-256 a signed record gives (kUntrusted: bytes made to pass the XXH3).
Status FetchIndex(Store* store, const ObjectRef& index, const Trust& trust,
                  std::vector<uint8_t>* bytes) {
  const std::string name = store->url() + "/" + index.key;
  if (trust.on() && index.sha256.empty()) {
    return Status(ErrorCode::kUntrusted, name + ": its record names it without a SHA-256");
  }
  ARC_V3_RETURN_IF_ERROR(
      UnderTrust(trust, store->Get(index.key, kMaxDocumentBytes, bytes, nullptr)));
  if (trust.on() && DigestHex(Sha256(bytes->data(), bytes->size())) != index.sha256) {
    return Status(ErrorCode::kUntrusted,
                  name + " is not the index the step names (its SHA-256 differs)");
  }
  if (bytes->size() != index.size || checkpoint::Hash(bytes->data(), bytes->size()) != index.xxh3) {
    return Status(ErrorCode::kCorruptHeader, name + ": not the index the step names");
  }
  if (!index.sha256.empty() && DigestHex(Sha256(bytes->data(), bytes->size())) != index.sha256) {
    return Status(ErrorCode::kUntrusted,
                  name + " is not the index the step names (its SHA-256 differs)");
  }
  return Status::Ok();
}

}  // namespace

// The commit of a pull: the staged files' moves into DIR, the files to remove, the state
// (with the keys it was pulled trusting).
namespace {

// Fetches the step's model.safetensors.index.json into the stage, to be moved into DIR.
Status StageIndex(Store* store, const ObjectRef& index, const Trust& trust, const Stage& stage,
                  Journal* journal, PullReport* report) {
  std::vector<uint8_t> bytes;
  Status s = FetchIndex(store, index, trust, &bytes);
  ++report->requests;
  ++report->fetched_objects;
  report->fetched_bytes += bytes.size();
  OutFile out;
  if (s.ok()) s = out.Create(stage.Path(kIndexFileName), bytes, bytes.size());
  if (s.ok()) s = out.Close(true);
  if (!s.ok()) return s;
  journal->moves.emplace_back(Stage::Relative(kIndexFileName), kIndexFileName);
  journal->state.index = true;
  return Status::Ok();
}

}  // namespace

Status BuildJournal(Store* store, const std::string& dir, const DirState* old,
                    const StagedRoute& plan, const Trust& trust, Journal* journal,
                    PullReport* report) {
  const Route& route = *plan.route;
  const Select& select = *plan.select;
  const Stage& stage = *plan.stage;
  const std::vector<std::string>& current = plan.current;
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
      if (s.ok())
        s = ExportSelection(rows_file, held, plan.fetched[plan.object_of.back()[k]].file(), select,
                            stage.Path(r.file));
      const std::string staged_rows = "rows/" + fs::path(current[k]).filename().string();
      if (s.ok()) s = RecordFile(dir, Stage::Relative(staged_rows), &shard.rows);
      if (s.ok()) s = RecordFile(dir, Stage::Relative(r.file), &shard.file);
      shard.rows.path = std::string(kStateDir) + "/rows/" + r.file;
      journal->moves.emplace_back(Stage::Relative(staged_rows), shard.rows.path);
    } else {
      shard.file.tensors = r.results;
      struct stat st;
      const std::string staged = stage.Path(r.file);
      if (::stat(staged.c_str(), &st) != 0)
        return Status(ErrorCode::kInternal, staged + " is missing");
      if (static_cast<uint64_t>(st.st_size) != r.file_size) {
        return Status(ErrorCode::kCorruptHeader,
                      "step " + std::to_string(final_hop.m.step) + " shard " + std::to_string(k) +
                          ": the record's file size is not the result's");
      }
      shard.file.size = static_cast<uint64_t>(st.st_size);
      shard.file.mtime_ns =
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
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
  if (index != nullptr)
    ARC_V3_RETURN_IF_ERROR(StageIndex(store, *index, trust, stage, journal, report));
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

}  // namespace sync
}  // namespace arc_v3
