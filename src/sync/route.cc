// Route planning and piece fetching (see route.h).
#include "src/sync/route.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "src/common/clock.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"

namespace arc_v3 {
namespace sync {
namespace {

using checkpoint::FileEntry;
using checkpoint::Piece;
using checkpoint::Reader;
using checkpoint::TensorEntry;
using Clock = std::chrono::steady_clock;


}  // namespace

Status CheckLayout(const Reader& reader, const ShardRecord& record, const std::string& name) {
  if (reader.manifest().directory || reader.manifest().files.size() != 1) {
    return Status(ErrorCode::kCorruptHeader, name + " is not the container of one shard file");
  }
  const checkpoint::FileEntry& file = reader.manifest().files[0];
  if (file.name != record.file || file.size != record.file_size) {
    return Status(ErrorCode::kCorruptHeader, name + " holds '" + file.name + "' of " + std::to_string(file.size) +
                                                 " bytes, not the record's '" + record.file + "' of " +
                                                 std::to_string(record.file_size));
  }
  return Status::Ok();
}



Status LoadTrust(const std::vector<std::string>& paths, Trust* trust) {
  trust->keys.clear();
  for (const std::string& path : paths) {
    std::vector<PublicKey> keys;
    ARC_V3_RETURN_IF_ERROR(PublicKey::LoadAll(path, &keys));
    for (PublicKey& key : keys) trust->keys.push_back(std::move(key));
  }
  return Status::Ok();
}

std::vector<std::string> Trust::ids() const {
  std::set<std::string> unique;
  for (const PublicKey& key : keys) unique.insert(key.id());
  return std::vector<std::string>(unique.begin(), unique.end());
}

Status UnderTrust(const Trust& trust, Status s) {
  if (!trust.on()) return s;
  switch (s.code()) {
    case ErrorCode::kCorruptChunk:
    case ErrorCode::kCorruptHeader:
    case ErrorCode::kTruncated:
    case ErrorCode::kUnsupportedVersion:
      return Status(ErrorCode::kUntrusted, "does not verify: " + s.message());
    default:
      return s;
  }
}

Status CheckTrusted(const Trust& trust, const StepManifest& root, const std::string& where) {
  if (!trust.on()) return Status::Ok();
  std::string keyid;
  Status s = VerifySigned(root.signatures, trust.keys, where, &keyid);
  return InContext("step " + std::to_string(root.step), s);
}

Status CheckProgress(const Trust& trust, uint64_t held_step, uint64_t held_run, const StepManifest& target,
                     const std::string& holder) {
  if (!trust.on() || held_step == kNoStep) return Status::Ok();
  if (target.step < held_step) {
    return Status(ErrorCode::kUntrusted, "step " + std::to_string(target.step) + " is older than step " +
                                             std::to_string(held_step) + ", which " + holder +
                                             " holds: a trusting reader never goes back");
  }
  if (held_run != 0 && target.run != held_run) {
    return Status(ErrorCode::kUntrusted, "step " + std::to_string(target.step) + " is of run " +
                                             checkpoint::HexU64(target.run) + ", not of run " +
                                             checkpoint::HexU64(held_run) + " that " + holder + " holds");
  }
  return Status::Ok();
}

const ObjectRef& RefOf(const Hop& hop, size_t shard) {
  return hop.anchor[shard] ? hop.m.shards[shard].anchor : hop.m.shards[shard].delta;
}

// What a hop costs, from its root: per shard its delta (its anchor where it has none), or
// at an anchor step every anchor.
uint64_t ChainCost(const StepManifest& m) { return m.chain_bytes; }
uint64_t AnchorCost(const StepManifest& m) { return m.anchor_bytes; }


namespace {

// The roots PlanRoute read back from the target: `back` descends from it, to the region's
// step `from` where the chain meets it (chain_ok), or as far as the anchor route needs.
struct Walk {
  std::vector<Hop> back;
  uint64_t from = kNoStep;
  std::string from_incarnation;
  uint64_t anchor_step = kNoStep;
  bool chain_ok = false;
  size_t anchor_index = SIZE_MAX;  // the anchor step's position in `back`
};

// The root of the base step of `cur` (`*pruned` where it is gone), checked under trust
// against the SHA-256 `cur` names.
Status ReadBaseHop(Store* store, const StepManifest& cur, const Trust& trust, Hop* prev, bool* pruned,
                   PullReport* report) {
  std::vector<uint8_t> bytes;
  Status s = ReadRoot(store, cur.base_step, &prev->m, &bytes);
  report->requests += 1;
  report->fetched_bytes += bytes.size();
  *pruned = s.code() == ErrorCode::kNotFound;
  if (*pruned) return Status::Ok();
  ARC_V3_RETURN_IF_ERROR(UnderTrust(trust, s));
  prev->manifest_xxh3 = checkpoint::Hash(bytes.data(), bytes.size());
  prev->root_sha256 = DigestHex(Sha256(bytes.data(), bytes.size()));
  const std::string name = store->url() + "/" + RootKey(prev->m.step);
  if (trust.on()) {
    ARC_V3_RETURN_IF_ERROR(CheckTrusted(trust, prev->m, name));
    if (prev->root_sha256 != cur.base_root_sha256) {
      return Status(ErrorCode::kUntrusted, name + " is not the base root step " + std::to_string(cur.step) +
                                               " names (its SHA-256 differs)");
    }
  }
  // The root names its base's bytes by XXH3 too: a route is a chain of hashes.
  if (cur.base_root_xxh3 != 0 && prev->manifest_xxh3 != cur.base_root_xxh3) {
    return UnderTrust(trust, Status(ErrorCode::kCorruptChunk, name + " is not the base root step " +
                                                                  std::to_string(cur.step) + " names (its XXH3 differs)"));
  }
  return Status::Ok();
}

// The cheaper of the routes the walk found: the chain from the region's step, or the anchor
// and the deltas after it (`only_chain`: the chain or nothing).
Status ChooseRoute(Store* store, const Walk& walk, bool only_chain, Route* route) {
  const uint64_t S = walk.from, A = walk.anchor_step;
  const StepManifest* anchor = walk.anchor_index != SIZE_MAX ? &walk.back[walk.anchor_index].m : nullptr;
  uint64_t chain_cost = UINT64_MAX, anchor_cost = UINT64_MAX;
  if (walk.chain_ok) {
    chain_cost = 0;
    for (const Hop& h : walk.back) {
      if (h.m.step > S) chain_cost += ChainCost(h.m);
    }
  }
  if (anchor != nullptr) {
    anchor_cost = AnchorCost(*anchor);
    for (const Hop& h : walk.back) {
      if (h.m.step > A) anchor_cost += ChainCost(h.m);
    }
  }
  const uint64_t target = walk.back.front().m.step;
  if (chain_cost == UINT64_MAX && anchor_cost == UINT64_MAX) {
    return Status(ErrorCode::kNotFound,
                  "step " + std::to_string(target) + " cannot be rebuilt: the chain back to its anchor (step " +
                      std::to_string(A) + ") is gone from " + store->url() + " (pruned?)");
  }
  if (only_chain && chain_cost == UINT64_MAX) {
    return Status(ErrorCode::kNotFound, "the directory's step " + std::to_string(S) + " is not on the chain to step " +
                                            std::to_string(target));
  }
  route->from_dir = chain_cost <= anchor_cost || only_chain;
  if (!route->from_dir) {
    // The anchor route starts at an anchor step that every step after it names.
    for (const Hop& h : walk.back) {
      if (h.m.step >= A && h.m.anchor_step != A) {
        return Status(ErrorCode::kCorruptHeader, "step " + std::to_string(h.m.step) + " names step " +
                                                     std::to_string(h.m.anchor_step) + " as its anchor step, not " +
                                                     std::to_string(A) + " as step " + std::to_string(target) + " does");
      }
    }
  }
  if (route->from_dir) route->from_incarnation = walk.from_incarnation;
  route->bytes = std::min(chain_cost, anchor_cost);
  const uint64_t first = route->from_dir ? S + 1 : A;
  for (auto it = walk.back.rbegin(); it != walk.back.rend(); ++it) {
    if (it->m.step < first) continue;
    route->hops.push_back(*it);
  }
  const uint64_t N = route->hops.back().m.step;
  route->anchor_step = A;
  route->name = route->from_dir ? "chain " + std::to_string(S) + " -> " + std::to_string(N)
                                : "anchor " + std::to_string(A) + " -> " + std::to_string(N);
  return Status::Ok();
}

}  // namespace

Status PlanRoute(Store* store, const RouteFrom* state, Hop target, Route* route, PullReport* report,
                 const Trust& trust) {
  Walk walk;
  walk.from = state != nullptr ? state->step : kNoStep;  // stays set for the cost below
  if (state != nullptr) walk.from_incarnation = state->incarnation;
  const uint64_t S = walk.from;
  const bool only_chain = state != nullptr && state->only_chain;
  const uint64_t A = walk.anchor_step = target.m.anchor_step;
  std::vector<Hop>& back = walk.back;
  back.push_back(std::move(target));
  uint64_t before_anchor = 0;  // what the route from DIR pays for the hops (S, A]
  for (;;) {
    const size_t i = back.size() - 1;
    const StepManifest& cur = back[i].m;
    if (cur.step == A) walk.anchor_index = i;
    if (state != nullptr && cur.step == S) {
      walk.chain_ok = back[i].manifest_xxh3 == state->manifest_xxh3 && cur.count == state->count &&
                      (!trust.on() || (!state->root_sha256.empty() && back[i].root_sha256 == state->root_sha256));
      if (walk.chain_ok) break;
      state = nullptr;  // DIR's step is another store's: only the anchor route is left
    }
    if (cur.base_step == kNoStep) break;
    // The root names its base's: a region at the base step needs no second look.
    if (state != nullptr && cur.base_step == S && cur.base_root_xxh3 != 0) {
      // Under trust the XXH3 is a pre-check only: the signed link's SHA-256 decides.
      walk.chain_ok = cur.base_root_xxh3 == state->manifest_xxh3 && cur.count == state->count &&
                      (!trust.on() || (!state->root_sha256.empty() && cur.base_root_sha256 == state->root_sha256));
      if (walk.chain_ok) break;
      state = nullptr;
    }
    if (cur.step <= A) {
      // Below the anchor only the route from DIR goes on, while it costs less than the anchor.
      if (state == nullptr || cur.base_step < S) break;
      before_anchor += ChainCost(cur);
      if (walk.anchor_index != SIZE_MAX && before_anchor > AnchorCost(back[walk.anchor_index].m)) break;
    }
    Hop prev;
    bool pruned = false;
    ARC_V3_RETURN_IF_ERROR(ReadBaseHop(store, cur, trust, &prev, &pruned, report));
    if (pruned) break;  // only what is left can be used
    back.push_back(std::move(prev));
  }
  return UnderTrust(trust, ChooseRoute(store, walk, only_chain, route));
}

namespace {

// A hop's deltas continue the hop before it (PROTOCOL.md, "Reading a route"): the same
// shard count, and each applied delta's base_incarnation that root's incarnation.
// The first hop of a route from the region's step continues that step, whose incarnation
// the region recorded (count: PlanRoute checked it).
Status CheckLinks(const Route& route) {
  for (size_t h = 0; h < route.hops.size(); ++h) {
    const Hop& hop = route.hops[h];
    const bool from_region = h == 0;
    if (from_region && (!route.from_dir || route.from_incarnation.empty())) continue;
    const uint64_t base_step = from_region ? hop.m.base_step : route.hops[h - 1].m.step;
    const uint32_t base_count = from_region ? hop.m.count : route.hops[h - 1].m.count;
    const std::string& base_incarnation = from_region ? route.from_incarnation : route.hops[h - 1].m.incarnation;
    for (size_t k = 0; k < hop.m.count; ++k) {
      const ShardRecord& r = hop.m.shards[k];
      if (hop.anchor[k] || !r.loaded) continue;
      if (hop.m.count != base_count || r.base_incarnation != base_incarnation) {
        return Status(ErrorCode::kCorruptHeader,
                      "step " + std::to_string(hop.m.step) + " shard " + std::to_string(k) +
                          " continues incarnation '" + r.base_incarnation + "' of " + std::to_string(hop.m.count) +
                          " shards, but its base step " + std::to_string(base_step) + " is incarnation '" +
                          base_incarnation + "' of " + std::to_string(base_count));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status LoadRoute(Store* store, const Select* select, LayoutCache* layouts, Route* route, PullReport* report,
                 const Trust& trust) {
  const uint32_t count = route->hops.back().m.count;
  ReadCost cost;
  Status s;
  route->touched.assign(count, true);
  if (select != nullptr) {
    // The layouts first (cached by hash: a run's layout rarely changes), then the records
    // of the shards that hold a selected tensor at some hop.
    const std::vector<bool> none(count, false);
    std::fill(route->touched.begin(), route->touched.end(), false);
    for (Hop& hop : route->hops) {
      s = LoadShards(store, &hop.m, &none, layouts, &cost, trust.on());
      if (!s.ok()) break;
      for (size_t k = 0; k < hop.m.count && k < count; ++k) {
        for (const TensorChecksum& t : hop.m.shards[k].tensors) {
          if (!route->touched[k] && std::regex_match(t.name, select->pattern)) route->touched[k] = true;
        }
      }
    }
  }
  for (Hop& hop : route->hops) {
    if (!s.ok()) break;
    s = LoadShards(store, &hop.m, select != nullptr ? &route->touched : nullptr, layouts, &cost, trust.on());
    hop.anchor.assign(hop.m.count, true);
    const bool start = !route->from_dir && hop.m.step == route->anchor_step;
    for (size_t k = 0; k < hop.m.count; ++k) hop.anchor[k] = start || !hop.m.shards[k].delta.present();
  }
  if (s.ok()) s = CheckLinks(*route);
  report->requests += cost.requests;
  report->fetched_bytes += cost.bytes;
  return UnderTrust(trust, s);
}

namespace {

// Bytes [offset, offset + size) of an object into `out`, fetched in blocks: `size` comes
// from a document, so the buffer grows only as the store delivers bytes.
constexpr uint64_t kFetchBlock = uint64_t{16} << 20;

Status GetGrowing(Store* store, const std::string& key, uint64_t offset, uint64_t size,
                  std::vector<uint8_t>* out) {
  out->clear();
  while (out->size() < size) {
    const uint64_t at = out->size();
    const uint64_t n = std::min(kFetchBlock, size - at);
    out->resize(at + n);
    ARC_V3_RETURN_IF_ERROR(store->GetRange(key, offset + at, n, out->data() + at));
  }
  return Status::Ok();
}

}  // namespace

RangeSource::RangeSource(uint64_t size, Store* store, std::string key, PullReport* report)
    : size_(size), store_(store), key_(std::move(key)), report_(report) {}

void RangeSource::Add(uint64_t offset, std::vector<uint8_t> bytes) { ranges_[offset] = std::move(bytes); }

void RangeSource::Release() {
  std::map<uint64_t, std::vector<uint8_t>>().swap(ranges_);
}

Status RangeSource::Check(uint64_t offset, uint64_t size, const uint8_t* data) const {
  if (!checked_ || size == 0) return Status::Ok();
  const auto it = digests_.find(offset);
  if (it == digests_.end() || it->second.first != size) {
    return Status(ErrorCode::kUntrusted, key_ + ": bytes " + std::to_string(offset) + "+" + std::to_string(size) +
                                             " are no range its signed digests name");
  }
  if (Sha256(data, size) != it->second.second) {
    return Status(ErrorCode::kUntrusted, key_ + ": bytes " + std::to_string(offset) + "+" + std::to_string(size) +
                                             " differ from their signed SHA-256");
  }
  return Status::Ok();
}

Status RangeSource::Read(uint64_t offset, uint64_t size, std::vector<uint8_t>* scratch, const uint8_t** data) const {
  auto it = ranges_.upper_bound(offset);
  if (it != ranges_.begin()) {
    --it;
    if (offset >= it->first && offset - it->first <= it->second.size() &&
        size <= it->second.size() - (offset - it->first)) {
      *data = it->second.data() + (offset - it->first);
      return Check(offset, size, *data);
    }
  }
  if (store_ == nullptr || offset > size_ || size > size_ - offset) {
    return Status(ErrorCode::kInternal, "bytes " + std::to_string(offset) + "+" + std::to_string(size) +
                                            " of a partially fetched container were not fetched");
  }
  ARC_V3_RETURN_IF_ERROR(GetGrowing(store_, key_, offset, size, scratch));
  ARC_V3_RETURN_IF_ERROR(Check(offset, size, scratch->data()));
  if (report_ != nullptr) {
    static std::mutex mutex;  // several sources may count into one report
    std::lock_guard<std::mutex> lock(mutex);
    report_->requests += 1;
    report_->fetched_bytes += size;
  }
  *data = scratch->data();
  return Status::Ok();
}


bool Groupable(const TensorEntry& t) {
  const uint64_t elements = t.dtype == "BF16" ? t.bytes() / 2 : 0;
  return t.grouped() || (elements > 0 && elements < kGroupBelowElements);
}


Need Needed(const TensorEntry& t, const Select& select, bool keep_small) {
  const uint64_t rows = t.rows();
  if (t.bytes() == 0 || rows == 0) return {};
  if (keep_small && Groupable(t)) return {0, rows};
  if (!std::regex_match(t.name, select.pattern)) return {};
  if (t.grouped()) return {0, rows};
  const Selection& sel = select.sel;
  const uint64_t a = t.shape.empty() ? 0 : std::min(sel.row_begin, rows);
  const uint64_t b = t.shape.empty() ? 1 : std::min(sel.row_end, rows);
  if (a >= b) return {};
  Need need{rows, 0};
  for (const Piece& p : t.pieces) {
    if (p.row_end > a && p.row_begin < b) {
      need.begin = std::min(need.begin, p.row_begin);
      need.end = std::max(need.end, p.row_end);
    }
  }
  return need;
}

std::vector<std::pair<uint64_t, uint64_t>> NeededRanges(const Reader& reader, const Select& select,
                                                        bool keep_small) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  const FileEntry& f = reader.manifest().files[0];
  const uint64_t data = reader.data_start();
  std::set<uint64_t> groups;
  for (const TensorEntry& t : f.tensors) {
    const Need need = Needed(t, select, keep_small);
    if (need.empty()) continue;
    if (t.grouped()) {
      if (groups.insert(t.group).second) {
        ranges.emplace_back(data + f.groups[t.group].offset, f.groups[t.group].size);
      }
      continue;
    }
    for (const Piece& p : t.pieces) {
      if (p.row_end > need.begin && p.row_begin < need.end) ranges.emplace_back(data + p.offset, p.size);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (const auto& r : ranges) {
    if (r.second == 0) continue;
    if (!merged.empty() && r.first <= merged.back().first + merged.back().second + kMergeGap) {
      const uint64_t end = std::max(merged.back().first + merged.back().second, r.first + r.second);
      merged.back().second = end - merged.back().first;
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}


const FileEntry& Fetched::file() const {
  static const FileEntry kNoTensors;
  return skipped ? kNoTensors : reader.manifest().files[0];
}

Status FetchHeads(Store* store, const StoreOptions& options, Select* select, std::vector<Fetched>* fetched,
                  PullReport* report, const Trust& trust) {
  std::mutex mutex;
  Status first;
  const auto start = Clock::now();
  // The heads: container header and manifest, checked against the shard's record.
  const Status thrown = TryParallelFor(fetched->size(), WorkerCount(std::max(1, options.connections), fetched->size()), [&](size_t i, size_t) {
    Fetched& f = (*fetched)[i];
    if (f.skipped) return;
    std::vector<uint8_t> head;
    Status s = GetGrowing(store, f.ref.key, 0, f.ref.head_size, &head);
    const std::string name = store->url() + "/" + f.ref.key;
    if (s.ok() && trust.on() && f.ref.head_sha256.empty()) {
      s = Status(ErrorCode::kUntrusted, name + ": its record names no SHA-256 (not a signed record)");
    }
    // Trusting, the SHA-256 decides first; else damage fails the XXH3 (corrupt: another
    // route may do), and only bytes made to pass it fail the SHA-256.
    const bool sha_differs = s.ok() && !f.ref.head_sha256.empty() &&
                             DigestHex(Sha256(head.data(), head.size())) != f.ref.head_sha256;
    if (sha_differs && trust.on()) {
      s = Status(ErrorCode::kUntrusted, name + ": its header or manifest differs from its record's SHA-256");
    }
    if (s.ok() && checkpoint::Hash(head.data(), head.size()) != f.ref.head_xxh3) {
      s = Status(ErrorCode::kCorruptChunk, name + ": its header or manifest does not match its record");
    }
    if (s.ok() && sha_differs) {
      s = Status(ErrorCode::kUntrusted, name + ": its header or manifest differs from its record's SHA-256");
    }
    std::vector<uint8_t> sums;
    if (s.ok() && trust.on()) {
      // The digest of every range of its data section, itself named by the record.
      s = store->Get(SumsKey(f.ref.key), std::min(f.ref.sums_size, kMaxDocumentBytes), &sums, nullptr);
      if (s.ok() && (sums.size() != f.ref.sums_size || DigestHex(Sha256(sums.data(), sums.size())) != f.ref.sums_sha256)) {
        s = Status(ErrorCode::kUntrusted, store->url() + "/" + SumsKey(f.ref.key) +
                                              " differs from its record's SHA-256");
      }
    }
    if (s.ok()) {
      auto source = std::make_unique<RangeSource>(f.ref.size, store, f.ref.key, report);
      const uint64_t head_size = head.size();
      source->Add(0, std::move(head));
      f.source = source.get();
      s = Reader::Open(std::move(source), &f.reader);
      if (s.ok()) s = CheckLayout(f.reader, *f.record, name);
      if (s.ok() && trust.on()) {
        const auto ranges = StoredRanges(f.reader.manifest());
        if (ranges.size() * 32 != sums.size()) {
          s = Status(ErrorCode::kUntrusted, name + ": its signed piece digests do not list its pieces");
        } else {
          std::map<uint64_t, std::pair<uint64_t, Digest>> digests;
          for (size_t r = 0; r < ranges.size(); ++r) {
            Digest d;
            std::copy(sums.begin() + 32 * r, sums.begin() + 32 * (r + 1), d.begin());
            digests[head_size + ranges[r].first] = {ranges[r].second, d};
          }
          f.source->SetDigests(std::move(digests));
        }
      }
      s = InContext(name, s);
    }
    s = UnderTrust(trust, s);
    std::lock_guard<std::mutex> lock(mutex);
    report->requests += 1 + (trust.on() ? 1 : 0);
    report->fetched_bytes += f.ref.head_size + sums.size();
    if (!s.ok() && first.ok()) first = s;
  });
  if (!thrown.ok()) return thrown;
  if (!first.ok()) return first;
  // Groups need their members' bases where a selected tensor may be grouped (at any hop).
  for (const Fetched& f : *fetched) {
    if (select->keep_small.size() <= f.shard) select->keep_small.resize(f.shard + 1, false);
    for (const TensorEntry& t : f.file().tensors) {
      if (Groupable(t) && std::regex_match(t.name, select->pattern)) select->keep_small[f.shard] = true;
    }
  }
  for (const Fetched& f : *fetched) report->fetched_objects += !f.skipped;
  report->fetch_seconds += SecondsSince(start);
  return Status::Ok();
}

uint64_t NeededBytes(const Fetched& f, const Select& select) {
  if (f.skipped) return 0;
  uint64_t bytes = 0;
  for (const auto& r : NeededRanges(f.reader, select, select.keep_small[f.shard])) bytes += r.second;
  return bytes;
}

Status FetchRanges(Store* store, const StoreOptions& options, uint64_t prefetch_limit, uint64_t budget,
                   const Select& select, const std::vector<size_t>& objects, std::vector<Fetched>* fetched,
                   PullReport* report) {
  const auto start = Clock::now();
  // The pieces the selection needs, neighbours merged.
  struct Range {
    size_t object;
    uint64_t offset, size;
  };
  std::vector<Range> ranges;
  uint64_t held = 0;
  for (size_t i : objects) {
    const Fetched& f = (*fetched)[i];
    if (f.skipped) continue;
    const auto needed = NeededRanges(f.reader, select, select.keep_small[f.shard]);
    uint64_t bytes = 0;
    for (const auto& r : needed) bytes += r.second;
    // Past either bound an object's pieces are read one by one as they are decoded.
    if (bytes > prefetch_limit || bytes > budget - held) continue;
    held += bytes;
    for (const auto& r : needed) ranges.push_back({i, r.first, r.second});
  }
  std::vector<std::vector<uint8_t>> data(ranges.size());
  std::mutex mutex;
  Status first;
  const Status thrown = TryParallelFor(ranges.size(), WorkerCount(std::max(1, options.connections), ranges.size()), [&](size_t i, size_t) {
    const Status s = GetGrowing(store, (*fetched)[ranges[i].object].ref.key, ranges[i].offset, ranges[i].size, &data[i]);
    std::lock_guard<std::mutex> lock(mutex);
    if (!s.ok() && first.ok()) first = s;
  });
  if (!thrown.ok()) return thrown;
  if (!first.ok()) return first;
  for (size_t i = 0; i < ranges.size(); ++i) {
    report->fetched_bytes += ranges[i].size;
    (*fetched)[ranges[i].object].source->Add(ranges[i].offset, std::move(data[i]));
  }
  report->requests += ranges.size();
  report->fetch_seconds += SecondsSince(start);
  return Status::Ok();
}

Status FetchPieces(Store* store, const StoreOptions& options, uint64_t prefetch_limit, Select* select,
                   std::vector<Fetched>* fetched, PullReport* report, uint64_t budget, const Trust& trust) {
  ARC_V3_RETURN_IF_ERROR(FetchHeads(store, options, select, fetched, report, trust));
  std::vector<size_t> all(fetched->size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return FetchRanges(store, options, prefetch_limit, budget, *select, all, fetched, report);
}


Status ReadTarget(Store* store, uint64_t step, Hop* target, PullReport* report, const Trust& trust) {
  const bool latest = step == kLatestStep;
  if (!latest && step > kMaxStep) {
    return Status(ErrorCode::kInvalidArgument, "there is no step " + std::to_string(step) + ": steps are at most " +
                                                   std::to_string(kMaxStep) + " (kLatestStep asks for the newest)");
  }
  if (latest) {
    Status s = ReadLatest(store, &step, nullptr);
    report->requests += 1;
    if (!s.ok()) return UnderTrust(trust, s);
    const uint64_t named = step;
    step = ProbeLater(store, step);
    report->requests += step - named + 1;
  }
  std::vector<uint8_t> bytes;
  Status s = ReadRoot(store, step, &target->m, &bytes);
  report->requests += 1;
  report->fetched_bytes += bytes.size();
  if (s.code() == ErrorCode::kNotFound && latest) {
    return Status(ErrorCode::kNotFound, "the latest pointer of " + store->url() + " names step " +
                                            std::to_string(step) + ", which is not committed (no root); " +
                                            "nothing was changed");
  }
  if (s.code() == ErrorCode::kNotFound) {
    // A store arc_v3 1.x published to has no roots, and a `latest` of version 1.
    uint64_t ignored = 0;
    const Status latest_status = ReadLatest(store, &ignored, nullptr);
    if (latest_status.code() == ErrorCode::kUnsupportedVersion) return latest_status;
  }
  ARC_V3_RETURN_IF_ERROR(UnderTrust(trust, s));
  ARC_V3_RETURN_IF_ERROR(CheckTrusted(trust, target->m, store->url() + "/" + RootKey(step)));
  target->manifest_xxh3 = checkpoint::Hash(bytes.data(), bytes.size());
  target->root_sha256 = DigestHex(Sha256(bytes.data(), bytes.size()));
  report->to_step = step;
  report->published_at = target->m.published_at;
  report->committed_at = target->m.committed_at;
  return Status::Ok();
}

}  // namespace sync
}  // namespace arc_v3
