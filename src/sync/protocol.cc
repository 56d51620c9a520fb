// The sync protocol's keys and documents (see protocol.h and src/sync/PROTOCOL.md): building,
// parsing and validating them. Pure: no store is read or written here (step_reader.cc reads).
#include "src/sync/protocol.h"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "src/checkpoint/container.h"
#include "src/checkpoint/strict_json.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"

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
bool Bool(const Json& value, const std::string& where) {
  if (!value.is_boolean()) Fail(where + " is not true or false");
  return value.get<bool>();
}
uint32_t Count(const Json& value, const std::string& where) {
  const uint64_t count = U64(value, where);
  if (count == 0 || count > kMaxShards)
    Fail(where + " is not in [1, " + std::to_string(kMaxShards) + "]");
  return static_cast<uint32_t>(count);
}
std::string Incarnation(const Json& value, const std::string& where) {
  std::string name = Str(value, where);
  if (!ValidIncarnation(name)) Fail(where + " is not 1 to 64 of [A-Za-z0-9._-]");
  return name;
}
bool PlainFileName(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos &&
         name[0] != '.';
}
OrderedJson OptionalStepJson(uint64_t step) {
  return step == kNoStep ? OrderedJson(nullptr) : OrderedJson(step);
}
OrderedJson OptionalHexJson(uint64_t xxh3) {
  return xxh3 == 0 ? OrderedJson(nullptr) : OrderedJson(checkpoint::HexU64(xxh3));
}

// A document of another protocol version, thrown by the parsers below and returned by
// Parse as kUnsupportedVersion (nothing here throws past Parse).
struct VersionError {
  std::string what;
};

void CheckEnvelope(const Json& doc, const char* kind, const std::string& where) {
  if (!doc.is_object()) Fail(where + " is not an object");
  if (Str(Field(doc, "format", where), where + ".format") != kProtocolName) {
    Fail(where + " is not an " + std::string(kProtocolName) + " document");
  }
  const uint64_t version = U64(Field(doc, "version", where), where + ".version");
  if (version != kProtocolVersion) {
    throw VersionError{
        where + ": sync protocol version " + std::to_string(version) +
        "; this build reads version " + std::to_string(kProtocolVersion) +
        (version == 1
             ? " only (a store arc_v3 1.x published to: publish this run to a new store or "
               "prefix, see CHANGELOG.md, 2.0)"
             : "")};
  }
  if (Str(Field(doc, "kind", where), where + ".kind") != kind)
    Fail(where + " is not a " + kind + " document");
}

// A SHA-256 in hex (64 lowercase digits).
std::string Sha(const Json& value, const std::string& where) {
  const std::string hex = Str(value, where);
  Digest ignored;
  if (!ParseDigestHex(hex, &ignored)) Fail(where + " is not 64 lowercase hex digits");
  return hex;
}

OrderedJson RefJson(const ObjectRef& ref, bool with_digests) {
  if (!ref.present()) return nullptr;
  OrderedJson j = {{"key", ref.key},
                   {"size", ref.size},
                   {"xxh3", checkpoint::HexU64(ref.xxh3)},
                   {"head_size", ref.head_size},
                   {"head_xxh3", checkpoint::HexU64(ref.head_xxh3)}};
  if (with_digests) {
    j["sha256"] = ref.sha256;
    j["head_sha256"] = ref.head_sha256;
    j["sums"] = {{"size", ref.sums_size}, {"sha256", ref.sums_sha256}};
  }
  return j;
}

// `signed_doc`: the record is signed, and its references carry SHA-256 digests.
ObjectRef ParseRef(const Json& j, const ShardRecord& r, const char* kind, const std::string& where,
                   bool signed_doc) {
  ObjectRef ref;
  if (j.is_null()) return ref;
  if (signed_doc) {
    CheckFields(j,
                {"key", "size", "xxh3", "head_size", "head_xxh3", "sha256", "head_sha256", "sums"},
                where);
    ref.sha256 = Sha(Field(j, "sha256", where), where + ".sha256");
    ref.head_sha256 = Sha(Field(j, "head_sha256", where), where + ".head_sha256");
    const Json& sums = Field(j, "sums", where);
    CheckFields(sums, {"size", "sha256"}, where + ".sums");
    ref.sums_size = U64(Field(sums, "size", where + ".sums"), where + ".sums.size");
    ref.sums_sha256 = Sha(Field(sums, "sha256", where + ".sums"), where + ".sums.sha256");
    if (ref.sums_size % 32 != 0 || ref.sums_size > kMaxDocumentBytes) {
      Fail(where + ".sums.size is not a multiple of 32 up to " + std::to_string(kMaxDocumentBytes));
    }
  } else {
    CheckFields(j, {"key", "size", "xxh3", "head_size", "head_xxh3"}, where);
  }
  ref.key = Str(Field(j, "key", where), where + ".key");
  ref.size = U64(Field(j, "size", where), where + ".size");
  ref.xxh3 = Hex(Field(j, "xxh3", where), where + ".xxh3");
  ref.head_size = U64(Field(j, "head_size", where), where + ".head_size");
  ref.head_xxh3 = Hex(Field(j, "head_xxh3", where), where + ".head_xxh3");
  if (ref.key != PieceKey(r.step, r.shard, r.count, kind, ref.xxh3)) {
    Fail(where + ".key is not " + PieceKey(r.step, r.shard, r.count, kind, ref.xxh3));
  }
  if (ref.head_size < checkpoint::kHeaderSize || ref.head_size > ref.size) {
    Fail(where + ".head_size is outside [" + std::to_string(checkpoint::kHeaderSize) + ", size]");
  }
  return ref;
}

ObjectRef ParseIndexRef(const Json& j, const ShardRecord& r, const std::string& where,
                        bool signed_doc) {
  ObjectRef ref;
  if (signed_doc) {
    CheckFields(j, {"key", "size", "xxh3", "sha256"}, where);
    ref.sha256 = Sha(Field(j, "sha256", where), where + ".sha256");
  } else {
    CheckFields(j, {"key", "size", "xxh3"}, where);
  }
  ref.key = Str(Field(j, "key", where), where + ".key");
  ref.size = U64(Field(j, "size", where), where + ".size");
  ref.xxh3 = Hex(Field(j, "xxh3", where), where + ".xxh3");
  if (ref.key != IndexKey(r.step, r.shard, r.count, ref.xxh3)) {
    Fail(where + ".key is not " + IndexKey(r.step, r.shard, r.count, ref.xxh3));
  }
  if (ref.size > kMaxDocumentBytes)
    Fail(where + ".size is above " + std::to_string(kMaxDocumentBytes));
  return ref;
}

// Parses a document stored plain or in a DSSE envelope of kSignedType: parse(doc, signatures).
template <class Parse>
Status ParseDocument(const std::vector<uint8_t>& bytes, const std::string& where,
                     const Parse& parse) {
  try {
    const std::string text(bytes.begin(), bytes.end());
    if (LooksLikeEnvelope(text)) {
      auto envelope = std::make_shared<Envelope>();
      ARC_V3_RETURN_IF_ERROR(ParseEnvelope(text, where, envelope.get()));
      if (envelope->type != kSignedType) {
        return Status(ErrorCode::kCorruptHeader,
                      where + " is an envelope of '" + envelope->type + "', not of " + kSignedType);
      }
      const Json doc = strict_json::Parse(envelope->payload, where);
      parse(doc, Signatures(std::move(envelope)));
      return Status::Ok();
    }
    const Json doc = strict_json::Parse(text, where);
    parse(doc, Signatures());
    return Status::Ok();
  } catch (const strict_json::Error& e) {
    return Status(ErrorCode::kCorruptHeader, e.what);
  } catch (const VersionError& e) {
    return Status(ErrorCode::kUnsupportedVersion, e.what);
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
// Two hex digits of XXH3(a, b as 8 bytes each, little-endian): a step's objects spread
// evenly over 256 key prefixes (S3 scales request rates per prefix).
std::string Spread(uint64_t a, uint64_t b) {
  return checkpoint::HexU64(checkpoint::CombineHashes({a, b})).substr(0, 2);
}
std::string StepDigits(uint64_t step) { return Digits(step, 12); }
std::string Document(const char* kind, OrderedJson body) {
  OrderedJson doc = {{"format", kProtocolName}, {"version", kProtocolVersion}, {"kind", kind}};
  for (auto it = body.begin(); it != body.end(); ++it) doc[it.key()] = it.value();
  return doc.dump(1) + "\n";
}

}  // namespace

bool ValidIncarnation(const std::string& name) {
  if (name.empty() || name.size() > 64 || name == "." || name == "..") return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-')
      return false;
  }
  return true;
}

std::string RootKey(uint64_t step) { return "steps/" + StepDigits(step) + ".json"; }
std::string GroupIndexPrefix(uint64_t step, uint32_t count, const std::string& incarnation) {
  return "groups/" + StepDigits(step) + "/" + Digits(count, 5) + "/" + incarnation + "/";
}
std::string GroupIndexKey(uint64_t step, uint32_t count, const std::string& incarnation,
                          uint32_t group) {
  return GroupIndexPrefix(step, count, incarnation) + Digits(group, 5) + ".json";
}
std::string GroupRecordPrefix(uint64_t step, uint32_t count, const std::string& incarnation,
                              uint32_t group) {
  return "r/" + Spread(step, (uint64_t{count} << 32) | group) + "/" + StepDigits(step) + "-" +
         Digits(count, 5) + "-" + Digits(group, 5) + "/" + incarnation + "/";
}
std::string ShardRecordKey(uint64_t step, uint32_t shard, uint32_t count,
                           const std::string& incarnation) {
  return GroupRecordPrefix(step, count, incarnation, GroupOf(shard)) + Digits(shard, 5) + ".json";
}
namespace {
std::string ObjectPrefix(uint64_t step, uint32_t shard, uint32_t count) {
  return "o/" + Spread(step, (uint64_t{count} << 32) | shard) + "/" + StepDigits(step) + "-" +
         Digits(count, 5) + "-" + Digits(shard, 5) + "/";
}
}  // namespace
std::string PieceKey(uint64_t step, uint32_t shard, uint32_t count, const char* kind,
                     uint64_t xxh3) {
  return ObjectPrefix(step, shard, count) + kind + "-" + checkpoint::HexU64(xxh3) + ".a3d";
}
std::string IndexKey(uint64_t step, uint32_t shard, uint32_t count, uint64_t xxh3) {
  return ObjectPrefix(step, shard, count) + "index-" + checkpoint::HexU64(xxh3) + ".json";
}
std::string LayoutKey(uint64_t xxh3) {
  const std::string hex = checkpoint::HexU64(xxh3);
  return "l/" + hex.substr(0, 2) + "/" + hex + ".json";
}

uint64_t StepOfKey(const std::string& key) {
  size_t at = 0;
  if (key.compare(0, 6, "steps/") == 0 && key.size() == 23 && key.compare(18, 5, ".json") == 0) {
    at = 6;
  } else if (key.compare(0, 7, "groups/") == 0 && key.size() > 20 && key[19] == '/') {
    at = 7;
  } else if ((key.compare(0, 2, "r/") == 0 || key.compare(0, 2, "o/") == 0) && key.size() > 18 &&
             key[4] == '/' && key[17] == '-') {
    at = 5;
  } else {
    return kNoStep;
  }
  uint64_t step = 0;
  for (size_t i = at; i < at + 12; ++i) {
    if (key[i] < '0' || key[i] > '9') return kNoStep;
    step = step * 10 + static_cast<uint64_t>(key[i] - '0');
  }
  return step;
}

namespace {

// A named document's [xxh3, size], and in a signed document [xxh3, size, sha256].
OrderedJson HashSize(uint64_t xxh3, uint64_t size, const std::string* sha256) {
  OrderedJson j = OrderedJson::array({checkpoint::HexU64(xxh3), size});
  if (sha256 != nullptr) j.push_back(*sha256);
  return j;
}
std::pair<uint64_t, uint64_t> ParseHashSize(const Json& j, const std::string& where,
                                            std::string* sha256) {
  if (sha256 == nullptr && (!j.is_array() || j.size() != 2)) Fail(where + " is not [xxh3, size]");
  if (sha256 != nullptr) {
    if (!j.is_array() || j.size() != 3) Fail(where + " is not [xxh3, size, sha256]");
    *sha256 = Sha(j[2], where + "[2]");
  }
  return {Hex(j[0], where + "[0]"), U64(j[1], where + "[1]")};
}

OrderedJson RecordBody(const ShardRecord& r, bool with_digests) {
  OrderedJson body = {
      {"step", r.step},
      {"base_step", OptionalStepJson(r.base_step)},
      {"shard", r.shard},
      {"count", r.count},
      {"incarnation", r.incarnation},
      {"base_incarnation",
       r.base_incarnation.empty() ? OrderedJson(nullptr) : OrderedJson(r.base_incarnation)},
      {"file", r.file},
      {"file_size", r.file_size},
      {"delta", RefJson(r.delta, with_digests)},
      {"anchor", RefJson(r.anchor, with_digests)},
      {"tensors_xxh3", checkpoint::HexU64(r.tensors_xxh3)},
      {"layout", HashSize(r.layout_xxh3, r.layout_size, with_digests ? &r.layout_sha256 : nullptr)},
      {"published_at", r.published_at}};
  if (r.index.present()) {
    body["index"] = {
        {"key", r.index.key}, {"size", r.index.size}, {"xxh3", checkpoint::HexU64(r.index.xxh3)}};
    if (with_digests) body["index"]["sha256"] = r.index.sha256;
  }
  return body;
}

ShardRecord ParseRecordBody(const Json& j, const std::string& where, bool signed_doc) {
  ShardRecord r;
  r.step = Step(Field(j, "step", where), where + ".step");
  r.base_step = OptionalStep(Field(j, "base_step", where), where + ".base_step");
  r.count = Count(Field(j, "count", where), where + ".count");
  const uint64_t shard = U64(Field(j, "shard", where), where + ".shard");
  if (shard >= r.count) Fail(where + ".shard is not below its count");
  r.shard = static_cast<uint32_t>(shard);
  r.incarnation = Incarnation(Field(j, "incarnation", where), where + ".incarnation");
  const Json& base_incarnation = Field(j, "base_incarnation", where);
  if (!base_incarnation.is_null())
    r.base_incarnation = Incarnation(base_incarnation, where + ".base_incarnation");
  if (r.base_incarnation.empty() != (r.base_step == kNoStep))
    Fail(where + " has a base_incarnation iff a base_step");
  if (r.base_step != kNoStep && r.base_step >= r.step)
    Fail(where + ".base_step is not before the step");
  r.file = Str(Field(j, "file", where), where + ".file");
  if (!PlainFileName(r.file)) Fail(where + ".file is not a plain file name");
  if (r.file == kIndexFileName) Fail(where + ".file is the index's name");
  r.file_size = U64(Field(j, "file_size", where), where + ".file_size");
  r.delta = ParseRef(Field(j, "delta", where), r, "delta", where + ".delta", signed_doc);
  r.anchor = ParseRef(Field(j, "anchor", where), r, "anchor", where + ".anchor", signed_doc);
  if (r.delta.present() != (r.base_step != kNoStep))
    Fail(where + " has a delta iff it has a base_step");
  if (!r.delta.present() && !r.anchor.present()) Fail(where + " has neither a delta nor an anchor");
  r.tensors_xxh3 = Hex(Field(j, "tensors_xxh3", where), where + ".tensors_xxh3");
  const auto layout = ParseHashSize(Field(j, "layout", where), where + ".layout",
                                    signed_doc ? &r.layout_sha256 : nullptr);
  r.layout_xxh3 = layout.first;
  r.layout_size = layout.second;
  r.published_at = Time(Field(j, "published_at", where), where + ".published_at");
  if (j.contains("index")) r.index = ParseIndexRef(j.at("index"), r, where + ".index", signed_doc);
  return r;
}

// The document's bytes, in a DSSE envelope signed by `key` if given.
std::string Seal(std::string doc, const SigningKey* key) {
  if (key == nullptr) return doc;
  std::string envelope;
  const Status s = SignEnvelope(*key, kSignedType, doc, &envelope);
  if (!s.ok())
    throw std::runtime_error(s.message());  // Ed25519 signing does not fail on a loaded key
  return envelope;
}

}  // namespace

std::string SumsKey(const std::string& key) {
  const size_t dot = key.rfind('.');
  return key.substr(0, dot) + ".sha256";
}

std::vector<std::pair<uint64_t, uint64_t>> StoredRanges(const checkpoint::Manifest& manifest) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  const auto add = [&](uint64_t offset, uint64_t size) {
    if (size > 0) ranges.emplace_back(offset, size);
  };
  for (const checkpoint::FileEntry& f : manifest.files) {
    add(f.header.offset, f.header.size);
    if (!f.fills.empty()) add(f.fill.offset, f.fill.size);
    for (const checkpoint::TensorEntry& t : f.tensors) {
      if (t.grouped()) continue;
      for (const checkpoint::Piece& p : t.pieces) add(p.offset, p.size);
    }
    for (const checkpoint::Group& g : f.groups) add(g.offset, g.size);
  }
  std::sort(ranges.begin(), ranges.end());
  return ranges;
}

std::string RecordJson(const ShardRecord& record, const SigningKey* key) {
  return Seal(Document("shard", RecordBody(record, key != nullptr)), key);
}

std::string GroupIndexJson(const GroupIndex& g, const SigningKey* key) {
  OrderedJson records = OrderedJson::array();
  for (size_t i = 0; i < g.records.size(); ++i) {
    records.push_back(HashSize(g.records[i].first, g.records[i].second,
                               key != nullptr ? &g.record_sha256.at(i) : nullptr));
  }
  return Seal(Document("group", {{"step", g.step},
                                 {"count", g.count},
                                 {"incarnation", g.incarnation},
                                 {"group", g.group},
                                 {"base_step", OptionalStepJson(g.base_step)},
                                 {"base_incarnation", g.base_incarnation.empty()
                                                          ? OrderedJson(nullptr)
                                                          : OrderedJson(g.base_incarnation)},
                                 {"anchors", g.anchors},
                                 {"chain_bytes", g.chain_bytes},
                                 {"anchor_bytes", g.anchor_bytes},
                                 {"published_at", g.published_at},
                                 {"layout", HashSize(g.layout_xxh3, g.layout_size,
                                                     key != nullptr ? &g.layout_sha256 : nullptr)},
                                 {"records", records}}),
              key);
}

uint64_t TensorListChecksum(const std::vector<TensorChecksum>& tensors) {
  std::vector<uint8_t> bytes;
  const auto u64 = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  for (const TensorChecksum& t : tensors) {
    u64(t.name.size());
    bytes.insert(bytes.end(), t.name.begin(), t.name.end());
    u64(t.xxh3);
  }
  return checkpoint::Hash(bytes.data(), bytes.size());
}

std::vector<const checkpoint::TensorEntry*> DataOrder(
    const std::vector<checkpoint::TensorEntry>& tensors) {
  std::vector<const checkpoint::TensorEntry*> order;
  for (const checkpoint::TensorEntry& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(),
                   [](const checkpoint::TensorEntry* a, const checkpoint::TensorEntry* b) {
                     return a->data_offset != b->data_offset ? a->data_offset < b->data_offset
                                                             : a->name < b->name;
                   });
  return order;
}

std::vector<std::string> DataOrderNames(const std::vector<checkpoint::TensorEntry>& tensors) {
  std::vector<std::string> names;
  for (const checkpoint::TensorEntry* t : DataOrder(tensors)) names.push_back(t->name);
  return names;
}

std::string LayoutJson(const Layout& layout) {
  OrderedJson shards = OrderedJson::array();
  for (const Layout::Shard& s : layout.shards)
    shards.push_back({{"file", s.file}, {"tensors", s.tensors}});
  return Document("layout", {{"shards", shards}});
}

std::string RootJson(const StepManifest& m, const SigningKey* key) {
  OrderedJson groups = OrderedJson::array();
  for (const StepManifest::Group& g : m.groups) {
    if (key != nullptr) {
      groups.push_back({checkpoint::HexU64(g.xxh3), g.size, g.sha256,
                        checkpoint::HexU64(g.layout_xxh3), g.layout_size, g.layout_sha256});
    } else {
      groups.push_back(
          {checkpoint::HexU64(g.xxh3), g.size, checkpoint::HexU64(g.layout_xxh3), g.layout_size});
    }
  }
  OrderedJson body = {{"step", m.step},
                      {"count", m.count},
                      {"incarnation", m.incarnation},
                      {"run", checkpoint::HexU64(m.run)},
                      {"base_step", OptionalStepJson(m.base_step)},
                      {"base_root_xxh3", OptionalHexJson(m.base_root_xxh3)},
                      {"anchor_step", m.anchor_step},
                      {"chain_bytes", m.chain_bytes},
                      {"anchor_bytes", m.anchor_bytes},
                      {"published_at", m.published_at},
                      {"committed_at", m.committed_at},
                      {"groups", groups}};
  if (key != nullptr) {
    body["base_root_sha256"] =
        m.base_root_sha256.empty() ? OrderedJson(nullptr) : OrderedJson(m.base_root_sha256);
  }
  return Seal(Document("step", std::move(body)), key);
}

Status VerifySigned(const Signatures& signatures, const std::vector<PublicKey>& trusted,
                    const std::string& where, std::string* keyid) {
  if (signatures == nullptr) return Status(ErrorCode::kUntrusted, where + " is not signed");
  return VerifyEnvelope(*signatures, kSignedType, trusted, where, keyid);
}

std::string LatestJson(uint64_t step) {
  const OrderedJson doc = {
      {"format", kProtocolName}, {"version", kProtocolVersion}, {"kind", "latest"}, {"step", step}};
  return doc.dump() + "\n";
}

Status ParseRecord(const std::vector<uint8_t>& bytes, const std::string& where,
                   ShardRecord* record) {
  return ParseDocument(bytes, where, [&](const Json& doc, Signatures signatures) {
    CheckEnvelope(doc, "shard", where);
    CheckFields(doc,
                {"format", "version", "kind", "step", "base_step", "shard", "count", "incarnation",
                 "base_incarnation", "file", "file_size", "delta", "anchor", "tensors_xxh3",
                 "layout", "published_at", "index"},
                where);
    *record = ParseRecordBody(doc, where, signatures != nullptr);
    record->signatures = std::move(signatures);
  });
}

Status ParseGroupIndex(const std::vector<uint8_t>& bytes, const std::string& where,
                       GroupIndex* group) {
  return ParseDocument(bytes, where, [&](const Json& doc, Signatures signatures) {
    CheckEnvelope(doc, "group", where);
    CheckFields(doc,
                {"format", "version", "kind", "step", "count", "incarnation", "group", "base_step",
                 "base_incarnation", "anchors", "chain_bytes", "anchor_bytes", "published_at",
                 "layout", "records"},
                where);
    GroupIndex g;
    g.step = Step(Field(doc, "step", where), where + ".step");
    g.count = Count(Field(doc, "count", where), where + ".count");
    g.incarnation = Incarnation(Field(doc, "incarnation", where), where + ".incarnation");
    const uint64_t number = U64(Field(doc, "group", where), where + ".group");
    if (number >= GroupCount(g.count)) Fail(where + ".group is not a group of `count` shards");
    g.group = static_cast<uint32_t>(number);
    g.base_step = OptionalStep(Field(doc, "base_step", where), where + ".base_step");
    if (g.base_step != kNoStep && g.base_step >= g.step)
      Fail(where + ".base_step is not before the step");
    const Json& base_incarnation = Field(doc, "base_incarnation", where);
    if (!base_incarnation.is_null())
      g.base_incarnation = Incarnation(base_incarnation, where + ".base_incarnation");
    if (g.base_incarnation.empty() != (g.base_step == kNoStep))
      Fail(where + " has a base_incarnation iff a base_step");
    g.anchors = Bool(Field(doc, "anchors", where), where + ".anchors");
    if (g.base_step == kNoStep && !g.anchors)
      Fail(where + ": a group without deltas must be all anchors");
    g.chain_bytes = U64(Field(doc, "chain_bytes", where), where + ".chain_bytes");
    g.anchor_bytes = U64(Field(doc, "anchor_bytes", where), where + ".anchor_bytes");
    if (!g.anchors && g.anchor_bytes != 0)
      Fail(where + ".anchor_bytes is not 0 though not every shard has an anchor");
    g.published_at = Time(Field(doc, "published_at", where), where + ".published_at");
    const bool signed_doc = signatures != nullptr;
    const auto layout = ParseHashSize(Field(doc, "layout", where), where + ".layout",
                                      signed_doc ? &g.layout_sha256 : nullptr);
    g.layout_xxh3 = layout.first;
    g.layout_size = layout.second;
    const Json& records = Field(doc, "records", where);
    const uint32_t members = std::min(kFanIn, g.count - g.group * kFanIn);
    if (!records.is_array() || records.size() != members) {
      Fail(where + ".records does not list the group's " + std::to_string(members) + " shards");
    }
    for (size_t i = 0; i < records.size(); ++i) {
      std::string sha256;
      g.records.push_back(ParseHashSize(records[i], where + ".records[" + std::to_string(i) + "]",
                                        signed_doc ? &sha256 : nullptr));
      if (signed_doc) g.record_sha256.push_back(std::move(sha256));
    }
    g.signatures = std::move(signatures);
    *group = std::move(g);
  });
}

Status ParseLayout(const std::vector<uint8_t>& bytes, const std::string& where, Layout* layout) {
  return ParseDocument(bytes, where, [&](const Json& doc, const Signatures& signatures) {
    if (signatures != nullptr) Fail(where + " is signed: layouts never are");
    CheckEnvelope(doc, "layout", where);
    CheckFields(doc, {"format", "version", "kind", "shards"}, where);
    const Json& shards = Field(doc, "shards", where);
    if (!shards.is_array() || shards.empty() || shards.size() > kFanIn)
      Fail(where + ".shards is not 1 to 32 shards");
    Layout l;
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string at = where + ".shards[" + std::to_string(i) + "]";
      CheckFields(shards[i], {"file", "tensors"}, at);
      Layout::Shard s;
      s.file = Str(Field(shards[i], "file", at), at + ".file");
      if (!PlainFileName(s.file) || s.file == kIndexFileName)
        Fail(at + ".file is not a plain file name");
      const Json& tensors = Field(shards[i], "tensors", at);
      if (!tensors.is_array()) Fail(at + ".tensors is not an array");
      std::set<std::string> names;
      for (const Json& t : tensors) {
        s.tensors.push_back(Str(t, at + ".tensors[]"));
        if (s.tensors.back().empty() || !names.insert(s.tensors.back()).second) {
          Fail(at + ".tensors names '" + s.tensors.back() + "' twice or empty");
        }
      }
      l.shards.push_back(std::move(s));
    }
    *layout = std::move(l);
  });
}

Status ParseRoot(const std::vector<uint8_t>& bytes, const std::string& where, StepManifest* root) {
  return ParseDocument(bytes, where, [&](const Json& doc, Signatures signatures) {
    CheckEnvelope(doc, "step", where);
    const bool signed_doc = signatures != nullptr;
    std::set<std::string> fields = {"format",         "version",      "kind",        "step",
                                    "count",          "incarnation",  "run",         "base_step",
                                    "base_root_xxh3", "anchor_step",  "chain_bytes", "anchor_bytes",
                                    "published_at",   "committed_at", "groups"};
    if (signed_doc) fields.insert("base_root_sha256");
    CheckFields(doc, fields, where);
    StepManifest m;
    m.step = Step(Field(doc, "step", where), where + ".step");
    m.count = Count(Field(doc, "count", where), where + ".count");
    m.incarnation = Incarnation(Field(doc, "incarnation", where), where + ".incarnation");
    m.run = Hex(Field(doc, "run", where), where + ".run");
    m.base_step = OptionalStep(Field(doc, "base_step", where), where + ".base_step");
    if (m.base_step != kNoStep && m.base_step >= m.step)
      Fail(where + ".base_step is not before the step");
    const Json& base_hash = Field(doc, "base_root_xxh3", where);
    if (!base_hash.is_null()) {
      m.base_root_xxh3 = Hex(base_hash, where + ".base_root_xxh3");
      if (m.base_step == kNoStep || m.base_root_xxh3 == 0)
        Fail(where + ".base_root_xxh3 without a base");
    }
    m.anchor_step = Step(Field(doc, "anchor_step", where), where + ".anchor_step");
    if (m.anchor_step > m.step) Fail(where + ".anchor_step is after the step");
    if (m.base_step == kNoStep && m.anchor_step != m.step)
      Fail(where + ": a step without a base must be all anchors");
    if (signed_doc) {
      const Json& base_sha = Field(doc, "base_root_sha256", where);
      if (!base_sha.is_null()) m.base_root_sha256 = Sha(base_sha, where + ".base_root_sha256");
      if (m.base_root_sha256.empty() != (m.base_step == kNoStep))
        Fail(where + " has a base_root_sha256 iff a base_step");
    }
    if ((m.base_step != kNoStep) != (m.base_root_xxh3 != 0))
      Fail(where + " has a base_root_xxh3 iff a base_step");
    if (m.run == 0) Fail(where + ".run is 0");
    if (!m.anchor() && m.anchor_step > m.base_step)
      Fail(where + ".anchor_step is after its base step");
    m.chain_bytes = U64(Field(doc, "chain_bytes", where), where + ".chain_bytes");
    m.anchor_bytes = U64(Field(doc, "anchor_bytes", where), where + ".anchor_bytes");
    if (m.anchor() != (m.anchor_bytes != 0)) {
      Fail(where + ".anchor_bytes is 0 iff the step is not an anchor step (anchor_step = step)");
    }
    m.published_at = Time(Field(doc, "published_at", where), where + ".published_at");
    m.committed_at = Time(Field(doc, "committed_at", where), where + ".committed_at");
    const Json& groups = Field(doc, "groups", where);
    if (!groups.is_array() || groups.size() != GroupCount(m.count)) {
      Fail(where + ".groups does not list the " + std::to_string(GroupCount(m.count)) +
           " groups of `count` shards");
    }
    for (size_t i = 0; i < groups.size(); ++i) {
      const std::string at = where + ".groups[" + std::to_string(i) + "]";
      const Json& g = groups[i];
      if (signed_doc) {
        if (!g.is_array() || g.size() != 6)
          Fail(at + " is not [xxh3, size, sha256, layout_xxh3, layout_size, layout_sha256]");
        m.groups.push_back({Hex(g[0], at + "[0]"), U64(g[1], at + "[1]"), Hex(g[3], at + "[3]"),
                            U64(g[4], at + "[4]"), Sha(g[2], at + "[2]"), Sha(g[5], at + "[5]")});
      } else {
        if (!g.is_array() || g.size() != 4)
          Fail(at + " is not [xxh3, size, layout_xxh3, layout_size]");
        m.groups.push_back({Hex(g[0], at + "[0]"), U64(g[1], at + "[1]"), Hex(g[2], at + "[2]"),
                            U64(g[3], at + "[3]"), std::string(), std::string()});
      }
    }
    m.signatures = std::move(signatures);
    *root = std::move(m);
  });
}

Status ParseLatest(const std::vector<uint8_t>& bytes, const std::string& where, uint64_t* step) {
  return ParseDocument(bytes, where, [&](const Json& doc, const Signatures& signatures) {
    if (signatures != nullptr) Fail(where + " is signed: the latest pointer never is");
    CheckEnvelope(doc, "latest", where);
    CheckFields(doc, {"format", "version", "kind", "step"}, where);
    *step = Step(Field(doc, "step", where), where + ".step");
  });
}

}  // namespace sync
}  // namespace arc_v3
