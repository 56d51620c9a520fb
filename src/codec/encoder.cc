// delta_compress (src/codec/FORMAT.md).
//
// Format::kPublished (format version 1), the scheme as published. Per chunk: XOR + classify
// (ClassifyChanges), compact the changed elements (CompactChanges), then build three
// streams - positions, 7-bit mantissa XORs, and one record per sign/exponent change - and
// race each through the general-purpose compressors.
//
// Format::kDefault (format version 16; several tensors in one frame are coded as their
// concatenation): each chunk is coded by the context-modelled coder
// (model_coder.h), which predicts the delta from the previous weights, or where changes
// are dense by the rANS coder (rans_coder.h, PreferRans); at effort 0 by the XOR streams
// with LZ4 only (fastest), and at effort 3 all three race and the smallest wins. Session
// chunks use the history in both codings.
//
// Chunks are independent, so they are coded in parallel and concatenated in order; the
// bytes do not depend on the thread count or the SIMD target.
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "src/codec/codec_internal.h"
#include "src/codec/entropy.h"
#include "src/codec/format.h"
#include "src/codec/kernels.h"
#include "src/codec/model_coder.h"
#include "src/codec/rans_coder.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"

namespace arc_v3 {
namespace {

// Per-thread buffers, reused across chunks.
struct EncoderScratch {
  StreamCompressor compressor;
  std::vector<uint32_t> positions;
  std::vector<uint16_t> xors;
  std::vector<uint8_t> raw;  // one stream before compression
  std::vector<uint8_t> bitmap_stream, gaps_stream;
  std::vector<uint8_t> modelled;
  RansScratch rans_words;  // EncodeChunkRans' scratch
  // On one thread: the frame's checksums, fed slice by slice as chunks are read.
  ChecksumStream* target_stream = nullptr;
  ChecksumStream* base_stream = nullptr;
};

// ClassifyChanges of a chunk. With checksum streams, each slice is also hashed right after
// it is counted, while it is in cache: one pass over memory for both.
ChangeCounts CountChanges(const uint16_t* src, const uint16_t* dst, size_t len, EncoderScratch* s) {
  if (s->target_stream == nullptr) return ClassifyChanges(src, dst, len);
  constexpr size_t kSlice = 16384;
  ChangeCounts total;
  for (size_t begin = 0; begin < len; begin += kSlice) {
    const size_t n = std::min(kSlice, len - begin);
    const ChangeCounts counts = ClassifyChanges(src + begin, dst + begin, n);
    total.changed += counts.changed;
    total.high += counts.high;
    s->target_stream->Update(dst + begin, n);
    if (s->base_stream != nullptr) s->base_stream->Update(src + begin, n);
  }
  return total;
}

void BuildBitmap(const uint32_t* positions, size_t n, size_t chunk_len, std::vector<uint8_t>* raw) {
  raw->assign((chunk_len + 7) / 8, 0);
  for (size_t k = 0; k < n; ++k) (*raw)[positions[k] >> 3] |= 1u << (positions[k] & 7);
}

void BuildGaps(const uint32_t* positions, size_t n, std::vector<uint8_t>* raw) {
  raw->clear();
  uint32_t next = 0;  // first position the next gap counts from
  for (size_t k = 0; k < n; ++k) {
    PutVarint(positions[k] - next, raw);
    next = positions[k] + 1;
  }
}

// Records of the changes that touch sign or exponent: varint (rank - previous rank - 1)
// among the changed elements, then the XOR's upper 9 bits as u16 little-endian.
void BuildHighRecords(const uint16_t* xors, size_t n, std::vector<uint8_t>* raw) {
  raw->clear();
  size_t next = 0;
  for (size_t k = 0; k < n; ++k) {
    if ((xors[k] & kHighFieldMask) == 0) continue;
    PutVarint(k - next, raw);
    const uint16_t high = static_cast<uint16_t>(xors[k] >> 7);
    raw->push_back(static_cast<uint8_t>(high));
    raw->push_back(static_cast<uint8_t>(high >> 8));
    next = k + 1;
  }
}

// Density above which a bitmap is chosen without trying gaps (effort < 2): beyond 1/8 a
// raw bitmap costs less than a byte per change, which LZ4 (no entropy stage) cannot beat
// with byte-sized gaps. See src/codec/FORMAT.md "Choosing the position mode" (measurements:
// docs/format_notes.md, "Payload format, Choosing the position mode").
constexpr double kBitmapDensity = 1.0 / 8;

// Appends the XOR-stream chunk body (src/codec/FORMAT.md "XOR-stream chunk") for a chunk with
// changes.
void EncodeXorStreams(const uint16_t* src, const uint16_t* dst, size_t chunk_len,
                      const ChangeCounts& counts, const RaceEntrants& entrants, int effort,
                      EncoderScratch* s, std::vector<uint8_t>* out) {
  PutVarint(counts.changed, out);
  PutVarint(counts.high, out);

  const size_t n = counts.changed;
  s->positions.resize(n);
  s->xors.resize(n);
  // ClassifyChanges counted exactly these changes, so n entries are written.
  CompactChanges(src, dst, chunk_len, s->positions.data(), s->xors.data());

  uint8_t codec;
  uint8_t mode;
  const bool try_both = effort >= 2;
  const bool dense = static_cast<double>(n) > kBitmapDensity * static_cast<double>(chunk_len);
  if (try_both || dense) {
    BuildBitmap(s->positions.data(), n, chunk_len, &s->raw);
    s->bitmap_stream.clear();
    s->compressor.AppendStream(s->raw.data(), s->raw.size(), entrants, &s->bitmap_stream, &codec);
  }
  if (try_both || !dense) {
    BuildGaps(s->positions.data(), n, &s->raw);
    s->gaps_stream.clear();
    s->compressor.AppendStream(s->raw.data(), s->raw.size(), entrants, &s->gaps_stream, &codec);
  }
  const bool use_bitmap = try_both ? s->bitmap_stream.size() <= s->gaps_stream.size() : dense;
  mode = use_bitmap ? kPositionsBitmap : kPositionsGaps;
  out->push_back(mode);
  const std::vector<uint8_t>& positions = use_bitmap ? s->bitmap_stream : s->gaps_stream;
  out->insert(out->end(), positions.begin(), positions.end());

  s->raw.resize(PackedMantissaBytes(n));
  PackMantissas(s->xors.data(), n, s->raw.data());
  s->compressor.AppendStream(s->raw.data(), s->raw.size(), entrants, out, &codec);

  if (counts.high > 0) {
    BuildHighRecords(s->xors.data(), n, &s->raw);
    s->compressor.AppendStream(s->raw.data(), s->raw.size(), entrants, out, &codec);
  }
}

// Version 1 chunk: the XOR streams, or a lone 0 when nothing changed.
Status EncodeChunkPublished(const uint16_t* src, const uint16_t* dst, size_t chunk_len,
                            const uint8_t* /*history*/, const CarriedModel& /*carried*/,
                            const std::vector<uint32_t>* /*sign_periods*/,
                            const RaceEntrants& entrants, int effort, EncoderScratch* s,
                            std::vector<uint8_t>* out) {
  out->clear();
  const ChangeCounts counts = CountChanges(src, dst, chunk_len, s);
  if (counts.changed == 0) {
    out->push_back(0);
    return Status::Ok();
  }
  EncodeXorStreams(src, dst, chunk_len, counts, entrants, effort, s, out);
  return Status::Ok();
}

// rANS chunks decode several times faster than modelled ones where changes are dense, for
// about 90 header bytes (a third of them carrying escape data), and code about as small as
// a modelled chunk once a tensor has a few thousand changes. Efforts 1-2 take them from
// this density and change count on, the modelled coding below: from there on stateless
// payloads stay the same size or shrink, and decode faster. A session chunk needs twice
// the density: the modelled coder's history contexts gain more than rANS's. (Figures:
// docs/format_notes.md, "Codec implementation notes".)
bool PreferRans(uint64_t changes, size_t chunk_len, bool with_history) {
  const uint64_t density_inverse =
      with_history ? kRansMinDensityInverseWithHistory : kRansMinDensityInverse;
  return changes >= kRansMinChanges && changes * density_inverse >= chunk_len;
}

// Versions 2 to 8 chunk: a mode byte, then the coding chosen by the effort level.
Status RaceChunkCodings(const uint16_t* src, const uint16_t* dst, size_t chunk_len,
                        const uint8_t* history, const CarriedModel& carried,
                        const std::vector<uint32_t>* sign_periods, const RaceEntrants& entrants,
                        int effort, EncoderScratch* s, std::vector<uint8_t>* out) {
  out->clear();
  const ChangeCounts counts = CountChanges(src, dst, chunk_len, s);
  if (counts.changed == 0) {
    out->push_back(kChunkUnchanged);
    return Status::Ok();
  }
  // In a session the modelled and rANS codings use the history (rANS only where it pays
  // for its header bytes: not in a session's first step, which has none).
  const bool rans_first = PreferRans(counts.changed, chunk_len, history != nullptr);
  const bool try_xor_streams = effort == 0 || effort == 3;
  const bool try_modelled = effort == 3 || (effort > 0 && !rans_first);
  const bool try_rans = effort == 3 || (effort > 0 && rans_first);
  if (try_xor_streams) {
    out->push_back(kChunkXorStreams);
    EncodeXorStreams(src, dst, chunk_len, counts, entrants, effort, s, out);
  }
  if (try_modelled) {
    s->modelled.clear();
    s->modelled.push_back(kChunkModelled);
    ARC_V3_RETURN_IF_ERROR(EncodeChunkModelled(src, dst, chunk_len, &s->modelled, history,
                                               counts.changed, carried, sign_periods));
    if (out->empty() || s->modelled.size() < out->size()) out->swap(s->modelled);
  }
  if (try_rans) {
    if (!try_xor_streams) {  // else EncodeXorStreams compacted them into s already
      s->positions.resize(counts.changed);
      s->xors.resize(counts.changed);
      CompactChanges(src, dst, chunk_len, s->positions.data(), s->xors.data());
    }
    s->modelled.clear();
    s->modelled.push_back(kChunkRans);
    bool with_history = false;
    ARC_V3_RETURN_IF_ERROR(EncodeChunkRans(src, dst, chunk_len, s->positions.data(), counts.changed,
                                           &s->modelled, &s->rans_words, history, &with_history));
    if (with_history) s->modelled[0] = kChunkRansHistory;
    if (out->empty() || s->modelled.size() < out->size()) out->swap(s->modelled);
  }
  return Status::Ok();
}

// `carried`: a session's model for this chunk (its `end` is reset unless the chunk ends up
// modelled, the only coding a decoder learns a state from).
Status EncodeChunkDefault(const uint16_t* src, const uint16_t* dst, size_t chunk_len,
                          const uint8_t* history, const CarriedModel& carried,
                          const std::vector<uint32_t>* sign_periods, const RaceEntrants& entrants,
                          int effort, EncoderScratch* s, std::vector<uint8_t>* out) {
  const Status status = RaceChunkCodings(src, dst, chunk_len, history, carried, sign_periods,
                                         entrants, effort, s, out);
  if (carried.end != nullptr && (!status.ok() || (*out)[0] != kChunkModelled)) {
    carried.end->reset();
  }
  return status;
}

// Column signs try the row lengths of the tensor that holds most of a
// chunk: the divisors of its element count. Per chunk, an index into `candidates`.
struct SignPeriods {
  std::vector<std::vector<uint32_t>> candidates;
  std::vector<size_t> of_chunk;
};
SignPeriods ChooseSignPeriodCandidates(uint64_t count, const std::vector<uint64_t>* tensors,
                                       size_t chunk_elements, size_t num_chunks) {
  SignPeriods periods;
  periods.of_chunk.resize(num_chunks);
  if (tensors == nullptr) {
    periods.candidates.push_back(SignPeriodCandidates(count));
    return periods;
  }
  size_t tensor = 0;
  uint64_t tensor_begin = 0;  // of `tensor`
  size_t last_dominant = ~size_t{0};
  for (size_t c = 0; c < num_chunks; ++c) {
    const uint64_t begin = uint64_t{c} * chunk_elements;
    const uint64_t end = std::min<uint64_t>(begin + chunk_elements, count);
    // The tensors overlapping [begin, end), in order; the largest overlap wins.
    while (tensor + 1 < tensors->size() && tensor_begin + (*tensors)[tensor] <= begin) {
      tensor_begin += (*tensors)[tensor++];
    }
    size_t dominant = tensor;
    uint64_t dominant_overlap = 0;
    for (size_t t = tensor, at = tensor_begin; t < tensors->size() && at < end;
         at += (*tensors)[t++]) {
      const uint64_t overlap =
          std::min<uint64_t>(at + (*tensors)[t], end) - std::max<uint64_t>(at, begin);
      if (overlap > dominant_overlap) {
        dominant_overlap = overlap;
        dominant = t;
      }
    }
    if (dominant != last_dominant) {
      periods.candidates.push_back(SignPeriodCandidates((*tensors)[dominant]));
      last_dominant = dominant;
    }
    periods.of_chunk[c] = periods.candidates.size() - 1;
  }
  return periods;
}

int ChunkLog(uint32_t chunk_elements) {
  int log = 0;
  while ((uint64_t{1} << log) < chunk_elements) ++log;
  return log;
}

// EncodeFrame's arguments, but for the output.
struct FrameToEncode {
  const uint16_t* src;
  const uint16_t* dst;
  size_t count;
  const Options& options;
  const uint8_t* history;
  const SessionFrame* session;
  const std::vector<uint64_t>* tensors;
};

// Checks the options against the frame and picks its chunk size's log2.
Status ChooseFrameChunkLog(const FrameToEncode& in, int* chunk_log) {
  const Options& options = in.options;
  if (options.effort < 0 || options.effort > 3) {
    return Status(ErrorCode::kInvalidArgument, "effort must be in 0..3");
  }
  if (options.threads < 0) return Status(ErrorCode::kInvalidArgument, "threads must be >= 0");
  if (options.format != Format::kDefault && options.format != Format::kPublished) {
    return Status(ErrorCode::kInvalidArgument, "unknown format");
  }
  if (in.session != nullptr && options.format == Format::kPublished) {
    return Status(ErrorCode::kInvalidArgument, "sessions need the default format");
  }
  if (in.tensors != nullptr && options.format == Format::kPublished) {
    return Status(ErrorCode::kInvalidArgument,
                  "several tensors in one payload need the default format");
  }
  *chunk_log = ChunkLog(options.chunk_elements);
  if ((uint64_t{1} << *chunk_log) != options.chunk_elements || *chunk_log < kMinChunkLog ||
      *chunk_log > kMaxChunkLog) {
    return Status(ErrorCode::kInvalidArgument,
                  "chunk_elements must be a power of two in [2^10, 2^24]");
  }
  // A second chunk of under an eighth of the first would pay its own header and learn its
  // probabilities again for little (docs/format_notes.md): one chunk of twice the size.
  const size_t requested = options.chunk_elements;
  if (in.count > requested && in.count - requested <= requested / 8 && *chunk_log < kMaxChunkLog) {
    ++*chunk_log;
  }
  return Status::Ok();
}

// Encodes the chunks of `chunk_elements` (on options.threads) into `chunks`, and the
// checksums of dst and (base_checksum not null) src.
Status EncodeFrameChunks(const FrameToEncode& in, size_t chunk_elements,
                         std::vector<std::vector<uint8_t>>* chunks, uint64_t* target_checksum,
                         uint64_t* base_checksum) {
  const size_t num_chunks = (in.count + chunk_elements - 1) / chunk_elements;
  const RaceEntrants entrants = EntrantsForEffort(in.options.effort);
  const bool published = in.options.format == Format::kPublished;
  const auto encode_chunk = published ? EncodeChunkPublished : EncodeChunkDefault;
  const size_t num_workers = WorkerCount(in.options.threads, num_chunks);
  std::vector<std::unique_ptr<EncoderScratch>> scratch(num_workers);
  for (auto& s : scratch) s.reset(new EncoderScratch);
  chunks->assign(num_chunks, {});
  std::vector<Status> status(num_chunks);
  // A session's models: each chunk starts from its own carried one, if any, and ends on
  // a new one.
  SessionFrame::PrepareNextModels(in.session, num_chunks);
  const SignPeriods sign_periods =
      published ? SignPeriods()
                : ChooseSignPeriodCandidates(in.count, in.tensors, chunk_elements, num_chunks);
  const auto encode = [&](size_t c, size_t worker) {
    const size_t begin = c * chunk_elements;
    const size_t len = std::min(chunk_elements, in.count - begin);
    const CarriedModel carried = SessionFrame::CarriedFor(in.session, c);
    const std::vector<uint32_t>* periods =
        published ? nullptr : &sign_periods.candidates[sign_periods.of_chunk[c]];
    try {
      status[c] = encode_chunk(
          in.src + begin, in.dst + begin, len, in.history != nullptr ? in.history + begin : nullptr,
          carried, periods, entrants, in.options.effort, scratch[worker].get(), &(*chunks)[c]);
    } catch (const std::bad_alloc&) {
      status[c] = Status(ErrorCode::kOutOfMemory, "out of memory while encoding");
    }
  };
  if (num_workers == 1) {
    // Chunks in order, hashed as they are read (CountChanges).
    ChecksumStream target_stream, base_stream;
    scratch[0]->target_stream = &target_stream;
    if (base_checksum != nullptr) scratch[0]->base_stream = &base_stream;
    for (size_t c = 0; c < num_chunks; ++c) {
      encode(c, 0);
      if (!status[c].ok()) return status[c];
    }
    *target_checksum = target_stream.Digest();
    if (base_checksum != nullptr) *base_checksum = base_stream.Digest();
    return Status::Ok();
  }
  ParallelFor(num_chunks, num_workers, encode);
  for (const Status& s : status) {
    if (!s.ok()) return s;
  }
  *target_checksum = Checksum(in.dst, in.count);
  if (base_checksum != nullptr) *base_checksum = Checksum(in.src, in.count);
  return Status::Ok();
}

// The frame header (src/codec/FORMAT.md) and the chunk sizes it stores.
void AppendFrameHeader(const FrameToEncode& in, int chunk_log,
                       const std::vector<std::vector<uint8_t>>& chunks,
                       std::vector<uint8_t>* bytes) {
  const bool published = in.options.format == Format::kPublished;
  for (const uint8_t byte : kMagic) bytes->push_back(byte);
  // A session step whose base is its last step's result, over the same tensors, names
  // neither (the receiver holds both).
  const bool continues = in.session != nullptr && in.session->ContinuesLastStep(in.tensors);
  const bool lists_tensors = in.tensors != nullptr && !continues;
  bytes->push_back(published ? kFormatVersionArcV3 : kFormatVersion);
  bytes->push_back(static_cast<uint8_t>((in.session != nullptr ? kFlagSession : 0) |
                                        (in.tensors != nullptr ? kFlagTensors : 0) |
                                        (continues ? kFlagContinues : 0)));
  PutVarint(in.count, bytes);
  bytes->push_back(static_cast<uint8_t>(chunk_log));
  if (in.session != nullptr) {
    if (!continues) PutU64(in.session->base_checksum, bytes);
    PutU64(in.session->history_id, bytes);
  }
  if (lists_tensors) {
    PutVarint(in.tensors->size(), bytes);
    PutU32(TensorListCheck(*in.tensors), bytes);
  }
  // But in version 1 the last chunk's size is left out: it runs to the end of the payload.
  const size_t stored_sizes = published || chunks.empty() ? chunks.size() : chunks.size() - 1;
  for (size_t c = 0; c < stored_sizes; ++c) PutVarint(chunks[c].size(), bytes);
}

}  // namespace

Status EncodeFrame(const uint16_t* src, const uint16_t* dst, size_t count, const Options& options,
                   const uint8_t* history, const SessionFrame* session, Delta* out,
                   uint64_t* base_checksum, const std::vector<uint64_t>* tensors) {
  if (out == nullptr) return Status(ErrorCode::kInvalidArgument, "out is null");
  if (count > 0 && (src == nullptr || dst == nullptr)) {
    return Status(ErrorCode::kInvalidArgument, "src or dst is null");
  }
  const FrameToEncode in = {src, dst, count, options, history, session, tensors};
  int chunk_log = 0;
  ARC_V3_RETURN_IF_ERROR(ChooseFrameChunkLog(in, &chunk_log));
  try {
    std::vector<std::vector<uint8_t>> chunks;
    uint64_t target_checksum = 0;
    ARC_V3_RETURN_IF_ERROR(
        EncodeFrameChunks(in, size_t{1} << chunk_log, &chunks, &target_checksum, base_checksum));
    std::vector<uint8_t>& bytes = out->bytes;
    bytes.clear();
    AppendFrameHeader(in, chunk_log, chunks, &bytes);
    size_t total = bytes.size();
    for (const auto& chunk : chunks) total += chunk.size();
    bytes.reserve(total);
    for (const auto& chunk : chunks) bytes.insert(bytes.end(), chunk.begin(), chunk.end());
    out->checksum = target_checksum;
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, "out of memory while encoding");
  } catch (const std::exception& e) {
    return Status(ErrorCode::kInternal, e.what());
  }
}

Status delta_compress(const uint16_t* src, const uint16_t* dst, size_t count, Delta* out,
                      const Options& options) {
  return EncodeFrame(src, dst, count, options, nullptr, nullptr, out);
}

Status delta_compress(const uint16_t* src, const uint16_t* dst, size_t count, Delta* out,
                      const Options& options, uint64_t* src_checksum) {
  if (src_checksum == nullptr) {
    return Status(ErrorCode::kInvalidArgument, "src_checksum is null");
  }
  return EncodeFrame(src, dst, count, options, nullptr, nullptr, out, src_checksum);
}

Status ConcatenateTensors(const TensorDelta* tensors, size_t tensor_count,
                          ConcatenatedTensors* group) {
  ARC_V3_RETURN_IF_ERROR(ListTensors(tensors, tensor_count, &group->counts, &group->total));
  const auto src = [](const TensorDelta& t) { return t.src; };
  const auto dst = [](const TensorDelta& t) { return t.dst; };
  group->src = BackToBack(tensors, tensor_count, src);
  if (group->src == nullptr) {
    group->src = Gather(tensors, tensor_count, group->total, src, &group->src_copy);
  }
  group->dst = BackToBack(tensors, tensor_count, dst);
  if (group->dst == nullptr) {
    group->dst = Gather(tensors, tensor_count, group->total, dst, &group->dst_copy);
  }
  return Status::Ok();
}

Status delta_compress_tensors(const TensorDelta* tensors, size_t tensor_count, Delta* out,
                              const Options& options) {
  try {
    ConcatenatedTensors group;
    ARC_V3_RETURN_IF_ERROR(ConcatenateTensors(tensors, tensor_count, &group));
    return EncodeFrame(group.src, group.dst, group.total, options, nullptr, nullptr, out, nullptr,
                       &group.counts);
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, "out of memory while encoding");
  }
}

bool delta_worth_grouping(const uint16_t* src, const uint16_t* dst, size_t count) {
  if (count >= kGroupBelowElements) return false;
  if (count > 0 && (src == nullptr || dst == nullptr)) return false;
  // Counted in slices, so that a dense tensor is told apart after its first few.
  constexpr size_t kSlice = size_t{1} << 16;
  uint64_t changed = 0;
  for (size_t begin = 0; begin < count && changed < kGroupMaxChanges; begin += kSlice) {
    changed += ClassifyChanges(src + begin, dst + begin, std::min(kSlice, count - begin)).changed;
  }
  return changed < kGroupMaxChanges;
}

Status delta_compress(const std::vector<uint16_t>& src, const std::vector<uint16_t>& dst,
                      Delta* out, const Options& options) {
  if (src.size() != dst.size()) {
    return Status(ErrorCode::kSizeMismatch, "src and dst differ in length");
  }
  return delta_compress(src.data(), dst.data(), src.size(), out, options);
}

}  // namespace arc_v3
