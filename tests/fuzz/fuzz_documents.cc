// Fuzz target: the sync protocol's documents as a region reads them from a store it does
// not control (src/sync/protocol.h; src/sync/PROTOCOL.md): step roots, group indexes,
// shard records, layouts, the `latest` pointer, each plain or in a DSSE envelope, and the
// envelope parser itself (src/sync/signing.h). Input: one byte choosing the kind, then the
// document's bytes.
// Promises checked: no crash or out-of-bounds access; a refusal is an error with a
// message; what is accepted names no member twice (nor does a signed payload) and
// re-serialises canonically (writing it, reading that and writing it again gives the same
// bytes); an accepted envelope verifies only against the key that made it.
#include <cstdint>
#include <string>
#include <vector>

#include "src/sync/protocol.h"
#include "src/sync/signing.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_json.h"

namespace arc_v3 {
namespace fuzz {
namespace {

using sync::GroupIndex;
using sync::Layout;
using sync::ShardRecord;
using sync::StepManifest;

// One key for every run (signing is deterministic): re-serialised signed documents.
const sync::SigningKey& FuzzKey() {
  static const sync::SigningKey* key = [] {
    auto* k = new sync::SigningKey();
    if (!sync::SigningKey::Generate(k).ok()) std::abort();
    return k;
  }();
  return *key;
}

std::vector<uint8_t> Bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

void CheckRefused(const Status& s) {
  FUZZ_CHECK(s.ok() || !s.message().empty(), "an error without a message");
}

// parse(bytes) -> document; write(document, key) -> bytes. Accepted documents are written
// (signed again where they were signed), read back and written again: the same bytes.
template <class Doc, class Parse, class Write>
void RoundTrip(const std::vector<uint8_t>& bytes, const Parse& parse, const Write& write) {
  Doc doc;
  const Status s = parse(bytes, &doc);
  CheckRefused(s);
  if (!s.ok()) return;
  CheckOneReading(std::string(bytes.begin(), bytes.end()));
  if (doc.signatures != nullptr) CheckOneReading(doc.signatures->payload);
  const sync::SigningKey* key = doc.signatures != nullptr ? &FuzzKey() : nullptr;
  const std::string once = write(doc, key);
  Doc again;
  const Status back = parse(Bytes(once), &again);
  FUZZ_CHECK(back.ok(), back.message().c_str());
  FUZZ_CHECK((again.signatures != nullptr) == (key != nullptr),
             "signed-ness changed in a round trip");
  FUZZ_CHECK(write(again, key) == once, "an accepted document does not re-serialise to itself");
}

}  // namespace

int FuzzDocuments(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::vector<uint8_t> bytes(data + 1, data + size);
  const std::string where = "fuzz";
  switch (data[0] % 6) {
    case 0:
      RoundTrip<StepManifest>(
          bytes,
          [&](const std::vector<uint8_t>& b, StepManifest* m) {
            return sync::ParseRoot(b, where, m);
          },
          [](const StepManifest& m, const sync::SigningKey* key) {
            return sync::RootJson(m, key);
          });
      break;
    case 1:
      RoundTrip<GroupIndex>(
          bytes,
          [&](const std::vector<uint8_t>& b, GroupIndex* g) {
            return sync::ParseGroupIndex(b, where, g);
          },
          [](const GroupIndex& g, const sync::SigningKey* key) {
            return sync::GroupIndexJson(g, key);
          });
      break;
    case 2:
      RoundTrip<ShardRecord>(
          bytes,
          [&](const std::vector<uint8_t>& b, ShardRecord* r) {
            return sync::ParseRecord(b, where, r);
          },
          [](const ShardRecord& r, const sync::SigningKey* key) {
            return sync::RecordJson(r, key);
          });
      break;
    case 3: {
      Layout layout;
      const Status s = sync::ParseLayout(bytes, where, &layout);
      CheckRefused(s);
      if (s.ok()) {
        CheckOneReading(std::string(bytes.begin(), bytes.end()));
        const std::string once = sync::LayoutJson(layout);
        Layout again;
        FUZZ_CHECK(sync::ParseLayout(Bytes(once), where, &again).ok(),
                   "a written layout is refused");
        FUZZ_CHECK(sync::LayoutJson(again) == once, "a layout does not re-serialise to itself");
      }
      break;
    }
    case 4: {
      uint64_t step = 0;
      const Status s = sync::ParseLatest(bytes, where, &step);
      CheckRefused(s);
      if (s.ok()) {
        CheckOneReading(std::string(bytes.begin(), bytes.end()));
        uint64_t again = 0;
        FUZZ_CHECK(
            sync::ParseLatest(Bytes(sync::LatestJson(step)), where, &again).ok() && again == step,
            "a latest pointer does not round-trip");
      }
      break;
    }
    default: {
      const std::string text(bytes.begin(), bytes.end());
      sync::Envelope e;
      const Status s = sync::ParseEnvelope(text, where, &e);
      CheckRefused(s);
      if (!s.ok()) break;
      CheckOneReading(text);
      FUZZ_CHECK(!e.signatures.empty() && e.signatures.size() <= 16,
                 "an envelope of 0 or over 16 signatures");
      // Whatever it holds, no signature of it verifies against a key that did not make it,
      // and a signature made now verifies.
      std::string keyid;
      const Status foreign =
          sync::VerifyEnvelope(e, e.type, {FuzzKey().public_key()}, where, &keyid);
      FUZZ_CHECK(!foreign.ok() && foreign.code() == ErrorCode::kUntrusted,
                 "a forged signature verified");
      std::string signed_again;
      FUZZ_CHECK(sync::SignEnvelope(FuzzKey(), e.type, e.payload, &signed_again).ok(),
                 "signing failed");
      sync::Envelope mine;
      FUZZ_CHECK(sync::ParseEnvelope(signed_again, where, &mine).ok(),
                 "a written envelope is refused");
      FUZZ_CHECK(mine.payload == e.payload && mine.type == e.type,
                 "an envelope does not round-trip");
      FUZZ_CHECK(sync::VerifyEnvelope(mine, e.type, {FuzzKey().public_key()}, where, &keyid).ok(),
                 "a fresh signature does not verify");
      break;
    }
  }
  return 0;
}

ARC_V3_FUZZ_ENTRY(FuzzDocuments)

}  // namespace fuzz
}  // namespace arc_v3
