// Publishing one shard's file for a step (sync.h, Publish): its containers built and
// checked against the base record, uploaded, then its record; the commit that follows is
// commit.cc's.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "src/common/clock.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"
#include "src/checkpoint/safetensors.h"
#include "src/checkpoint/strict_json.h"
#include "src/sync/commit.h"
#include "src/sync/sync.h"

namespace arc_v3 {
namespace sync {
namespace {

namespace fs = std::filesystem;
using checkpoint::Reader;
using checkpoint::TensorEntry;

// A private directory for the containers of one publish, removed with everything in it.
class WorkDir {
 public:
  ~WorkDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  Status Create(std::string parent) {
    if (parent.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      parent = tmp != nullptr && *tmp ? tmp : "/tmp";
    }
    std::string pattern = (fs::path(parent) / "arc_v3-publish-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      return Status(ErrorCode::kInvalidArgument, parent + ": cannot create a work directory");
    }
    path_ = pattern;
    return Status::Ok();
  }
  std::string File(const char* name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

// A container written by Diff (to a file, or kept in memory), with what its record says of it.
struct Built {
  std::string path;  // "" when in memory
  Reader reader;
  ObjectRef ref;
  std::string sums;  // signed records: its piece digests (SumsKey)
};

Status Describe(std::unique_ptr<checkpoint::ByteSource> source, uint64_t step, uint32_t shard,
                uint32_t count, const char* kind, bool digests, Built* built) {
  const uint8_t* all = nullptr;
  std::vector<uint8_t> scratch;
  ARC_V3_RETURN_IF_ERROR(source->Read(0, source->size(), &scratch, &all));
  const uint64_t xxh3 = checkpoint::Hash(all, source->size());
  const uint64_t size = source->size();
  Status s = Reader::Open(std::move(source), &built->reader);
  ARC_V3_RETURN_IF_ERROR_IN(std::string(kind) + " container", s);
  if (built->reader.manifest().directory || built->reader.manifest().files.size() != 1) {
    return Status(ErrorCode::kInternal,
                  std::string(kind) + " container: a shard's container holds one file");
  }
  const uint64_t head = built->reader.data_start();
  built->ref = ObjectRef();
  built->ref.key = PieceKey(step, shard, count, kind, xxh3);
  built->ref.size = size;
  built->ref.xxh3 = xxh3;
  built->ref.head_size = head;
  built->ref.head_xxh3 = checkpoint::Hash(all, head);
  if (digests) {
    built->ref.sha256 = DigestHex(Sha256(all, size));
    built->ref.head_sha256 = DigestHex(Sha256(all, head));
    built->sums.clear();
    for (const auto& range : StoredRanges(built->reader.manifest())) {
      const Digest d = Sha256(all + head + range.first, range.second);
      built->sums.append(reinterpret_cast<const char*>(d.data()), d.size());
    }
    built->ref.sums_size = built->sums.size();
    built->ref.sums_sha256 = DigestHex(Sha256(built->sums));
  }
  return Status::Ok();
}

// The result checksum of every tensor of the published file, in file order, from the
// container (grouped tensors, which a group checks together, are hashed from `next`).
Status ResultChecksums(const Reader& reader, const checkpoint::Checkpoint& next,
                       std::vector<TensorChecksum>* sums) {
  for (const TensorEntry& t : reader.manifest().files[0].tensors) {
    uint64_t xxh3 = t.target_xxh3;
    if (t.grouped()) {
      const checkpoint::TensorView* view = next.Find(t.name);
      if (view == nullptr || view->bytes != t.bytes()) {
        return Status(ErrorCode::kInternal, "tensor '" + t.name + "' changed while publishing");
      }
      xxh3 = checkpoint::TensorChecksum(t, view->data);
    }
    sums->push_back({t.name, xxh3});
  }
  return Status::Ok();
}

// Checks that `prev` is the file this shard published for the base step: its tensor-list
// checksum, its tensors' result checksums hashed from its bytes, is the base record's.
Status CheckBase(const checkpoint::Checkpoint& prev, const ShardRecord& base) {
  std::vector<checkpoint::TensorView> views = prev.files()[0].tensors;
  std::stable_sort(views.begin(), views.end(),
                   [](const checkpoint::TensorView& a, const checkpoint::TensorView& b) {
                     return a.offset != b.offset ? a.offset < b.offset : a.name < b.name;
                   });
  std::vector<TensorChecksum> sums;
  for (const checkpoint::TensorView& v : views) {
    TensorEntry t;
    t.dtype = v.dtype;
    t.shape = v.shape;
    sums.push_back({v.name, checkpoint::TensorChecksum(t, v.data)});
  }
  if (TensorListChecksum(sums) == base.tensors_xxh3) return Status::Ok();
  return Status(ErrorCode::kChecksumMismatch,
                prev.path() + " is not the file shard " + std::to_string(base.shard) +
                    " published for step " + std::to_string(base.step) +
                    ": its tensors (names, order or contents) differ");
}

// The record's tensors_xxh3 and shard layout (its file and tensor names; `json`, the
// layout's bytes) from the result checksums.
void DescribeTensors(const std::vector<TensorChecksum>& sums, bool signing, ShardRecord* r,
                     std::string* json) {
  r->tensors_xxh3 = TensorListChecksum(sums);
  Layout layout;
  layout.shards.push_back({r->file, {}});
  for (const TensorChecksum& t : sums) layout.shards[0].tensors.push_back(t.name);
  *json = LayoutJson(layout);
  r->layout_xxh3 = checkpoint::Hash(json->data(), json->size());
  r->layout_size = json->size();
  if (signing) r->layout_sha256 = DigestHex(Sha256(*json));
}

// Reads the index file a shard carries: valid JSON with a "weight_map" object, at most
// kMaxDocumentBytes.
Status ReadIndex(const std::string& path, std::vector<uint8_t>* bytes) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return Status(ErrorCode::kInvalidArgument, path + ": cannot read: " + ec.message());
  if (size > kMaxDocumentBytes) {
    return Status(ErrorCode::kInvalidArgument,
                  path + ": larger than " + std::to_string(kMaxDocumentBytes) + " bytes");
  }
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Status(ErrorCode::kInvalidArgument, path + ": cannot open");
  bytes->resize(size);
  const size_t got = size ? std::fread(bytes->data(), 1, size, f) : 0;
  std::fclose(f);
  if (got != size) return Status(ErrorCode::kInvalidArgument, path + ": cannot read");
  nlohmann::json doc;
  try {
    const char* text = reinterpret_cast<const char*>(bytes->data());
    doc = strict_json::Parse(text, text + bytes->size(), path);
  } catch (const strict_json::Error& e) {
    return Status(ErrorCode::kInvalidArgument, e.what + " (not one reading)");
  } catch (const std::exception&) {
    doc = nullptr;
  }
  if (!doc.is_object() || !doc.contains("weight_map") || !doc["weight_map"].is_object()) {
    return Status(ErrorCode::kInvalidArgument,
                  path + ": not a safetensors index (JSON with a \"weight_map\" object)");
  }
  return Status::Ok();
}

// The model.safetensors.index.json beside `next` if its weight_map names next's file, else "".
std::string IndexBeside(const std::string& next) {
  const fs::path candidate = fs::path(next).parent_path() / kIndexFileName;
  std::vector<uint8_t> bytes;
  std::error_code ec;
  if (!fs::is_regular_file(candidate, ec) || !ReadIndex(candidate.string(), &bytes).ok()) return "";
  const std::string file = fs::path(next).filename().string();
  const nlohmann::json doc = nlohmann::json::parse(bytes.begin(), bytes.end());
  for (const auto& entry : doc["weight_map"].items()) {
    if (entry.value().is_string() && entry.value().get<std::string>() == file)
      return candidate.string();
  }
  return "";
}

Status Upload(Store* store, const Built& built) {
  Status s;
  if (built.path.empty()) {
    const auto& bytes = static_cast<const checkpoint::MemorySource&>(built.reader.source()).bytes();
    s = store->Put(built.ref.key, bytes.data(), bytes.size(), PutMode::kCreateOnly);
  } else {
    s = store->PutFile(built.ref.key, built.path, PutMode::kCreateOnly);
  }
  if ((s.ok() || s.code() == ErrorCode::kAlreadyExists) && !built.sums.empty()) {
    // Derived from the object, under its key: one already there is this one (an unsigned
    // publish of the same object wrote none).
    Status sums =
        store->Put(SumsKey(built.ref.key), reinterpret_cast<const uint8_t*>(built.sums.data()),
                   built.sums.size(), PutMode::kCreateOnly);
    if (!sums.ok() && sums.code() != ErrorCode::kAlreadyExists) return sums;
  }
  if (s.code() != ErrorCode::kAlreadyExists) return s;
  // Named by its XXH3: an object already there is this one, unless it was cut short.
  ObjectInfo info;
  ARC_V3_RETURN_IF_ERROR(store->Head(built.ref.key, &info));
  if (info.size != built.ref.size) {
    return Status(ErrorCode::kAlreadyExists, store->url() + "/" + built.ref.key + " exists with " +
                                                 std::to_string(info.size) + " bytes, not " +
                                                 std::to_string(built.ref.size));
  }
  return Status::Ok();
}

// Writes the record once; a record already there (a racing retry of this same publish)
// must say the same.
Status PutRecord(Store* store, const ShardRecord& record, const std::string& json) {
  const std::string key =
      ShardRecordKey(record.step, record.shard, record.count, record.incarnation);
  Status s = store->Put(key, reinterpret_cast<const uint8_t*>(json.data()), json.size(),
                        PutMode::kCreateOnly);
  if (s.code() != ErrorCode::kAlreadyExists) return s;
  std::vector<uint8_t> bytes;
  ARC_V3_RETURN_IF_ERROR(store->Get(key, kMaxDocumentBytes, &bytes, nullptr));
  ShardRecord existing;
  ARC_V3_RETURN_IF_ERROR(ParseRecord(bytes, store->url() + "/" + key, &existing));
  const std::string difference = FileDifference(existing, record);
  return difference.empty() ? Status::Ok() : Conflict(store, record, difference, false);
}

// One publish in the making: the shard's record, its base's, and what goes up with it.
struct Publication {
  Signer signer;
  ShardRecord r;
  ShardRecord base;            // a delta's: the record of the base step's shard
  WorkDir work;                // the containers' files (none in memory)
  std::vector<Built> built;    // the delta's, then the anchor's
  std::vector<uint8_t> index;  // the model.safetensors.index.json it carries
  std::string layout_json;     // the shard layout the record names
  std::string record_json;
};

// The record of publishing `next` onto `prev` (none: an anchor) as `o` says, before its
// containers are built.
Status NewRecord(const PublishOptions& o, const checkpoint::Checkpoint& prev,
                 const checkpoint::Checkpoint& next, ShardRecord* r) {
  if (o.count == 0 || o.count > kMaxShards || o.shard >= o.count) {
    return Status(ErrorCode::kInvalidArgument,
                  "shard " + std::to_string(o.shard) + " of " + std::to_string(o.count) +
                      ": a shard is below its count, at most " + std::to_string(kMaxShards));
  }
  if (o.step > kMaxStep) {
    return Status(
        ErrorCode::kInvalidArgument,
        "step " + std::to_string(o.step) + " is above the last step, " + std::to_string(kMaxStep));
  }
  if (next.directory() || next.files().size() != 1) {
    return Status(ErrorCode::kInvalidArgument,
                  next.path() + ": a shard publishes one .safetensors file");
  }
  uint64_t base_step = kNoStep;
  if (!prev.empty()) {
    base_step = o.base_step != kNoStep ? o.base_step : o.step - 1;
    if (o.step == 0 || base_step >= o.step) {
      return Status(ErrorCode::kInvalidArgument,
                    "the base step must come before step " + std::to_string(o.step));
    }
  }
  r->step = o.step;
  r->base_step = base_step;
  r->shard = o.shard;
  r->count = o.count;
  r->file = next.files()[0].name;
  r->file_size = next.files()[0].size;
  r->published_at = UnixSeconds();
  if (r->file.empty() || r->file[0] == '.' || r->file.size() > 255 ||
      r->file.find('/') != std::string::npos) {
    return Status(ErrorCode::kInvalidArgument,
                  next.path() +
                      ": a published file's name must not start with '.' "
                      "and must have at most 255 bytes");
  }
  if (!ValidIncarnation(o.incarnation)) {
    return Status(
        ErrorCode::kInvalidArgument,
        "incarnation '" + o.incarnation + "' is not 1 to 64 of [A-Za-z0-9._-] (nor . or ..)");
  }
  r->incarnation = o.incarnation;
  return Status::Ok();
}

// The base of a delta: the record of this shard this incarnation published for the base
// step (committed or not; a committer checks that the base it links is that incarnation's),
// else the record of the committed base step, whichever incarnation committed it.
Status ReadBase(Store* store, const PublishOptions& o, uint64_t base_step, ShardRecord* base) {
  const std::string key = ShardRecordKey(base_step, o.shard, o.count, o.incarnation);
  std::vector<uint8_t> bytes;
  Status s = store->Get(key, kMaxDocumentBytes, &bytes, nullptr);
  if (s.ok()) return ParseRecord(bytes, store->url() + "/" + key, base);
  if (s.code() != ErrorCode::kNotFound) return s;
  StepManifest base_root;
  s = ReadRoot(store, base_step, &base_root, nullptr);
  if (s.code() == ErrorCode::kNotFound) {
    return Status(
        ErrorCode::kNotFound,
        "step " + std::to_string(base_step) + " is not committed in " + store->url() +
            " and shard " + std::to_string(o.shard) + " of " + std::to_string(o.count) +
            " (incarnation " + o.incarnation +
            ") never published it: publish an anchor, or a delta from a committed base step");
  }
  ARC_V3_RETURN_IF_ERROR(s);
  if (base_root.count != o.count) {
    return Status(ErrorCode::kInvalidArgument,
                  "step " + std::to_string(base_step) + " was committed with " +
                      std::to_string(base_root.count) + " shards, not " + std::to_string(o.count) +
                      " (a new shard count starts with an anchor)");
  }
  return CommittedRecord(store, base_root, o.shard, base);
}

// Builds the containers (the delta onto `prev`, if any; the anchor, when due), describes
// them in the record, and checks them against `next` and the base; reads the index.
Status Encode(const PublishOptions& o, const checkpoint::Checkpoint& prev,
              const checkpoint::Checkpoint& next, bool in_memory, Publication* p,
              PublishReport* report) {
  checkpoint::RunOptions run(o.checkpoint);
  run.sync = false;      // scratch files, uploaded and deleted
  run.row_order = true;  // a region's row slice reads few ranges of each object
  const bool anchor = prev.empty() || (o.anchor_every > 0 && o.step % o.anchor_every == 0);
  const checkpoint::Checkpoint none;
  for (const char* kind : {"delta", "anchor"}) {
    const bool delta = kind[0] == 'd';
    if (delta ? prev.empty() : !anchor) continue;
    const auto t = std::chrono::steady_clock::now();
    checkpoint::RunReport diff;
    std::unique_ptr<checkpoint::ByteSource> source;
    p->built.emplace_back();
    Built& built = p->built.back();
    Status s;
    if (in_memory) {
      std::vector<uint8_t> bytes;
      s = checkpoint::Diff(delta ? prev : none, next, run, &bytes, &diff);
      source = std::make_unique<checkpoint::MemorySource>(std::move(bytes));
    } else {
      built.path = p->work.File(delta ? "delta.a3d" : "anchor.a3d");
      s = checkpoint::Diff(delta ? prev : none, next, built.path, run, &diff);
      std::unique_ptr<checkpoint::MappedFile> file;
      if (s.ok()) s = checkpoint::MappedFile::Open(built.path, &file);
      source = std::move(file);
    }
    ARC_V3_RETURN_IF_ERROR(s);
    report->encode_seconds += SecondsSince(t);
    const auto h = std::chrono::steady_clock::now();
    ARC_V3_RETURN_IF_ERROR(Describe(std::move(source), o.step, o.shard, o.count, kind,
                                    p->signer.get() != nullptr, &built));
    report->hash_seconds += SecondsSince(h);
    (delta ? p->r.delta : p->r.anchor) = built.ref;
  }
  const auto h = std::chrono::steady_clock::now();
  std::vector<TensorChecksum> sums;
  ARC_V3_RETURN_IF_ERROR(ResultChecksums(p->built[0].reader, next, &sums));
  DescribeTensors(sums, p->signer.get() != nullptr, &p->r, &p->layout_json);
  if (p->r.delta.present()) ARC_V3_RETURN_IF_ERROR(CheckBase(prev, p->base));
  if (!o.no_index && !o.index.empty()) {
    ARC_V3_RETURN_IF_ERROR(ReadIndex(o.index, &p->index));
    const uint64_t xxh3 = checkpoint::Hash(p->index.data(), p->index.size());
    p->r.index.key = IndexKey(p->r.step, p->r.shard, p->r.count, xxh3);
    p->r.index.size = p->index.size();
    p->r.index.xxh3 = xxh3;
    if (p->signer.get() != nullptr)
      p->r.index.sha256 = DigestHex(Sha256(p->index.data(), p->index.size()));
  }
  report->hash_seconds += SecondsSince(h);
  return Status::Ok();
}

// Published before by this incarnation: the same contents make this a no-op (`published`,
// keeping the record published first), other contents a conflict, found before any upload.
// (Another incarnation's committed step is found when the root is written: see CommitTop.)
Status FindPublished(Store* store, Publication* p, bool* published, PublishReport* report) {
  ShardRecord& r = p->r;
  const std::string record_key = ShardRecordKey(r.step, r.shard, r.count, r.incarnation);
  std::vector<uint8_t> existing_bytes;
  const Status s = store->Get(record_key, kMaxDocumentBytes, &existing_bytes, nullptr);
  if (s.code() == ErrorCode::kNotFound) return Status::Ok();
  ARC_V3_RETURN_IF_ERROR(s);
  ShardRecord existing;
  ARC_V3_RETURN_IF_ERROR(ParseRecord(existing_bytes, store->url() + "/" + record_key, &existing));
  const std::string difference = FileDifference(existing, r);
  if (!difference.empty()) return Conflict(store, r, difference, false);
  // The same file again: a no-op that keeps what was published first.
  *published = true;
  report->already_published = true;
  if (existing.anchor.present() != r.anchor.present()) {
    report->note = existing.anchor.present() ? "published first with an anchor, kept"
                                             : "published first without an anchor, kept";
  }
  r = existing;
  return Status::Ok();
}

// Uploads the containers, then the index and the record.
Status UploadAll(Store* store, const Publication& p, PublishReport* report) {
  std::vector<Status> uploads(p.built.size());
  ParallelFor(p.built.size(), p.built.size(),
              [&](size_t i, size_t) { uploads[i] = Upload(store, p.built[i]); });
  for (const Status& up : uploads) ARC_V3_RETURN_IF_ERROR(up);
  for (const Built& b : p.built) {
    report->uploaded_bytes += b.ref.size + b.sums.size();
    report->uploaded_objects += b.sums.empty() ? 0 : 1;
  }
  if (p.r.index.present()) {  // named by its XXH3: one already there is this one
    const Status s =
        store->Put(p.r.index.key, p.index.data(), p.index.size(), PutMode::kCreateOnly);
    if (!s.ok() && s.code() != ErrorCode::kAlreadyExists) return s;
    report->uploaded_bytes += p.index.size();
    ++report->uploaded_objects;
  }
  // The shard layout, named by its XXH3 (one already there is this one); not again where
  // the base record names it (layouts are never pruned).
  if (p.base.layout_xxh3 != p.r.layout_xxh3 || p.base.layout_size != p.r.layout_size) {
    const Status s = store->Put(LayoutKey(p.r.layout_xxh3),
                                reinterpret_cast<const uint8_t*>(p.layout_json.data()),
                                p.layout_json.size(), PutMode::kCreateOnly);
    if (!s.ok() && s.code() != ErrorCode::kAlreadyExists) return s;
    report->uploaded_bytes += p.layout_json.size();
    ++report->uploaded_objects;
  }
  ARC_V3_RETURN_IF_ERROR(PutRecord(store, p.r, p.record_json));
  report->uploaded_bytes += p.record_json.size();
  report->uploaded_objects += p.built.size() + 1;
  return Status::Ok();
}

StoredObject Stored(const ObjectRef& ref) {
  StoredObject o;
  if (ref.present()) {
    o.key = ref.key;
    o.bytes = ref.size;
  }
  return o;
}

// The public result's view of report->record.
void Describe(PublishReport* report) {
  const ShardRecord& r = report->record;
  report->step = r.step;
  report->shard = r.shard;
  report->count = r.count;
  report->file = r.file;
  report->file_bytes = r.file_size;
  report->delta = Stored(r.delta);
  report->anchor = Stored(r.anchor);
  report->index = Stored(r.index);
}

}  // namespace

Status PublishCheckpoints(Store* store, const PublishOptions& o, const checkpoint::Checkpoint& prev,
                          const checkpoint::Checkpoint& next, bool in_memory,
                          PublishReport* report) {
  const auto start = std::chrono::steady_clock::now();
  *report = PublishReport();
  if (!store->writable())
    return Status(ErrorCode::kInvalidArgument, store->url() + " is read-only");
  Publication p;
  ARC_V3_RETURN_IF_ERROR(NewRecord(o, prev, next, &p.r));
  ARC_V3_RETURN_IF_ERROR(LoadSigner(o.sign_key, o.trusted_keys, &p.signer));
  if (p.r.base_step != kNoStep) {
    ARC_V3_RETURN_IF_ERROR(ReadBase(store, o, p.r.base_step, &p.base));
    p.r.base_incarnation = p.base.incarnation;
  }
  if (!in_memory) ARC_V3_RETURN_IF_ERROR(p.work.Create(o.work_dir));
  ARC_V3_RETURN_IF_ERROR(Encode(o, prev, next, in_memory, &p, report));

  // What pullers will check, checked before anything is uploaded.
  p.record_json = RecordJson(p.r, p.signer.get());
  ShardRecord check;
  const Status s = ParseRecord(std::vector<uint8_t>(p.record_json.begin(), p.record_json.end()),
                               "the record", &check);
  if (!s.ok()) return Status(ErrorCode::kInvalidArgument, "cannot publish: " + s.message());
  bool published = false;
  ARC_V3_RETURN_IF_ERROR(FindPublished(store, &p, &published, report));
  const auto u = std::chrono::steady_clock::now();
  if (!published) ARC_V3_RETURN_IF_ERROR(UploadAll(store, p, report));
  report->upload_seconds = SecondsSince(u);

  const auto c = std::chrono::steady_clock::now();
  CommitResult commit;
  ARC_V3_RETURN_IF_ERROR(
      CommitFrom(store, p.r.step, p.r.count, p.r.incarnation, &p.r, p.signer, &commit));
  report->commit_seconds = SecondsSince(c);
  report->committed = commit.committed;
  report->pending = commit.pending;
  report->record = std::move(p.r);
  Describe(report);
  report->total_seconds = SecondsSince(start);
  return Status::Ok();
}

std::string DefaultIncarnation() {
  const char* name = std::getenv("ARC_V3_INCARNATION");
  if (name != nullptr && *name) return name;
  const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (restarts != nullptr && *restarts) return std::string("restart-") + restarts;
  return kDefaultIncarnation;
}

Status CheckPublishKeys(const std::string& sign_key, const std::vector<std::string>& trusted_keys) {
  Signer signer;
  return LoadSigner(sign_key, trusted_keys, &signer);
}

Status Publish(Store* store, const PublishOptions& o, PublishReport* report) {
  checkpoint::Checkpoint prev, next;
  ARC_V3_RETURN_IF_ERROR(checkpoint::Checkpoint::Open(o.prev, &prev));
  ARC_V3_RETURN_IF_ERROR(checkpoint::Checkpoint::Open(o.next, &next));
  if (o.index.empty() && !o.no_index) {
    PublishOptions with_index = o;
    with_index.index = IndexBeside(o.next);
    return PublishCheckpoints(store, with_index, prev, next, false, report);
  }
  return PublishCheckpoints(store, o, prev, next, false, report);
}

}  // namespace sync
}  // namespace arc_v3
