// A regional mirror (MIRRORING.md, "Mirroring"): the committed steps of one store copied
// into another, byte for byte, in an order that keeps the copy a valid store throughout.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "src/checkpoint/container.h"
#include "src/common/clock.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"
#include "src/sync/follow.h"
#include "src/sync/route.h"
#include "src/sync/signing.h"
#include "src/sync/sync.h"

namespace arc_v3 {
namespace sync {
namespace {

namespace fs = std::filesystem;

// SRC as LoadShards reads it, keeping the bytes of every document it reads: the mirror
// writes the very bytes that were checked, without reading them twice.
class RecordingStore : public Store {
 public:
  explicit RecordingStore(Store* inner) : inner_(inner) {}
  const std::string& url() const override { return inner_->url(); }
  bool writable() const override { return false; }
  bool listable() const override { return false; }
  Status Head(const std::string& key, ObjectInfo* info) override { return inner_->Head(key, info); }
  Status GetIfChanged(const std::string& key, const std::string& etag, uint64_t max_size,
                      std::vector<uint8_t>* data, ObjectInfo* info, bool* changed) override {
    ARC_V3_RETURN_IF_ERROR(inner_->GetIfChanged(key, etag, max_size, data, info, changed));
    std::lock_guard<std::mutex> lock(mutex_);
    if (*changed) read_[key] = *data;
    return Status::Ok();
  }
  Status GetRange(const std::string& key, uint64_t offset, uint64_t size, uint8_t* out) override {
    return inner_->GetRange(key, offset, size, out);
  }
  Status Put(const std::string& key, const uint8_t*, uint64_t, PutMode) override {
    return ReadOnly(key);
  }
  Status PutFile(const std::string& key, const std::string&, PutMode) override {
    return ReadOnly(key);
  }
  Status List(const std::string& prefix, std::vector<ObjectInfo>*) override {
    return ReadOnly(prefix);
  }
  Status Delete(const std::string& key) override { return ReadOnly(key); }
  // The bytes read at `key` (empty if none were).
  const std::vector<uint8_t>& read(const std::string& key) const {
    static const std::vector<uint8_t> none;
    const auto it = read_.find(key);
    return it == read_.end() ? none : it->second;
  }

 private:
  Status ReadOnly(const std::string& key) const {
    return Status(ErrorCode::kInternal,
                  url() + "/" + key + ": a mirror never writes or lists its source");
  }
  Store* inner_;
  std::mutex mutex_;
  std::map<std::string, std::vector<uint8_t>> read_;
};

// A step found on the walk: its root as SRC stores it.
struct Planned {
  StepManifest root;
  std::vector<uint8_t> bytes;
};

// An object a record names: a container, a container's piece digests, or an index file.
struct Job {
  const ObjectRef* ref = nullptr;
  enum class Kind { kContainer, kSums, kIndex } kind = Kind::kContainer;
  std::string key;
  uint64_t size = 0;
  std::string record;  // the record's URL, for messages
};

// A file in the work directory, removed when it goes out of scope.
class TempFile {
 public:
  explicit TempFile(const std::string& dir) {
    static std::atomic<uint64_t> counter{0};
    path_ = (fs::path(dir) /
             (".arc_v3-mirror-" + std::to_string(getpid()) + "-" + std::to_string(counter++)))
                .string();
  }
  ~TempFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class Mirrorer {
 public:
  Mirrorer(Store* src, Store* dst, const MirrorOptions& o, MirrorResult* report)
      : src_(src), dst_(dst), o_(o), report_(report) {}

  Status Run(bool anchor_route) {
    ARC_V3_RETURN_IF_ERROR(LoadTrust(o_.trusted_keys, &trust_));
    ARC_V3_RETURN_IF_ERROR(WorkDirectory());
    ARC_V3_RETURN_IF_ERROR(DstLatest(&report_->from_step));
    report_->to_step = report_->from_step;
    uint64_t target = o_.step;
    if (target != kLatestStep && target > kMaxStep) {
      return Status(ErrorCode::kInvalidArgument, "there is no step " + std::to_string(target) +
                                                     " (kLatestStep asks for the newest)");
    }
    if (target == kLatestStep) {
      ARC_V3_RETURN_IF_ERROR(ReadLatest(src_, &target, nullptr));
      target = ProbeLater(src_, target);
    }
    std::vector<Planned> steps;
    std::vector<uint8_t> joined;  // DST's root where the walk met it (empty: none)
    ARC_V3_RETURN_IF_ERROR(UnderTrust(trust_, Walk(target, anchor_route, &steps, &joined)));
    // DST holds the target (a mirror stopped after its root has not moved `latest` yet).
    if (steps.empty()) {
      report_->up_to_date = true;
      ARC_V3_RETURN_IF_ERROR(MoveLatest(target));
    }
    const std::vector<uint8_t>* base = joined.empty() ? nullptr : &joined;
    for (Planned& p : steps) {
      ARC_V3_RETURN_IF_ERROR(UnderTrust(trust_, CopyStep(&p, base)));
      report_->steps.push_back(p.root.step);
      base = &p.bytes;
    }
    StepManifest t;
    if (ReadRoot(dst_, target, &t, nullptr).ok()) {
      report_->published_at = t.published_at;
      report_->committed_at = t.committed_at;
    }
    return Status::Ok();
  }

 private:
  Status WorkDirectory() {
    work_dir_ = o_.work_dir;
    if (work_dir_.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      work_dir_ = tmp != nullptr && *tmp ? tmp : "/tmp";
    }
    std::error_code ec;
    if (!fs::is_directory(work_dir_, ec)) {
      return Status(ErrorCode::kInvalidArgument,
                    work_dir_ + ": not a directory (the mirror's work directory)");
    }
    return Status::Ok();
  }

  // DST's latest, probed forward (kNoStep: none, or one that breaks a rule).
  Status DstLatest(uint64_t* held) {
    *held = kNoStep;
    const Status s = ReadLatest(dst_, held, nullptr);
    if (s.code() == ErrorCode::kNotFound || s.code() == ErrorCode::kCorruptHeader) {
      *held = kNoStep;
      return Status::Ok();
    }
    ARC_V3_RETURN_IF_ERROR(s);
    *held = ProbeLater(dst_, *held);
    return Status::Ok();
  }

  // DST's root of `step` into `bytes` (empty: DST has none); kAlreadyExists if it is not
  // SRC's.
  Status DstRoot(const Planned& p, std::vector<uint8_t>* bytes) {
    bytes->clear();
    const std::string key = RootKey(p.root.step);
    const Status s = dst_->Get(key, kMaxDocumentBytes, bytes, nullptr);
    if (s.code() == ErrorCode::kNotFound) {
      bytes->clear();
      return Status::Ok();
    }
    ARC_V3_RETURN_IF_ERROR(s);
    if (*bytes != p.bytes) {
      return Status(ErrorCode::kAlreadyExists,
                    dst_->url() + "/" + key + " is another step " + std::to_string(p.root.step) +
                        " than " + src_->url() +
                        "'s (another run's): a mirror never overwrites a root");
    }
    return Status::Ok();
  }

  // The steps to copy, ascending (MIRRORING.md, "Mirroring", "Which steps"); `joined` gets
  // DST's root where the walk met a step DST holds.
  Status Walk(uint64_t target, bool anchor_route, std::vector<Planned>* steps,
              std::vector<uint8_t>* joined) {
    const uint64_t held = report_->from_step;
    uint64_t anchor = kNoStep;
    bool below = false;  // may walk below the anchor step, towards `held`
    for (uint64_t s = target;;) {
      Planned p;
      const Status read = ReadRoot(src_, s, &p.root, &p.bytes);
      if (read.code() == ErrorCode::kNotFound && anchor != kNoStep && s < anchor) break;  // pruned
      ARC_V3_RETURN_IF_ERROR(read);
      if (anchor == kNoStep) {
        anchor = p.root.anchor_step;
        below = !anchor_route && held != kNoStep && held < anchor;
      }
      ARC_V3_RETURN_IF_ERROR(DstRoot(p, joined));
      if (!joined->empty()) break;
      const uint64_t base = p.root.base_step;
      steps->push_back(std::move(p));
      if (base == kNoStep || (s <= anchor && (!below || base < held))) break;
      s = base;
    }
    if (joined->empty()) {  // no chain from a step DST holds: start at the anchor step
      steps->erase(std::remove_if(steps->begin(), steps->end(),
                                  [&](const Planned& p) { return p.root.step < anchor; }),
                   steps->end());
    }
    std::reverse(steps->begin(), steps->end());
    return Status::Ok();
  }

  // The root's link to its base root (`base`: its bytes, null when DST has no base).
  Status CheckLink(const StepManifest& root, const std::vector<uint8_t>* base) const {
    if (base == nullptr || root.base_step == kNoStep) return Status::Ok();
    const std::string where = src_->url() + "/" + RootKey(root.step);
    if (checkpoint::Hash(base->data(), base->size()) != root.base_root_xxh3) {
      return Status(ErrorCode::kCorruptChunk, where + " names another root of step " +
                                                  std::to_string(root.base_step) +
                                                  " (base_root_xxh3) than the one it continues");
    }
    if ((trust_.on() || !root.base_root_sha256.empty()) &&
        DigestHex(Sha256(base->data(), base->size())) != root.base_root_sha256) {
      return Status(ErrorCode::kUntrusted, where + " names another root of step " +
                                               std::to_string(root.base_step) +
                                               " (base_root_sha256) than the one it continues");
    }
    return Status::Ok();
  }

  Status CopyStep(Planned* p, const std::vector<uint8_t>* base) {
    StepManifest& root = p->root;
    const std::string where = src_->url() + "/" + RootKey(root.step);
    ARC_V3_RETURN_IF_ERROR(CheckTrusted(trust_, root, where));
    ARC_V3_RETURN_IF_ERROR(CheckLink(root, base));
    RecordingStore recorded(src_);
    ReadCost cost;
    ARC_V3_RETURN_IF_ERROR(LoadShards(&recorded, &root, nullptr, nullptr, &cost, trust_.on()));
    Add(&report_->fetched_bytes, cost.bytes + p->bytes.size());
    std::vector<std::pair<std::string, std::vector<uint8_t>>> records, layouts, groups;
    ARC_V3_RETURN_IF_ERROR(ReadLayouts(root, &layouts));
    for (const ShardRecord& r : root.shards) {
      const std::string key = ShardRecordKey(root.step, r.shard, root.count, root.incarnation);
      records.emplace_back(key, recorded.read(key));
    }
    for (uint32_t g = 0; g < GroupCount(root.count); ++g) {
      const std::string key = GroupIndexKey(root.step, root.count, root.incarnation, g);
      groups.emplace_back(key, recorded.read(key));
    }
    std::vector<Job> jobs;
    ARC_V3_RETURN_IF_ERROR(ListJobs(root, &jobs));
    ARC_V3_RETURN_IF_ERROR(Parallel(jobs.size(), [&](size_t i) { return CopyObject(jobs[i]); }));
    for (const auto* docs : {&records, &layouts, &groups}) {
      ARC_V3_RETURN_IF_ERROR(
          Parallel(docs->size(), [&](size_t i) { return PutDocument((*docs)[i]); }));
    }
    ARC_V3_RETURN_IF_ERROR(PutDocument({RootKey(root.step), p->bytes}));
    for (const auto& layout : layouts) copied_layouts_.insert(layout.first);
    return MoveLatest(root.step);
  }

  // Each distinct layout the step names (the root its group layouts, the records their
  // shard layouts) and this run has not copied yet, read as a named document and checked.
  Status ReadLayouts(const StepManifest& root,
                     std::vector<std::pair<std::string, std::vector<uint8_t>>>* out) {
    std::set<uint64_t> seen;
    for (uint32_t g = 0; g < root.groups.size(); ++g) {
      const StepManifest::Group& named = root.groups[g];
      const std::string key = LayoutKey(named.layout_xxh3);
      if (copied_layouts_.count(key) != 0 || !seen.insert(named.layout_xxh3).second) continue;
      std::vector<uint8_t> bytes;
      ARC_V3_RETURN_IF_ERROR(GetNamed(src_, key, named.layout_xxh3, named.layout_size,
                                      named.layout_sha256, trust_.on(), &bytes,
                                      src_->url() + "/" + RootKey(root.step)));
      Add(&report_->fetched_bytes, bytes.size());
      Layout layout;
      ARC_V3_RETURN_IF_ERROR(ParseLayout(bytes, src_->url() + "/" + key, &layout));
      if (layout.shards.size() != std::min(kFanIn, root.count - g * kFanIn)) {
        return Status(ErrorCode::kCorruptHeader,
                      src_->url() + "/" + key + " lists " + std::to_string(layout.shards.size()) +
                          " shards, not as many as group " + std::to_string(g) + "'s");
      }
      out->emplace_back(key, std::move(bytes));
    }
    std::vector<const ShardRecord*> shards;
    for (const ShardRecord& r : root.shards) {
      if (copied_layouts_.count(LayoutKey(r.layout_xxh3)) == 0 &&
          seen.insert(r.layout_xxh3).second) {
        shards.push_back(&r);
      }
    }
    std::vector<std::vector<uint8_t>> read(shards.size());
    ARC_V3_RETURN_IF_ERROR(Parallel(
        shards.size(), [&](size_t i) { return ReadShardLayout(root, *shards[i], &read[i]); }));
    for (size_t i = 0; i < shards.size(); ++i)
      out->emplace_back(LayoutKey(shards[i]->layout_xxh3), std::move(read[i]));
    return Status::Ok();
  }

  // A record's shard layout: one shard, the record's file.
  Status ReadShardLayout(const StepManifest& root, const ShardRecord& r,
                         std::vector<uint8_t>* bytes) {
    const std::string key = LayoutKey(r.layout_xxh3), where = src_->url() + "/" + key;
    ARC_V3_RETURN_IF_ERROR(GetNamed(
        src_, key, r.layout_xxh3, r.layout_size, r.layout_sha256, trust_.on(), bytes,
        src_->url() + "/" + ShardRecordKey(root.step, r.shard, root.count, r.incarnation)));
    Add(&report_->fetched_bytes, bytes->size());
    Layout layout;
    ARC_V3_RETURN_IF_ERROR(ParseLayout(*bytes, where, &layout));
    if (layout.shards.size() != 1 || layout.shards[0].file != r.file) {
      return Status(ErrorCode::kCorruptHeader,
                    where + " is not the layout of one shard with its record's file");
    }
    return Status::Ok();
  }

  // The objects the step's records name; under trust, each must be named by its SHA-256.
  Status ListJobs(const StepManifest& root, std::vector<Job>* jobs) const {
    for (const ShardRecord& r : root.shards) {
      const std::string record =
          src_->url() + "/" + ShardRecordKey(root.step, r.shard, root.count, r.incarnation);
      for (const ObjectRef* ref : {&r.delta, &r.anchor, &r.index}) {
        if (!ref->present()) continue;
        const bool index = ref == &r.index;
        if (trust_.on() && (ref->sha256.empty() ||
                            (!index && (ref->head_sha256.empty() || ref->sums_sha256.empty())))) {
          return Status(ErrorCode::kUntrusted,
                        record + " names " + ref->key + " without its SHA-256");
        }
        jobs->push_back(
            {ref, index ? Job::Kind::kIndex : Job::Kind::kContainer, ref->key, ref->size, record});
        if (!index && !ref->sums_sha256.empty()) {
          jobs->push_back({ref, Job::Kind::kSums, SumsKey(ref->key), ref->sums_size, record});
        }
      }
    }
    return Status::Ok();
  }

  // Runs copy(i) for every i < n, o_.parallel at a time: the first error one gives.
  template <class Copy>
  Status Parallel(size_t n, const Copy& copy) {
    Status first;
    std::mutex mutex;
    const Status thrown =
        TryParallelFor(n, WorkerCount(std::max(1, o_.parallel), n), [&](size_t i, size_t) {
          {
            std::lock_guard<std::mutex> lock(mutex);
            if (!first.ok()) return;
          }
          const Status s = copy(i);
          std::lock_guard<std::mutex> lock(mutex);
          if (!s.ok() && first.ok()) first = s;
        });
    return thrown.ok() ? first : thrown;
  }

  void Add(uint64_t* counter, uint64_t value) {
    std::lock_guard<std::mutex> lock(mutex_);
    *counter += value;
  }
  void Counted(bool copied, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    (copied ? report_->copied_objects : report_->skipped_objects) += 1;
    (copied ? report_->copied_bytes : report_->skipped_bytes) += bytes;
  }

  // Whether DST holds `key` already: with `size` bytes (true), absent (false), else
  // kAlreadyExists.
  Status DstHolds(const Job& j, bool* held) {
    ObjectInfo info;
    const Status s = dst_->Head(j.key, &info);
    *held = s.ok();
    if (s.code() == ErrorCode::kNotFound) return Status::Ok();
    ARC_V3_RETURN_IF_ERROR(s);
    if (info.size != j.size) {
      return Status(ErrorCode::kAlreadyExists,
                    dst_->url() + "/" + j.key + " holds " + std::to_string(info.size) +
                        " bytes, not the " + std::to_string(j.size) + " " + j.record + " names");
    }
    return Status::Ok();
  }

  // An object through a temporary file: skipped if DST holds it, else fetched, checked
  // against its record and written create-only.
  Status CopyObject(const Job& j) {
    bool held = false;
    ARC_V3_RETURN_IF_ERROR(DstHolds(j, &held));
    if (held) {
      Counted(false, j.size);
      return Status::Ok();
    }
    TempFile file(work_dir_);
    Status s = src_->GetToFile(j.key, file.path(), j.size, ToStoreOptions(o_.store));
    if (s.code() == ErrorCode::kNotFound)
      s = Status(s.code(), s.message() + " (named by " + j.record + ")");
    ARC_V3_RETURN_IF_ERROR(s);
    Add(&report_->fetched_bytes, j.size);
    ARC_V3_RETURN_IF_ERROR(CheckObject(j, file.path()));
    s = dst_->PutFile(j.key, file.path(), PutMode::kCreateOnly);
    if (s.code() ==
        ErrorCode::kAlreadyExists) {  // a racing or retried write: the same size is the same object
      ARC_V3_RETURN_IF_ERROR(DstHolds(j, &held));
      if (held) {
        Counted(false, j.size);
        return Status::Ok();
      }
    }
    ARC_V3_RETURN_IF_ERROR(s);
    Counted(true, j.size);
    return Status::Ok();
  }

  // The downloaded bytes against what the record names (MIRRORING.md, "Mirroring", step 2).
  Status CheckObject(const Job& j, const std::string& path) const {
    std::unique_ptr<checkpoint::MappedFile> file;
    ARC_V3_RETURN_IF_ERROR(checkpoint::MappedFile::Open(path, &file));
    const std::string name = src_->url() + "/" + j.key;
    const ObjectRef& ref = *j.ref;
    const uint8_t* data = file->data();
    const uint64_t size = file->size();
    if (j.kind == Job::Kind::kSums) {  // named by its SHA-256 only
      if (size != ref.sums_size || DigestHex(Sha256(data, size)) != ref.sums_sha256) {
        return Status(ErrorCode::kUntrusted,
                      name + " is not the piece digests " + j.record + " names");
      }
      return Status::Ok();
    }
    // Trusting, the SHA-256 decides before the XXH3.
    const bool sha_differs = !ref.sha256.empty() && DigestHex(Sha256(data, size)) != ref.sha256;
    if (trust_.on() && sha_differs) {
      return Status(ErrorCode::kUntrusted,
                    name + " differs from the SHA-256 " + j.record + " names");
    }
    if (size != ref.size || checkpoint::Hash(data, size) != ref.xxh3) {
      return Status(size < ref.size ? ErrorCode::kTruncated : ErrorCode::kCorruptChunk,
                    name + " does not match " + j.record + " (corrupt or truncated)");
    }
    if (j.kind == Job::Kind::kContainer) {
      if (ref.head_size > size || checkpoint::Hash(data, ref.head_size) != ref.head_xxh3) {
        return Status(ErrorCode::kCorruptChunk, name + ": its head does not match " + j.record);
      }
      if (!ref.head_sha256.empty() && DigestHex(Sha256(data, ref.head_size)) != ref.head_sha256) {
        return Status(ErrorCode::kUntrusted,
                      name + ": its head differs from the SHA-256 " + j.record + " names");
      }
    }
    if (sha_differs)
      return Status(ErrorCode::kUntrusted,
                    name + " differs from the SHA-256 " + j.record + " names");
    return Status::Ok();
  }

  // A document written create-only; one DST holds already must be the same bytes.
  Status PutDocument(const std::pair<std::string, std::vector<uint8_t>>& doc) {
    const std::string& key = doc.first;
    const std::vector<uint8_t>& bytes = doc.second;
    if (bytes.empty())
      return Status(ErrorCode::kInternal, src_->url() + "/" + key + " was not read");
    const Status s = dst_->Put(key, bytes.data(), bytes.size(), PutMode::kCreateOnly);
    if (s.code() == ErrorCode::kAlreadyExists) {
      std::vector<uint8_t> theirs;
      ARC_V3_RETURN_IF_ERROR(dst_->Get(key, kMaxDocumentBytes, &theirs, nullptr));
      if (theirs != bytes) {
        return Status(ErrorCode::kAlreadyExists, dst_->url() + "/" + key +
                                                     " holds another document than " + src_->url() +
                                                     "'s (another run's)");
      }
      Counted(false, bytes.size());
      return Status::Ok();
    }
    ARC_V3_RETURN_IF_ERROR(s);
    Counted(true, bytes.size());
    return Status::Ok();
  }

  // DST's latest moved forward to `step` (never back).
  Status MoveLatest(uint64_t step) {
    uint64_t current = kNoStep;
    const Status s = ReadLatest(dst_, &current, nullptr);
    const bool replace = s.code() == ErrorCode::kNotFound ||
                         s.code() == ErrorCode::kCorruptHeader || (s.ok() && current < step);
    if (!s.ok() && !replace) return s;
    if (replace) {
      const std::string latest = LatestJson(step);
      ARC_V3_RETURN_IF_ERROR(dst_->Put(kLatestKey, reinterpret_cast<const uint8_t*>(latest.data()),
                                       latest.size(), PutMode::kOverwrite));
      current = step;
    }
    report_->to_step = current;
    return Status::Ok();
  }

  Store* src_;
  Store* dst_;
  const MirrorOptions& o_;
  MirrorResult* report_;
  Trust trust_;
  std::string work_dir_;
  std::set<std::string> copied_layouts_;  // layout keys this run wrote to DST (or found there)
  std::mutex mutex_;
};

}  // namespace

Status Mirror(Store* src, Store* dst, const MirrorOptions& options, bool anchor_route,
              MirrorResult* report) {
  const auto start = std::chrono::steady_clock::now();
  *report = MirrorResult();
  if (!dst->writable()) {
    return Status(ErrorCode::kInvalidArgument,
                  dst->url() +
                      " cannot be written: a mirror's copy must be a store "
                      "it writes (s3:// or local)");
  }
  Mirrorer mirrorer(src, dst, options, report);
  const Status s = mirrorer.Run(anchor_route);
  report->total_seconds = SecondsSince(start);
  return s;
}

Status FollowMirror(
    const std::string& src_url, const std::string& dst_url, const MirrorOptions& options,
    const FollowOptions& follow,
    const std::function<bool(const FollowEvent& event, const MirrorResult* mirrored)>& on_event) {
  std::unique_ptr<Store> dst, src;
  ARC_V3_RETURN_IF_ERROR(OpenStore(dst_url, ToStoreOptions(options.store, /*create=*/true), &dst));
  uint64_t held = kNoStep;
  const Status latest = ReadLatest(dst.get(), &held, nullptr);
  if (latest.code() == ErrorCode::kUnsupportedVersion) return latest;
  held = latest.ok() ? ProbeLater(dst.get(), held) : kNoStep;
  const auto open = [&](Store** out) {
    if (src == nullptr)
      ARC_V3_RETURN_IF_ERROR(OpenStore(src_url, ToStoreOptions(options.store), &src));
    *out = src.get();
    return Status::Ok();
  };
  const auto mirror = [&](Store* from, uint64_t step, bool anchor, FollowEvent* event, bool* stop) {
    MirrorOptions o = options;
    o.step = step;
    MirrorResult report;
    ARC_V3_RETURN_IF_ERROR(Mirror(from, dst.get(), o, anchor, &report));
    event->step = report.to_step;
    event->lag_seconds = report.published_at > 0 ? UnixSeconds() - report.published_at : 0;
    *stop = on_event && !on_event(*event, &report);
    return Status::Ok();
  };
  const auto note = [&](const FollowEvent& event) { return !on_event || on_event(event, nullptr); };
  return FollowLatest(open, held, !options.trusted_keys.empty(), follow, mirror, note);
}

}  // namespace sync
}  // namespace arc_v3
