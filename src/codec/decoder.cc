// delta_decompress, delta_inspect and delta_stats: the decoder of src/codec/FORMAT.md.
//
// Three phases, so that `out` is written only once the result is known to be right:
//  1. parse and validate the frame, then decode every chunk (in parallel) into its list
//     of changes (position, XOR) - every malformed field is reported here;
//  2. stream the would-be result tile by tile through XXH3 and compare with the checksum;
//  3. write the result (in parallel): out = src ^ changes.
// Does not depend on the encoder.

#include <algorithm>
#include <atomic>
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

struct FrameHeader {
  int version = 0;
  bool session = false;
  SessionFrame session_frame;  // if session
  bool tensors = false;        // several tensors
  // Continues the session's last step: Base_Checksum and the tensor list are not in the
  // payload (ResolveContinues fills them in from the session).
  bool continues = false;
  uint64_t tensor_count = 0;  // if tensors (0 while a continuing frame is unresolved)
  // Frames of several tensors that name their list hold only Tensor_Count and this check
  // of the element counts (TensorListCheck); continuing frames, once resolved, hold the
  // list itself.
  bool has_list_check = false;
  uint32_t tensor_list_check = 0;
  std::vector<uint64_t> tensor_elements;  // if tensors and !has_list_check: the counts
  uint64_t element_count = 0;
  int chunk_log = 0;
  uint64_t num_chunks = 0;
  // Byte range of each chunk in the payload.
  std::vector<size_t> chunk_offset, chunk_size;
};

// The magic number, the format version and the flags.
Status ParseFrameStart(ByteReader* in, FrameHeader* header) {
  ByteReader& reader = *in;
  const uint8_t* magic;
  if (!reader.ReadSpan(sizeof(kMagic), &magic)) {
    return Status(ErrorCode::kTruncated, "payload shorter than its magic number");
  }
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return Status(ErrorCode::kBadMagic, "not an arc_v3 payload (bad magic number)");
  }
  uint8_t version, flags;
  if (!reader.ReadByte(&version)) return Status(ErrorCode::kTruncated, "no format version");
  header->version = version;
  if (version != kFormatVersion && version != kFormatVersionArcV3) {
    return Status(ErrorCode::kUnsupportedVersion,
                  "format version " + std::to_string(version) +
                      " is not supported (this library reads " + std::to_string(kFormatVersion) +
                      " and " + std::to_string(kFormatVersionArcV3) + ", ARCv3 as published)");
  }
  if (!reader.ReadByte(&flags)) return Status(ErrorCode::kTruncated, "no flags byte");
  const uint8_t known_flags =
      version == kFormatVersionArcV3 ? 0 : (kFlagSession | kFlagTensors | kFlagContinues);
  if ((flags & ~known_flags) != 0) {
    return Status(ErrorCode::kReservedBitsSet, "reserved frame flags are set");
  }
  header->session = (flags & kFlagSession) != 0;
  header->tensors = (flags & kFlagTensors) != 0;
  header->continues = (flags & kFlagContinues) != 0;
  if (header->continues && !header->session) {
    return Status(ErrorCode::kCorruptHeader, "only a session frame can continue a step");
  }
  return Status::Ok();
}

// Element_Count, the chunk size, the session fields and the tensor list's, as the flags
// (ParseFrameStart) call for; then the number of chunks.
Status ParseFrameFields(ByteReader* in, FrameHeader* header) {
  ByteReader& reader = *in;
  bool ran_out = false;
  if (!reader.ReadVarint(&header->element_count, &ran_out)) {
    return Status(ran_out ? ErrorCode::kTruncated : ErrorCode::kCorruptHeader, "bad element count");
  }
  if (header->element_count > (uint64_t{1} << 62)) {
    return Status(ErrorCode::kCorruptHeader, "element count out of range");
  }
  uint8_t chunk_log;
  if (!reader.ReadByte(&chunk_log)) return Status(ErrorCode::kTruncated, "no chunk size");
  if (chunk_log < kMinChunkLog || chunk_log > kMaxChunkLog) {
    return Status(ErrorCode::kCorruptHeader, "chunk size out of range");
  }
  header->chunk_log = chunk_log;
  if (header->session) {
    const uint8_t* fields;
    const size_t field_bytes = header->continues ? 8 : 16;
    if (!reader.ReadSpan(field_bytes, &fields)) {
      return Status(ErrorCode::kTruncated, "no session fields");
    }
    if (!header->continues) {
      header->session_frame.base_checksum = LoadU64(fields);
      fields += 8;
    }
    header->session_frame.history_id = LoadU64(fields);
  }
  if (header->tensors && !header->continues) {
    uint64_t tensor_count;
    if (!reader.ReadVarint(&tensor_count, &ran_out)) {
      return Status(ran_out ? ErrorCode::kTruncated : ErrorCode::kCorruptHeader,
                    "bad tensor count");
    }
    header->tensor_count = tensor_count;
    const uint8_t* check;
    if (!reader.ReadSpan(4, &check)) return Status(ErrorCode::kTruncated, "no tensor list check");
    header->has_list_check = true;
    header->tensor_list_check = LoadU32(check);
  }
  header->num_chunks = (header->element_count + (uint64_t{1} << chunk_log) - 1) >> chunk_log;
  return Status::Ok();
}

// The chunk table, and each chunk's byte range in the payload of `size` bytes. Allocates
// by evidence: the table's entries are checked against the bytes left before it grows.
Status ParseChunkTable(ByteReader* in, size_t size, FrameHeader* header) {
  ByteReader& reader = *in;
  // Each chunk takes at least one byte in the body and, but for the last one (not in
  // version 1), one in the table.
  const bool last_size_implied = header->version != kFormatVersionArcV3 && header->num_chunks > 0;
  const uint64_t stored_sizes = header->num_chunks - (last_size_implied ? 1 : 0);
  if (header->num_chunks + stored_sizes > reader.remaining()) {
    return Status(ErrorCode::kTruncated, "payload too short for its chunk table");
  }
  header->chunk_size.resize(header->num_chunks);
  header->chunk_offset.resize(header->num_chunks);
  uint64_t body_size = 0;
  for (uint64_t c = 0; c < stored_sizes; ++c) {
    uint64_t chunk_size;
    bool ran_out = false;
    if (!reader.ReadVarint(&chunk_size, &ran_out)) {
      return Status(ran_out ? ErrorCode::kTruncated : ErrorCode::kCorruptHeader,
                    "bad chunk table entry");
    }
    if (chunk_size == 0 || chunk_size > size) {
      return Status(ErrorCode::kCorruptHeader, "chunk size out of range");
    }
    if (chunk_size > reader.remaining() - std::min<uint64_t>(body_size, reader.remaining())) {
      return Status(ErrorCode::kTruncated, "payload ends before its last chunk");
    }
    header->chunk_size[c] = chunk_size;
    header->chunk_offset[c] = body_size;  // relative for now
    body_size += chunk_size;
  }
  if (body_size > reader.remaining()) {
    return Status(ErrorCode::kTruncated, "payload ends before its last chunk");
  }
  if (last_size_implied) {
    if (body_size == reader.remaining()) {
      return Status(ErrorCode::kTruncated, "payload ends before its last chunk");
    }
    header->chunk_size.back() = reader.remaining() - body_size;
    header->chunk_offset.back() = body_size;
    body_size = reader.remaining();
  }
  if (body_size < reader.remaining()) {
    return Status(ErrorCode::kCorruptHeader, "bytes after the last chunk");
  }
  for (auto& offset : header->chunk_offset) offset += reader.position();
  return Status::Ok();
}

Status ParseHeader(const uint8_t* bytes, size_t size, bool with_chunk_table, FrameHeader* header) {
  if (bytes == nullptr && size > 0) return Status(ErrorCode::kInvalidArgument, "bytes is null");
  ByteReader reader(bytes, size);
  ARC_V3_RETURN_IF_ERROR(ParseFrameStart(&reader, header));
  ARC_V3_RETURN_IF_ERROR(ParseFrameFields(&reader, header));
  if (!with_chunk_table) return Status::Ok();
  return ParseChunkTable(&reader, size, header);
}

// The changes of one chunk: positions relative to the chunk, ascending, with their XORs.
struct ChunkChanges {
  std::vector<uint32_t> positions;
  std::vector<uint16_t> xors;
};

struct ChunkStats {
  uint64_t changed = 0;
  uint64_t high = 0;
  uint64_t stream_bytes[3] = {0, 0, 0};  // positions, mantissas, high records
  uint64_t codec_wins[kNumStreamCodecs] = {0, 0, 0};
  uint64_t modelled_bytes = 0;  // of a modelled or rANS chunk (`mode` says which)
  int mode = kChunkUnchanged;
};

class ChunkDecoder {
 public:
  // Decodes one chunk of `chunk_len` elements from `bytes`; `src` is the chunk's slice of
  // the base, which the modelled coding predicts from.
  Status Decode(int version, const uint8_t* bytes, size_t size, const uint16_t* src,
                const uint8_t* history, const CarriedModel& carried, size_t chunk_len,
                ChunkChanges* changes, ChunkStats* stats) {
    ByteReader reader(bytes, size);
    if (version == kFormatVersionArcV3) {
      return DecodeXorStreams(&reader, chunk_len, /*allow_empty=*/true, changes, stats);
    }
    uint8_t mode;
    if (!reader.ReadByte(&mode)) return Truncated("no chunk mode");
    if (stats != nullptr) stats->mode = mode;
    switch (mode) {
      case kChunkUnchanged:
        changes->positions.clear();
        changes->xors.clear();
        return reader.remaining() == 0 ? Status::Ok()
                                       : Inconsistent("bytes after an unchanged chunk");
      case kChunkXorStreams:
        return DecodeXorStreams(&reader, chunk_len, /*allow_empty=*/false, changes, stats);
      case kChunkModelled: {
        if (src == nullptr) return Status::Ok();  // statistics without the base
        const Status status =
            DecodeChunkModelled(src, chunk_len, reader.current(), reader.remaining(),
                                &changes->positions, &changes->xors, history, carried);
        if (!status.ok()) {
          // The coding is predicted from src, so a wrong base derails it like corruption.
          return Status(status.code(),
                        status.message() + " (the payload is corrupt, or src is not its base)");
        }
        if (changes->positions.empty()) {
          return Status(ErrorCode::kCorruptChunk, "modelled chunk without changes");
        }
        if (stats != nullptr) {
          stats->modelled_bytes = size;
          for (const uint16_t x : changes->xors) stats->high += (x & kHighFieldMask) != 0;
        }
        return Status::Ok();
      }
      case kChunkRans:
      case kChunkRansHistory: {
        const bool with_history = mode == kChunkRansHistory;
        if (src == nullptr) return Status::Ok();  // statistics without the base
        if (with_history && history == nullptr) {
          return Status(ErrorCode::kCorruptChunk,
                        "rANS chunk coded with a session history outside a session");
        }
        const Status status =
            DecodeChunkRans(src, chunk_len, reader.current(), reader.remaining(),
                            &changes->positions, &changes->xors, with_history ? history : nullptr);
        if (!status.ok()) {
          return Status(status.code(),
                        status.message() + " (the payload is corrupt, or src is not its base)");
        }
        if (stats != nullptr) {
          stats->modelled_bytes = size;
          for (const uint16_t x : changes->xors) stats->high += (x & kHighFieldMask) != 0;
        }
        return Status::Ok();
      }
      default: return Status(ErrorCode::kReservedBitsSet, "unknown chunk mode");
    }
  }

 private:
  // The XOR-stream chunk body (src/codec/FORMAT.md "XOR-stream chunk"): Changed_Count, then the
  // streams.
  Status DecodeXorStreams(ByteReader* chunk, size_t chunk_len, bool allow_empty,
                          ChunkChanges* changes, ChunkStats* stats) {
    ByteReader& reader = *chunk;
    uint64_t num_changed, num_high;
    ARC_V3_RETURN_IF_ERROR(ReadCount(&reader, &num_changed, "bad change count"));
    if (num_changed > chunk_len) return Inconsistent("more changes than elements");
    if (num_changed == 0 && !allow_empty) return Inconsistent("XOR-stream chunk without changes");
    // The change lists grow only once the streams that back them have decoded.
    changes->positions.clear();
    changes->xors.clear();
    if (stats != nullptr) stats->mode = num_changed == 0 ? kChunkUnchanged : kChunkXorStreams;
    if (num_changed == 0) {
      return reader.remaining() == 0 ? Status::Ok() : Inconsistent("bytes after an empty chunk");
    }
    ARC_V3_RETURN_IF_ERROR(ReadCount(&reader, &num_high, "bad high count"));
    if (num_high > num_changed) return Inconsistent("more sign/exponent changes than changes");
    uint8_t layout;
    if (!reader.ReadByte(&layout)) return Truncated("no layout byte");
    if ((layout & ~kPositionModeMask) != 0 || (layout & kPositionModeMask) > kPositionsGaps) {
      return Status(ErrorCode::kReservedBitsSet, "reserved chunk layout bits are set");
    }
    const size_t n = num_changed;

    // Positions.
    if ((layout & kPositionModeMask) == kPositionsBitmap) {
      const size_t bitmap_size = (chunk_len + 7) / 8;
      ARC_V3_RETURN_IF_ERROR(ReadStream(&reader, bitmap_size, bitmap_size, stats, 0));
      changes->positions.resize(n);
      ARC_V3_RETURN_IF_ERROR(PositionsFromBitmap(chunk_len, n, changes->positions.data()));
    } else {
      // A gap takes 1..4 bytes (positions < 2^24).
      ARC_V3_RETURN_IF_ERROR(ReadStream(&reader, n, 4 * n, stats, 0));
      changes->positions.resize(n);
      ARC_V3_RETURN_IF_ERROR(PositionsFromGaps(chunk_len, n, changes->positions.data()));
    }

    // Mantissa XORs of every change.
    const size_t mantissa_size = PackedMantissaBytes(n);
    ARC_V3_RETURN_IF_ERROR(ReadStream(&reader, mantissa_size, mantissa_size, stats, 1));
    changes->xors.resize(n);
    UnpackMantissas(raw_.data(), n, changes->xors.data());
    // The bits past the last field must be zero (one encoding per payload).
    if ((n * 7) % 8 != 0 && (raw_[mantissa_size - 1] >> ((n * 7) % 8)) != 0) {
      return Inconsistent("nonzero padding bits in the mantissa stream");
    }

    // Sign/exponent records: rank gap (1..4 bytes) + 2 bytes each.
    if (num_high > 0) {
      ARC_V3_RETURN_IF_ERROR(ReadStream(&reader, 3 * num_high, 6 * num_high, stats, 2));
      ARC_V3_RETURN_IF_ERROR(ApplyHighRecords(num_high, n, changes->xors.data()));
    }
    for (size_t k = 0; k < n; ++k) {
      // A listed change must change something; a mantissa-only change has no record.
      if (changes->xors[k] == 0) return Inconsistent("a listed change has a zero XOR");
    }
    if (reader.remaining() != 0) return Inconsistent("bytes after the last stream");
    if (stats != nullptr) stats->high = num_high;
    return Status::Ok();
  }

  // A field cut short by the chunk's end is truncated; any other broken rule of a chunk
  // is corrupt_chunk (FORMAT.md, "Errors").
  static Status Truncated(const char* what) { return Status(ErrorCode::kTruncated, what); }
  static Status Inconsistent(const char* what) { return Status(ErrorCode::kCorruptChunk, what); }
  // A varint field of the chunk: truncated where the chunk ends inside it, else a
  // malformed varint (overlong, not minimal) is corrupt_chunk.
  static Status ReadCount(ByteReader* reader, uint64_t* value, const char* what) {
    bool ran_out = false;
    if (reader->ReadVarint(value, &ran_out)) return Status::Ok();
    return ran_out ? Truncated(what) : Inconsistent(what);
  }

  // Reads one stream record into raw_, checking its raw size is in [min_raw, max_raw].
  Status ReadStream(ByteReader* reader, size_t min_raw, size_t max_raw, ChunkStats* stats,
                    int kind) {
    const size_t start = reader->position();
    uint8_t codec;
    uint64_t raw_size, stored_size;
    if (!reader->ReadByte(&codec)) return Truncated("no stream codec");
    if (codec >= kNumStreamCodecs) {
      return Status(ErrorCode::kReservedBitsSet, "unknown stream codec id");
    }
    ARC_V3_RETURN_IF_ERROR(ReadCount(reader, &raw_size, "bad stream size"));
    if (raw_size < min_raw || raw_size > max_raw) {
      return Status(ErrorCode::kCorruptChunk, "stream size inconsistent with the change counts");
    }
    stored_size = raw_size;
    if (codec != kCodecStored)
      ARC_V3_RETURN_IF_ERROR(ReadCount(reader, &stored_size, "bad stored stream size"));
    const uint8_t* body;
    if (!reader->ReadSpan(stored_size, &body)) return Truncated("stream body cut short");
    if (raw_size > MaxRawSize(codec, stored_size)) {
      return Status(ErrorCode::kCodecFailure,
                    "stream claims more bytes than its codec can produce");
    }
    raw_.resize(raw_size);
    ARC_V3_RETURN_IF_ERROR(decompressor_.Decode(codec, body, stored_size, raw_.data(), raw_size));
    if (stats != nullptr) {
      stats->stream_bytes[kind] += reader->position() - start;
      stats->codec_wins[codec] += 1;
    }
    return Status::Ok();
  }

  // The most bytes `stored` bytes of `codec` can decode to: an LZ4 sequence adds at most
  // 255 bytes per byte; a zstd block regenerates at most 128 KiB and costs at least 4 bytes.
  static uint64_t MaxRawSize(uint8_t codec, uint64_t stored) {
    switch (codec) {
      case kCodecLz4: return 256 * stored;
      case kCodecZstd: return 32768 * stored;
      default: return stored;
    }
  }

  Status PositionsFromBitmap(size_t chunk_len, size_t n, uint32_t* positions) const {
    size_t k = 0;
    for (size_t byte = 0; byte < raw_.size(); ++byte) {
      for (uint32_t bits = raw_[byte]; bits != 0; bits &= bits - 1) {
        const size_t pos = byte * 8 + static_cast<size_t>(__builtin_ctz(bits));
        if (pos >= chunk_len) return Status(ErrorCode::kCorruptChunk, "bitmap bit past the chunk");
        if (k == n) return Status(ErrorCode::kCorruptChunk, "bitmap has more bits than changes");
        positions[k++] = static_cast<uint32_t>(pos);
      }
    }
    if (k != n) return Status(ErrorCode::kCorruptChunk, "bitmap has fewer bits than changes");
    return Status::Ok();
  }

  Status PositionsFromGaps(size_t chunk_len, size_t n, uint32_t* positions) const {
    ByteReader gaps(raw_.data(), raw_.size());
    uint64_t next = 0;
    for (size_t k = 0; k < n; ++k) {
      uint64_t gap;
      if (!gaps.ReadVarint(&gap)) return Status(ErrorCode::kCorruptChunk, "bad position gap");
      if (next >= chunk_len || gap >= chunk_len - next) {
        return Status(ErrorCode::kCorruptChunk, "position past the chunk");
      }
      positions[k] = static_cast<uint32_t>(next + gap);
      next = positions[k] + uint64_t{1};
    }
    if (gaps.remaining() != 0) return Status(ErrorCode::kCorruptChunk, "bytes after the last gap");
    return Status::Ok();
  }

  Status ApplyHighRecords(size_t num_high, size_t n, uint16_t* xors) const {
    ByteReader records(raw_.data(), raw_.size());
    uint64_t next = 0;
    for (size_t h = 0; h < num_high; ++h) {
      uint64_t gap;
      const uint8_t* field;
      if (!records.ReadVarint(&gap) || !records.ReadSpan(2, &field)) {
        return Status(ErrorCode::kCorruptChunk, "bad sign/exponent record");
      }
      if (next >= n || gap >= n - next) {
        return Status(ErrorCode::kCorruptChunk, "sign/exponent record past the last change");
      }
      const size_t rank = next + gap;
      const uint16_t high = static_cast<uint16_t>(field[0] | (field[1] << 8));
      if (high == 0 || high > (kHighFieldMask >> 7)) {
        return Status(ErrorCode::kCorruptChunk, "sign/exponent field out of range");
      }
      xors[rank] |= static_cast<uint16_t>(high << 7);
      next = rank + 1;
    }
    if (records.remaining() != 0) {
      return Status(ErrorCode::kCorruptChunk, "bytes after the last sign/exponent record");
    }
    return Status::Ok();
  }

  StreamDecompressor decompressor_;
  std::vector<uint8_t> raw_;
};

// Decodes all chunks (phase 1).
// `changes` null: each chunk's changes are counted into its stats and let go, so that
// memory holds one chunk's changes per worker, not the payload's.
Status DecodeChunks(const uint8_t* bytes, const FrameHeader& header, const uint16_t* src,
                    const uint8_t* history, const SessionFrame* session, int threads,
                    std::vector<ChunkChanges>* changes, std::vector<ChunkStats>* stats) {
  const size_t num_chunks = header.num_chunks;
  const size_t chunk_elements = size_t{1} << header.chunk_log;
  if (changes != nullptr) changes->resize(num_chunks);
  if (stats != nullptr) stats->resize(num_chunks);
  const size_t num_workers = WorkerCount(threads, num_chunks);
  std::vector<std::unique_ptr<ChunkDecoder>> decoders(num_workers);
  std::vector<ChunkChanges> scratch(changes != nullptr ? 0 : num_workers);
  for (auto& d : decoders) d.reset(new ChunkDecoder);
  std::vector<Status> status(num_chunks);
  // The first failing chunk in chunk order is reported, whatever the thread count: chunks
  // after a failure are skipped, chunks before it still decode.
  std::atomic<size_t> first_failed{num_chunks};
  SessionFrame::PrepareNextModels(session, num_chunks);
  ParallelFor(num_chunks, num_workers, [&](size_t c, size_t worker) {
    if (c > first_failed.load(std::memory_order_relaxed)) return;
    const size_t begin = c * chunk_elements;
    const size_t len = std::min<uint64_t>(chunk_elements, header.element_count - begin);
    const CarriedModel carried = SessionFrame::CarriedFor(session, c);
    ChunkChanges* chunk_changes = changes != nullptr ? &(*changes)[c] : &scratch[worker];
    try {
      chunk_changes->positions.clear();
      chunk_changes->xors.clear();
      status[c] = decoders[worker]->Decode(
          header.version, bytes + header.chunk_offset[c], header.chunk_size[c],
          src != nullptr ? src + begin : nullptr, history != nullptr ? history + begin : nullptr,
          carried, len, chunk_changes, stats != nullptr ? &(*stats)[c] : nullptr);
      if (stats != nullptr) (*stats)[c].changed = chunk_changes->positions.size();
    } catch (const std::bad_alloc&) {
      status[c] = Status(ErrorCode::kOutOfMemory, "out of memory while decoding");
    }
    if (!status[c].ok()) {
      size_t seen = first_failed.load();
      while (c < seen && !first_failed.compare_exchange_weak(seen, c)) {}
    }
  });
  for (size_t c = 0; c < num_chunks; ++c) {
    if (!status[c].ok()) {
      return Status(status[c].code(), "chunk " + std::to_string(c) + ": " + status[c].message());
    }
  }
  return Status::Ok();
}

// The result is built in tiles that stay in L1/L2: src's tile is copied and the tile's
// changes are XORed in.
constexpr size_t kTileElements = 16384;

// For each tile of chunk c (`begin`, `len` elements), writes the result into
// dest(first_element), then calls sink(first_element, tile_len, result).
template <class Dest, class Sink>
void ForEachResultTile(const uint16_t* src, size_t begin, size_t len, const ChunkChanges& changes,
                       const Dest& dest, const Sink& sink) {
  size_t k = 0;
  const size_t n = changes.positions.size();
  for (size_t tile = 0; tile < len; tile += kTileElements) {
    const size_t tile_len = std::min(kTileElements, len - tile);
    uint16_t* result = dest(begin + tile);
    std::memcpy(result, src + begin + tile, tile_len * sizeof(uint16_t));
    for (; k < n && changes.positions[k] < tile + tile_len; ++k) {
      result[changes.positions[k] - tile] ^= changes.xors[k];
    }
    sink(begin + tile, tile_len, result);
  }
}

Status SessionPayloadForStatelessDecoder() {
  return Status(ErrorCode::kHistoryMismatch,
                "payload was made by an arc_v3::Session; decode it with Session::Decompress");
}

// A frame that continues the session's last step takes its base checksum and
// tensor list from that step, which the receiving session remembers.
Status ResolveContinues(const SessionFrame* session, FrameHeader* header) {
  if (!header->continues) return Status::Ok();
  if (session == nullptr) return SessionPayloadForStatelessDecoder();
  if (!session->has_last_step) {
    return Status(ErrorCode::kHistoryMismatch,
                  "payload continues a step this session has not decoded (a missed step, or a "
                  "Reset on one side only)");
  }
  if (header->tensors != (session->last_tensors != nullptr)) {
    return Status(ErrorCode::kHistoryMismatch,
                  "payload continues a step of other tensors than this session's last one");
  }
  if (header->tensors) {
    uint64_t sum = 0;
    for (const uint64_t elements : *session->last_tensors) sum += elements;
    if (sum != header->element_count) {
      return Status(ErrorCode::kCorruptHeader,
                    "element count differs from that of the step the payload continues");
    }
    header->tensor_elements = *session->last_tensors;
    header->tensor_count = header->tensor_elements.size();
  }
  header->session_frame.base_checksum = session->last_checksum;
  return Status::Ok();
}

// A one-tensor call (tensors == nullptr) refuses frames of several tensors; a call with
// a tensor list needs the frame's list (or, for a one-tensor frame, a list of one) to be
// the same: the same count, total and list check (against the list itself for a continuing
// frame, which holds the session's).
Status CheckTensorList(const FrameHeader& header, const std::vector<uint64_t>* tensors) {
  if (header.tensors && tensors == nullptr) {
    return Status(ErrorCode::kSizeMismatch,
                  "payload holds " + std::to_string(header.tensor_count) +
                      " tensors; decode it with delta_decompress_tensors");
  }
  if (tensors != nullptr) {
    const uint64_t listed = header.tensors ? header.tensor_count : 1;
    if (tensors->size() != listed) {
      return Status(ErrorCode::kSizeMismatch, "payload holds " + std::to_string(listed) +
                                                  " tensor(s), the call passes " +
                                                  std::to_string(tensors->size()));
    }
    if (header.has_list_check) {
      uint64_t total = 0;
      for (const uint64_t elements : *tensors) total += elements;
      if (total != header.element_count) {
        return Status(ErrorCode::kSizeMismatch, "the tensors hold " + std::to_string(total) +
                                                    " elements in all, the payload " +
                                                    std::to_string(header.element_count));
      }
      if (TensorListCheck(*tensors) != header.tensor_list_check) {
        return Status(ErrorCode::kSizeMismatch,
                      "the tensors' element counts are not the payload's (same total, split "
                      "otherwise: its tensor list check differs)");
      }
      return Status::Ok();
    }
    for (size_t t = 0; t < listed; ++t) {
      const uint64_t elements = header.tensors ? header.tensor_elements[t] : header.element_count;
      if ((*tensors)[t] != elements) {
        return Status(ErrorCode::kSizeMismatch, "tensor " + std::to_string(t) + ": payload holds " +
                                                    std::to_string(elements) +
                                                    " elements, the call passes " +
                                                    std::to_string((*tensors)[t]));
      }
    }
  }
  return Status::Ok();
}

void Scatter(const uint16_t* result, const TensorOut* tensors, size_t tensor_count) {
  size_t at = 0;
  for (size_t t = 0; t < tensor_count; ++t) {
    if (tensors[t].count == 0) continue;
    std::memcpy(tensors[t].out, result + at, tensors[t].count * sizeof(uint16_t));
    at += tensors[t].count;
  }
}

// Checks a parsed frame against the call: its element count, the room in out, and the
// session the decoder expects (nullptr: none).
Status CheckFrameFitsCall(const FrameHeader& header, size_t count, size_t out_capacity,
                          const SessionFrame* expected) {
  if (header.element_count != count) {
    return Status(ErrorCode::kSizeMismatch, "payload holds " +
                                                std::to_string(header.element_count) +
                                                " elements, src has " + std::to_string(count));
  }
  if (count > out_capacity) {
    return Status(ErrorCode::kOutputTooSmall, "payload holds " + std::to_string(count) +
                                                  " elements, out has room for " +
                                                  std::to_string(out_capacity));
  }
  if (header.session && expected == nullptr) return SessionPayloadForStatelessDecoder();
  if (!header.session && expected != nullptr) {
    return Status(ErrorCode::kHistoryMismatch, "not a session payload (made by delta_compress)");
  }
  if (expected != nullptr) {
    if (header.session_frame.base_checksum != expected->base_checksum) {
      return Status(ErrorCode::kWrongBase,
                    "src is not the base this payload was made from (base checksum differs)");
    }
    if (header.session_frame.history_id != expected->history_id) {
      return Status(ErrorCode::kHistoryMismatch,
                    "payload expects another session history: a step was missed, repeated "
                    "or comes from another session");
    }
  }
  return Status::Ok();
}

// The checksum of the result of applying `changes` (chunks of 2^chunk_log elements) to
// src, built tile by tile so that nothing is written to out before it is verified. With
// next_history (which holds the history already), advances it over the result.
uint64_t HashFrameResult(const uint16_t* src, size_t count, int chunk_log,
                         const std::vector<ChunkChanges>& changes, uint8_t* next_history) {
  const size_t chunk_elements = size_t{1} << chunk_log;
  const size_t tile_elements = std::min(kTileElements, count);  // small tensors: small tiles
  std::vector<uint16_t> result_tile(tile_elements);
  ChecksumStream hash;
  for (size_t c = 0; c < changes.size(); ++c) {
    const size_t begin = c * chunk_elements;
    const size_t len = std::min(chunk_elements, count - begin);
    ForEachResultTile(
        src, begin, len, changes[c], [&](size_t) { return result_tile.data(); },
        [&](size_t at, size_t n, const uint16_t* result) {
          hash.Update(result, n);
          if (next_history != nullptr) {
            AdvanceHistory(src + at, result, n, next_history + at);
          }
        });
  }
  return hash.Digest();
}

// Writes the verified result to out (in place where out == src), chunks in parallel.
void WriteFrameResult(const uint16_t* src, size_t count, int chunk_log,
                      const std::vector<ChunkChanges>& changes, int threads, uint16_t* out) {
  const size_t chunk_elements = size_t{1} << chunk_log;
  const size_t num_workers = WorkerCount(threads, changes.size());
  ParallelFor(changes.size(), num_workers, [&](size_t c, size_t) {
    const size_t begin = c * chunk_elements;
    const size_t len = std::min(chunk_elements, count - begin);
    if (out == src) {  // in place: touch only the changed elements
      for (size_t k = 0; k < changes[c].positions.size(); ++k) {
        out[begin + changes[c].positions[k]] ^= changes[c].xors[k];
      }
      return;
    }
    ForEachResultTile(
        src, begin, len, changes[c], [&](size_t at) { return out + at; },
        [](size_t, size_t, const uint16_t*) {});
  });
}

}  // namespace

Status DecodeFrame(const uint16_t* src, size_t count, const uint8_t* bytes, size_t size,
                   uint64_t checksum, uint16_t* out, size_t out_capacity, int threads,
                   const uint8_t* history, const SessionFrame* expected, uint8_t* next_history,
                   const std::vector<uint64_t>* tensors) {
  if (count > 0 && (src == nullptr || out == nullptr)) {
    return Status(ErrorCode::kInvalidArgument, "src or out is null");
  }
  if (threads < 0) return Status(ErrorCode::kInvalidArgument, "threads must be >= 0");
  if (out != src && count > 0 && out < src + count && src < out + out_capacity) {
    return Status(ErrorCode::kInvalidArgument, "out overlaps src without being equal to it");
  }
  try {
    FrameHeader header;
    ARC_V3_RETURN_IF_ERROR(ParseHeader(bytes, size, /*with_chunk_table=*/true, &header));
    ARC_V3_RETURN_IF_ERROR(ResolveContinues(expected, &header));
    ARC_V3_RETURN_IF_ERROR(CheckTensorList(header, tensors));
    ARC_V3_RETURN_IF_ERROR(CheckFrameFitsCall(header, count, out_capacity, expected));
    std::vector<ChunkChanges> changes;
    ARC_V3_RETURN_IF_ERROR(
        DecodeChunks(bytes, header, src, history, expected, threads, &changes, nullptr));
    if (next_history != nullptr && count > 0) std::memcpy(next_history, history, count);
    if (HashFrameResult(src, count, header.chunk_log, changes, next_history) != checksum) {
      return Status(ErrorCode::kChecksumMismatch,
                    "result does not match the checksum: wrong base (src) or corrupt payload");
    }
    if (expected != nullptr && expected->frame_listed_tensors != nullptr) {
      *expected->frame_listed_tensors = header.tensors;
    }
    WriteFrameResult(src, count, header.chunk_log, changes, threads, out);
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, "out of memory while decoding");
  } catch (const std::exception& e) {
    return Status(ErrorCode::kInternal, e.what());
  }
}

Status delta_decompress(const uint16_t* src, size_t count, const uint8_t* bytes, size_t size,
                        uint64_t checksum, uint16_t* out, size_t out_capacity, int threads) {
  return DecodeFrame(src, count, bytes, size, checksum, out, out_capacity, threads, nullptr,
                     nullptr, nullptr);
}

Status delta_decompress(const uint16_t* src, size_t count, const uint8_t* bytes, size_t size,
                        uint64_t checksum, uint16_t* out) {
  return delta_decompress(src, count, bytes, size, checksum, out, count, 0);
}

Status delta_decompress(const std::vector<uint16_t>& src, const Delta& delta,
                        std::vector<uint16_t>* out) {
  if (out == nullptr) return Status(ErrorCode::kInvalidArgument, "out is null");
  std::vector<uint16_t> result(src.size());
  Status status = delta_decompress(src.data(), src.size(), delta.bytes.data(), delta.bytes.size(),
                                   delta.checksum, result.data(), result.size(), 0);
  if (status.ok()) out->swap(result);
  return status;
}

Status DecodeTensors(const TensorOut* tensors, size_t tensor_count,
                     const std::vector<uint64_t>& counts, size_t total, const uint8_t* bytes,
                     size_t size, uint64_t checksum, int threads, const uint8_t* history,
                     const SessionFrame* session_state, uint8_t* next_history,
                     uint64_t* base_checksum) {
  // Validate the header against the tensors before allocating for them.
  // (The chunk table too, so that every call checks in one order: FORMAT.md, "Errors".)
  FrameHeader header;
  ARC_V3_RETURN_IF_ERROR(ParseHeader(bytes, size, /*with_chunk_table=*/true, &header));
  ARC_V3_RETURN_IF_ERROR(ResolveContinues(session_state, &header));
  ARC_V3_RETURN_IF_ERROR(CheckTensorList(header, &counts));
  // Tensors that lie back to back in memory are decoded in place; others go through
  // copies (DecodeFrame writes its `out` only once the result is verified).
  std::vector<uint16_t> src_copy, result;
  const auto field_src = [](const TensorOut& t) { return t.src; };
  const uint16_t* src = BackToBack(tensors, tensor_count, field_src);
  if (src == nullptr) src = Gather(tensors, tensor_count, total, field_src, &src_copy);
  SessionFrame expected;
  if (session_state != nullptr) {
    expected = *session_state;
    expected.base_checksum = Checksum(src, total);
    if (base_checksum != nullptr) *base_checksum = expected.base_checksum;
  }
  const SessionFrame* session = session_state != nullptr ? &expected : nullptr;
  uint16_t* out = BackToBack(tensors, tensor_count, [](const TensorOut& t) { return t.out; });
  if (out == nullptr || (out != src && out < src + total && src < out + total)) {
    result.resize(total);
    ARC_V3_RETURN_IF_ERROR(DecodeFrame(src, total, bytes, size, checksum, result.data(), total,
                                       threads, history, session, next_history, &counts));
    Scatter(result.data(), tensors, tensor_count);
    return Status::Ok();
  }
  return DecodeFrame(src, total, bytes, size, checksum, out, total, threads, history, session,
                     next_history, &counts);
}

Status delta_decompress_tensors(const TensorOut* tensors, size_t tensor_count, const uint8_t* bytes,
                                size_t size, uint64_t checksum, int threads) {
  try {
    std::vector<uint64_t> counts;
    size_t total;
    ARC_V3_RETURN_IF_ERROR(ListTensors(tensors, tensor_count, &counts, &total));
    return DecodeTensors(tensors, tensor_count, counts, total, bytes, size, checksum, threads,
                         nullptr, nullptr, nullptr, nullptr);
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, "out of memory while decoding");
  }
}

Status delta_inspect(const uint8_t* bytes, size_t size, PayloadInfo* info) {
  if (info == nullptr) return Status(ErrorCode::kInvalidArgument, "info is null");
  FrameHeader header;
  ARC_V3_RETURN_IF_ERROR(ParseHeader(bytes, size, /*with_chunk_table=*/false, &header));
  info->format_version = static_cast<uint32_t>(header.version);
  info->element_count = header.element_count;
  info->chunk_elements = uint32_t{1} << header.chunk_log;
  info->chunk_count = header.num_chunks;
  info->tensor_count = header.tensors ? header.tensor_count : 1;
  info->session = header.session;
  info->continues = header.continues;
  return Status::Ok();
}

namespace {

Status ComputeStats(const uint16_t* src, size_t count, const uint8_t* bytes, size_t size,
                    PayloadStats* stats) {
  if (stats == nullptr) return Status(ErrorCode::kInvalidArgument, "stats is null");
  try {
    FrameHeader header;
    ARC_V3_RETURN_IF_ERROR(ParseHeader(bytes, size, /*with_chunk_table=*/true, &header));
    if (src != nullptr && header.element_count != count) {
      return Status(ErrorCode::kSizeMismatch, "payload and base differ in element count");
    }
    std::vector<ChunkStats> chunk_stats;
    // Session payloads' modelled chunks need the history too: measure, don't count them.
    if (header.session) src = nullptr;
    ARC_V3_RETURN_IF_ERROR(
        DecodeChunks(bytes, header, src, nullptr, nullptr, 0, nullptr, &chunk_stats));
    *stats = PayloadStats();
    ARC_V3_RETURN_IF_ERROR(delta_inspect(bytes, size, &stats->info));
    for (size_t c = 0; c < chunk_stats.size(); ++c) {
      const ChunkStats& chunk = chunk_stats[c];
      stats->chunk_modes[chunk.mode] += 1;
      const bool rans = chunk.mode == kChunkRans || chunk.mode == kChunkRansHistory;
      uint64_t& coded_bytes = rans ? stats->rans_bytes : stats->modelled_bytes;
      if ((chunk.mode == kChunkModelled || rans) && src == nullptr) {
        stats->counts_known = false;
        coded_bytes += header.chunk_size[c];
        continue;
      }
      stats->changed += chunk.changed;
      stats->exponent_or_sign += chunk.high;
      stats->position_bytes += chunk.stream_bytes[0];
      stats->mantissa_bytes += chunk.stream_bytes[1];
      stats->high_bytes += chunk.stream_bytes[2];
      coded_bytes += chunk.modelled_bytes;
      for (int k = 0; k < kNumStreamCodecs; ++k) stats->codec_wins[k] += chunk.codec_wins[k];
    }
    stats->overhead_bytes = size - stats->position_bytes - stats->mantissa_bytes -
                            stats->high_bytes - stats->modelled_bytes - stats->rans_bytes;
    return Status::Ok();
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kOutOfMemory, "out of memory while decoding");
  }
}

}  // namespace

Status delta_stats(const uint8_t* bytes, size_t size, PayloadStats* stats) {
  return ComputeStats(nullptr, 0, bytes, size, stats);
}

Status delta_stats(const uint16_t* src, size_t count, const uint8_t* bytes, size_t size,
                   PayloadStats* stats) {
  if (src == nullptr && count > 0) return Status(ErrorCode::kInvalidArgument, "src is null");
  static const uint16_t kNoElements[1] = {0};
  return ComputeStats(src != nullptr ? src : kNoElements, count, bytes, size, stats);
}

}  // namespace arc_v3
