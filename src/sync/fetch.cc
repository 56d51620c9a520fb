// Fetching the heads and pieces of a route's containers (see fetch.h).
#include "src/sync/fetch.h"

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
    return Status(ErrorCode::kCorruptHeader, name + " holds '" + file.name + "' of " +
                                                 std::to_string(file.size) +
                                                 " bytes, not the record's '" + record.file +
                                                 "' of " + std::to_string(record.file_size));
  }
  // Read beside its layout (a partial read), its tensors are the layout's.
  if (record.named && DataOrderNames(file.tensors) != record.names) {
    return Status(ErrorCode::kCorruptHeader,
                  name + ": its tensors are not the ones its layout lists");
  }
  return Status::Ok();
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

void RangeSource::Add(uint64_t offset, std::vector<uint8_t> bytes) {
  ranges_[offset] = std::move(bytes);
}

void RangeSource::Release() { std::map<uint64_t, std::vector<uint8_t>>().swap(ranges_); }

Status RangeSource::Check(uint64_t offset, uint64_t size, const uint8_t* data) const {
  if (!checked_ || size == 0) return Status::Ok();
  const auto it = digests_.find(offset);
  if (it == digests_.end() || it->second.first != size) {
    return Status(ErrorCode::kUntrusted, key_ + ": bytes " + std::to_string(offset) + "+" +
                                             std::to_string(size) +
                                             " are no range its signed digests name");
  }
  if (Sha256(data, size) != it->second.second) {
    return Status(ErrorCode::kUntrusted, key_ + ": bytes " + std::to_string(offset) + "+" +
                                             std::to_string(size) +
                                             " differ from their signed SHA-256");
  }
  return Status::Ok();
}

Status RangeSource::Read(uint64_t offset, uint64_t size, std::vector<uint8_t>* scratch,
                         const uint8_t** data) const {
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
    return Status(ErrorCode::kInternal, "bytes " + std::to_string(offset) + "+" +
                                            std::to_string(size) +
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
      if (p.row_end > need.begin && p.row_begin < need.end)
        ranges.emplace_back(data + p.offset, p.size);
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

namespace {

// Fetches one container's head (header and manifest), checks it against the record (and,
// trusting, its piece digests, read into `sums`), and opens its reader.
Status FetchHead(Store* store, const Trust& trust, PullReport* report, Fetched* fetched,
                 std::vector<uint8_t>* sums_out) {
  Fetched& f = *fetched;
  std::vector<uint8_t>& sums = *sums_out;
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
    s = Status(ErrorCode::kUntrusted,
               name + ": its header or manifest differs from its record's SHA-256");
  }
  if (s.ok() && checkpoint::Hash(head.data(), head.size()) != f.ref.head_xxh3) {
    s = Status(ErrorCode::kCorruptChunk,
               name + ": its header or manifest does not match its record");
  }
  if (s.ok() && sha_differs) {
    s = Status(ErrorCode::kUntrusted,
               name + ": its header or manifest differs from its record's SHA-256");
  }
  if (s.ok() && trust.on()) {
    // The digest of every range of its data section, itself named by the record.
    s = store->Get(SumsKey(f.ref.key), std::min(f.ref.sums_size, kMaxDocumentBytes), &sums,
                   nullptr);
    if (s.ok() && (sums.size() != f.ref.sums_size ||
                   DigestHex(Sha256(sums.data(), sums.size())) != f.ref.sums_sha256)) {
      s = Status(ErrorCode::kUntrusted,
                 store->url() + "/" + SumsKey(f.ref.key) + " differs from its record's SHA-256");
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
        s = Status(ErrorCode::kUntrusted,
                   name + ": its signed piece digests do not list its pieces");
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
  return s;
}

}  // namespace

Status FetchHeads(Store* store, const StoreOptions& options, Select* select,
                  std::vector<Fetched>* fetched, PullReport* report, const Trust& trust) {
  std::mutex mutex;
  Status first;
  const auto start = Clock::now();
  // The heads: container header and manifest, checked against the shard's record.
  const Status thrown = TryParallelFor(
      fetched->size(), WorkerCount(std::max(1, options.connections), fetched->size()),
      [&](size_t i, size_t) {
        Fetched& f = (*fetched)[i];
        if (f.skipped) return;
        std::vector<uint8_t> sums;
        Status s = FetchHead(store, trust, report, &f, &sums);
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
      if (Groupable(t) && std::regex_match(t.name, select->pattern))
        select->keep_small[f.shard] = true;
    }
  }
  for (const Fetched& f : *fetched) report->fetched_objects += !f.skipped;
  report->fetch_seconds += SecondsSince(start);
  return Status::Ok();
}

uint64_t NeededBytes(const Fetched& f, const Select& select) {
  if (f.skipped) return 0;
  uint64_t bytes = 0;
  for (const auto& r : NeededRanges(f.reader, select, select.keep_small[f.shard]))
    bytes += r.second;
  return bytes;
}

Status FetchRanges(Store* store, const StoreOptions& options, uint64_t prefetch_limit,
                   uint64_t budget, const Select& select, const std::vector<size_t>& objects,
                   std::vector<Fetched>* fetched, PullReport* report) {
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
  const Status thrown =
      TryParallelFor(ranges.size(), WorkerCount(std::max(1, options.connections), ranges.size()),
                     [&](size_t i, size_t) {
                       const Status s = GetGrowing(store, (*fetched)[ranges[i].object].ref.key,
                                                   ranges[i].offset, ranges[i].size, &data[i]);
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

Status FetchPieces(Store* store, const StoreOptions& options, uint64_t prefetch_limit,
                   Select* select, std::vector<Fetched>* fetched, PullReport* report,
                   uint64_t budget, const Trust& trust) {
  ARC_V3_RETURN_IF_ERROR(FetchHeads(store, options, select, fetched, report, trust));
  std::vector<size_t> all(fetched->size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return FetchRanges(store, options, prefetch_limit, budget, *select, all, fetched, report);
}

}  // namespace sync
}  // namespace arc_v3
