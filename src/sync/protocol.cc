// The sync protocol's keys and documents (see protocol.h and src/FORMAT.md, Part 3).
#include "src/sync/protocol.h"

#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "src/checkpoint/container.h"
#include "src/checkpoint/strict_json.h"

namespace arc_v3 {
namespace sync {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

using strict_json::CheckFields;
using strict_json::Fail;
using strict_json::Field;
using strict_json::Hex;
using strict_json::Str;
using strict_json::U64;

uint64_t Step(const Json& value, const std::string& where) {
  const uint64_t step = U64(value, where);
  if (step > kMaxStep) Fail(where + " is above " + std::to_string(kMaxStep));
  return step;
}
uint64_t OptionalStep(const Json& value, const std::string& where) {
  return value.is_null() ? kNoStep : Step(value, where);
}
double Time(const Json& value, const std::string& where) {
  if (!value.is_number() || value.get<double>() < 0) Fail(where + " is not a time");
  return value.get<double>();
}
bool PlainFileName(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos &&
         name[0] != '.';
}

void CheckEnvelope(const Json& doc, const char* kind, const std::string& where) {
  if (!doc.is_object()) Fail(where + " is not an object");
  if (Str(Field(doc, "format", where), where + ".format") != kProtocolName) {
    Fail(where + " is not an " + std::string(kProtocolName) + " document");
  }
  const uint64_t version = U64(Field(doc, "version", where), where + ".version");
  if (version != kProtocolVersion) {
    throw Status(ErrorCode::kUnsupportedVersion,
                 where + ": protocol version " + std::to_string(version) + " (this build reads " +
                     std::to_string(kProtocolVersion) + ")");
  }
  if (Str(Field(doc, "kind", where), where + ".kind") != kind) Fail(where + " is not a " + kind + " document");
}

OrderedJson RefJson(const ObjectRef& ref) {
  if (!ref.present()) return nullptr;
  return {{"key", ref.key},
          {"size", ref.size},
          {"xxh3", container::HexU64(ref.xxh3)},
          {"head_size", ref.head_size},
          {"head_xxh3", container::HexU64(ref.head_xxh3)}};
}

ObjectRef ParseRef(const Json& j, const ShardRecord& r, const char* kind, const std::string& where) {
  ObjectRef ref;
  if (j.is_null()) return ref;
  CheckFields(j, {"key", "size", "xxh3", "head_size", "head_xxh3"}, where);
  ref.key = Str(Field(j, "key", where), where + ".key");
  ref.size = U64(Field(j, "size", where), where + ".size");
  ref.xxh3 = Hex(Field(j, "xxh3", where), where + ".xxh3");
  ref.head_size = U64(Field(j, "head_size", where), where + ".head_size");
  ref.head_xxh3 = Hex(Field(j, "head_xxh3", where), where + ".head_xxh3");
  if (ref.key != PieceKey(r.step, r.shard, r.count, kind, ref.xxh3)) {
    Fail(where + ".key is not " + PieceKey(r.step, r.shard, r.count, kind, ref.xxh3));
  }
  if (ref.head_size < container::kHeaderSize || ref.head_size > ref.size) {
    Fail(where + ".head_size is outside [" + std::to_string(container::kHeaderSize) + ", size]");
  }
  return ref;
}

ObjectRef ParseIndexRef(const Json& j, const ShardRecord& r, const std::string& where) {
  CheckFields(j, {"key", "size", "xxh3"}, where);
  ObjectRef ref;
  ref.key = Str(Field(j, "key", where), where + ".key");
  ref.size = U64(Field(j, "size", where), where + ".size");
  ref.xxh3 = Hex(Field(j, "xxh3", where), where + ".xxh3");
  if (ref.key != IndexKey(r.step, r.shard, r.count, ref.xxh3)) {
    Fail(where + ".key is not " + IndexKey(r.step, r.shard, r.count, ref.xxh3));
  }
  if (ref.size > kMaxDocumentBytes) Fail(where + ".size is above " + std::to_string(kMaxDocumentBytes));
  return ref;
}

OrderedJson RecordBody(const ShardRecord& r) {
  OrderedJson tensors = OrderedJson::array();
  for (const TensorChecksum& t : r.tensors) tensors.push_back({t.name, container::HexU64(t.xxh3)});
  OrderedJson body = {{"step", r.step},
          {"base_step", r.base_step == kNoStep ? OrderedJson(nullptr) : OrderedJson(r.base_step)},
          {"shard", r.shard},
          {"count", r.count},
          {"file", r.file},
          {"file_size", r.file_size},
          {"delta", RefJson(r.delta)},
          {"anchor", RefJson(r.anchor)},
          {"tensors", tensors},
          {"published_at", r.published_at}};
  // Written only when present, so that records without one stay as protocol 1.0 wrote them.
  if (r.index.present()) {
    body["index"] = {{"key", r.index.key}, {"size", r.index.size}, {"xxh3", container::HexU64(r.index.xxh3)}};
  }
  return body;
}

const std::set<std::string> kRecordFields = {"step", "base_step", "shard", "count", "file", "file_size",
                                             "delta", "anchor", "tensors", "published_at", "index"};

ShardRecord ParseRecordBody(const Json& j, const std::string& where) {
  ShardRecord r;
  r.step = Step(Field(j, "step", where), where + ".step");
  r.base_step = OptionalStep(Field(j, "base_step", where), where + ".base_step");
  const uint64_t count = U64(Field(j, "count", where), where + ".count");
  const uint64_t shard = U64(Field(j, "shard", where), where + ".shard");
  if (count == 0 || count > kMaxShards || shard >= count) Fail(where + ": shard or count out of range");
  r.count = static_cast<uint32_t>(count);
  r.shard = static_cast<uint32_t>(shard);
  if (r.base_step != kNoStep && r.base_step >= r.step) Fail(where + ".base_step is not before the step");
  r.file = Str(Field(j, "file", where), where + ".file");
  if (!PlainFileName(r.file)) Fail(where + ".file is not a plain file name");
  r.file_size = U64(Field(j, "file_size", where), where + ".file_size");
  r.delta = ParseRef(Field(j, "delta", where), r, "delta", where + ".delta");
  r.anchor = ParseRef(Field(j, "anchor", where), r, "anchor", where + ".anchor");
  if (r.delta.present() != (r.base_step != kNoStep)) Fail(where + " has a delta iff it has a base_step");
  if (!r.delta.present() && !r.anchor.present()) Fail(where + " has neither a delta nor an anchor");
  const Json& tensors = Field(j, "tensors", where);
  if (!tensors.is_array()) Fail(where + ".tensors is not an array");
  std::set<std::string> names;
  for (const Json& t : tensors) {
    if (!t.is_array() || t.size() != 2) Fail(where + ".tensors holds a non-pair");
    TensorChecksum c{Str(t[0], where + ".tensors[].name"), Hex(t[1], where + ".tensors[].xxh3")};
    if (c.name.empty() || !names.insert(c.name).second) Fail(where + ".tensors names '" + c.name + "' twice or empty");
    r.tensors.push_back(std::move(c));
  }
  r.published_at = Time(Field(j, "published_at", where), where + ".published_at");
  if (j.contains("index")) r.index = ParseIndexRef(j.at("index"), r, where + ".index");
  return r;
}

template <class Parse>
Status ParseDocument(const std::vector<uint8_t>& bytes, const std::string& where, const Parse& parse) {
  try {
    const Json doc = Json::parse(bytes.begin(), bytes.end());
    parse(doc);
    return Status::Ok();
  } catch (const strict_json::Error& e) {
    return Status(ErrorCode::kCorruptHeader, e.what);
  } catch (const Status& s) {
    return s;
  } catch (const Json::exception& e) {
    return Status(ErrorCode::kCorruptHeader, where + ": not valid JSON (" + e.what() + ")");
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, where + ": out of memory");
  }
}

std::string Digits(uint64_t value, int width) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%0*" PRIu64, width, value);
  return buf;
}

}  // namespace

std::string StepPrefix(uint64_t step) { return "steps/" + Digits(step, 12) + "/"; }
std::string ManifestKey(uint64_t step) { return StepPrefix(step) + "manifest.json"; }
std::string ShardRecordKey(uint64_t step, uint32_t shard, uint32_t count) {
  return StepPrefix(step) + "shard-" + Digits(shard, 5) + "-of-" + Digits(count, 5) + ".json";
}
std::string PieceKey(uint64_t step, uint32_t shard, uint32_t count, const char* kind, uint64_t xxh3) {
  return StepPrefix(step) + "shard-" + Digits(shard, 5) + "-of-" + Digits(count, 5) + "." + kind + "-" +
         container::HexU64(xxh3) + ".a3d";
}

std::string IndexKey(uint64_t step, uint32_t shard, uint32_t count, uint64_t xxh3) {
  return StepPrefix(step) + "shard-" + Digits(shard, 5) + "-of-" + Digits(count, 5) + ".index-" +
         container::HexU64(xxh3) + ".json";
}

uint64_t StepOfKey(const std::string& key) {
  if (key.size() < 19 || key.compare(0, 6, "steps/") != 0 || key[18] != '/') return kNoStep;
  uint64_t step = 0;
  for (size_t i = 6; i < 18; ++i) {
    if (key[i] < '0' || key[i] > '9') return kNoStep;
    step = step * 10 + static_cast<uint64_t>(key[i] - '0');
  }
  return step;
}

std::string RecordJson(const ShardRecord& record) {
  OrderedJson doc = {{"format", kProtocolName}, {"version", kProtocolVersion}, {"kind", "shard"}};
  const OrderedJson body = RecordBody(record);
  for (auto it = body.begin(); it != body.end(); ++it) doc[it.key()] = it.value();
  return doc.dump(1) + "\n";
}

std::string ManifestJson(const StepManifest& m) {
  OrderedJson shards = OrderedJson::array();
  for (const ShardRecord& r : m.shards) shards.push_back(RecordBody(r));
  OrderedJson doc = {{"format", kProtocolName},
                     {"version", kProtocolVersion},
                     {"kind", "step"},
                     {"step", m.step},
                     {"base_step", m.base_step == kNoStep ? OrderedJson(nullptr) : OrderedJson(m.base_step)},
                     {"base_manifest_xxh3", m.base_manifest_xxh3 == 0 ? OrderedJson(nullptr)
                                                                     : OrderedJson(container::HexU64(m.base_manifest_xxh3))},
                     {"anchor_step", m.anchor_step},
                     {"count", m.count},
                     {"published_at", m.published_at},
                     {"committed_at", m.committed_at},
                     {"shards", shards}};
  return doc.dump(1) + "\n";
}

std::string LatestJson(uint64_t step) {
  const OrderedJson doc = {{"format", kProtocolName}, {"version", kProtocolVersion}, {"kind", "latest"}, {"step", step}};
  return doc.dump() + "\n";
}

Status ParseRecord(const std::vector<uint8_t>& bytes, const std::string& where, ShardRecord* record) {
  return ParseDocument(bytes, where, [&](const Json& doc) {
    CheckEnvelope(doc, "shard", where);
    std::set<std::string> fields = kRecordFields;
    fields.insert({"format", "version", "kind"});
    CheckFields(doc, fields, where);
    *record = ParseRecordBody(doc, where);
  });
}

Status ParseManifest(const std::vector<uint8_t>& bytes, const std::string& where, StepManifest* manifest) {
  return ParseDocument(bytes, where, [&](const Json& doc) {
    CheckEnvelope(doc, "step", where);
    CheckFields(doc, {"format", "version", "kind", "step", "base_step", "base_manifest_xxh3", "anchor_step",
                      "count", "published_at", "committed_at", "shards"},
                where);
    StepManifest m;
    m.step = Step(Field(doc, "step", where), where + ".step");
    m.base_step = OptionalStep(Field(doc, "base_step", where), where + ".base_step");
    const Json& base_hash = Field(doc, "base_manifest_xxh3", where);
    if (!base_hash.is_null()) {
      m.base_manifest_xxh3 = Hex(base_hash, where + ".base_manifest_xxh3");
      if (m.base_step == kNoStep || m.base_manifest_xxh3 == 0) Fail(where + ".base_manifest_xxh3 without a base");
    }
    m.anchor_step = Step(Field(doc, "anchor_step", where), where + ".anchor_step");
    const uint64_t count = U64(Field(doc, "count", where), where + ".count");
    if (count == 0 || count > kMaxShards) Fail(where + ".count is out of range");
    m.count = static_cast<uint32_t>(count);
    m.published_at = Time(Field(doc, "published_at", where), where + ".published_at");
    m.committed_at = Time(Field(doc, "committed_at", where), where + ".committed_at");
    const Json& shards = Field(doc, "shards", where);
    if (!shards.is_array() || shards.size() != count) Fail(where + ".shards does not list `count` shards");
    std::set<std::string> files;
    bool all_anchors = true;
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string at = where + ".shards[" + std::to_string(i) + "]";
      CheckFields(shards[i], kRecordFields, at);
      ShardRecord r = ParseRecordBody(shards[i], at);
      if (r.step != m.step || r.count != m.count || r.shard != i) Fail(at + " is not shard " + std::to_string(i) + " of this step");
      if (r.delta.present() && r.base_step != m.base_step) Fail(at + ".base_step differs from the step's");
      if (!files.insert(r.file).second) Fail(at + ".file '" + r.file + "' is published by two shards");
      if (r.file == kIndexFileName) Fail(at + ".file is the index's name");
      all_anchors = all_anchors && r.anchor.present();
      m.shards.push_back(std::move(r));
    }
    if (m.base_step == kNoStep && !all_anchors) Fail(where + ": a step without a base must be all anchors");
    if (m.base_step != kNoStep && !all_anchors && m.base_manifest_xxh3 == 0) {
      Fail(where + ".base_manifest_xxh3 is null though the step's deltas need its base");
    }
    if (m.base_step != kNoStep && m.base_step >= m.step) Fail(where + ".base_step is not before the step");
    if (all_anchors != (m.anchor_step == m.step) || m.anchor_step > m.step) {
      Fail(where + ".anchor_step does not match the shards' anchors");
    }
    *manifest = std::move(m);
  });
}

Status ParseLatest(const std::vector<uint8_t>& bytes, const std::string& where, uint64_t* step) {
  return ParseDocument(bytes, where, [&](const Json& doc) {
    CheckEnvelope(doc, "latest", where);
    CheckFields(doc, {"format", "version", "kind", "step"}, where);
    *step = Step(Field(doc, "step", where), where + ".step");
  });
}

bool SameContents(const ShardRecord& a, const ShardRecord& b) {
  ShardRecord x = a, y = b;
  x.published_at = y.published_at = 0;
  return RecordJson(x) == RecordJson(y);
}

Status ReadManifest(Store* store, uint64_t step, StepManifest* manifest, std::vector<uint8_t>* bytes) {
  std::vector<uint8_t> data;
  const std::string key = ManifestKey(step);
  Status s = store->Get(key, kMaxDocumentBytes, &data, nullptr);
  if (!s.ok()) {
    if (s.code() == ErrorCode::kNotFound) {
      return Status(ErrorCode::kNotFound, "step " + std::to_string(step) + " does not exist in " +
                                              store->url() + " (no " + key + ")");
    }
    return s;
  }
  s = ParseManifest(data, store->url() + "/" + key, manifest);
  if (!s.ok()) return s;
  if (manifest->step != step) {
    return Status(ErrorCode::kCorruptHeader, store->url() + "/" + key + " describes step " +
                                                 std::to_string(manifest->step));
  }
  if (bytes != nullptr) *bytes = std::move(data);
  return Status::Ok();
}

Status ReadLatest(Store* store, uint64_t* step, std::string* etag) {
  std::vector<uint8_t> data;
  ObjectInfo info;
  Status s = store->Get(kLatestKey, kMaxDocumentBytes, &data, &info);
  if (!s.ok()) {
    if (s.code() == ErrorCode::kNotFound) {
      return Status(ErrorCode::kNotFound, store->url() + " has no committed step yet (" + s.message() + ")");
    }
    return s;
  }
  if (etag != nullptr) *etag = info.etag;
  return ParseLatest(data, store->url() + "/" + kLatestKey, step);
}

uint64_t ProbeLater(Store* store, uint64_t from, int probes) {
  for (int i = 0; i < probes && from < kMaxStep; ++i) {
    ObjectInfo info;
    if (!store->Head(ManifestKey(from + 1), &info).ok()) break;
    ++from;
  }
  return from;
}

}  // namespace sync
}  // namespace arc_v3
