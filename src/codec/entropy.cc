// The compressor race (see entropy.h).
#include "src/codec/entropy.h"

#include <cstring>
#include <memory>

#ifndef ZSTD_STATIC_LINKING_ONLY
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_c_format / ZSTD_d_format (magicless frames)
#endif
#include <lz4.h>
#include <lz4hc.h>
#include <zstd.h>

#include "src/codec/format.h"

namespace arc_v3 {

RaceEntrants EntrantsForEffort(int effort) {
  RaceEntrants e;
  switch (effort) {
    case 0: e.lz4 = true; break;
    case 1:
      e.lz4 = true;
      e.zstd_levels[0] = 3;
      break;
    case 2:  // zstd -19 would gain little for far more time (docs/format_notes.md)
      e.lz4 = true;
      e.zstd_levels[0] = 3;
      e.zstd_levels[1] = 9;
      break;
    default:
      e.lz4 = true;
      e.lz4hc_level = LZ4HC_CLEVEL_MAX;
      e.zstd_levels[0] = 9;
      e.zstd_levels[1] = 19;
      break;
  }
  return e;
}

// zstd contexts are created on first use: small tensors and modelled chunks often need
// none, and creating one costs more than coding a small tensor.
StreamCompressor::StreamCompressor() = default;
StreamCompressor::~StreamCompressor() { ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(zstd_)); }

bool StreamCompressor::AppendStream(const uint8_t* raw, size_t size, const RaceEntrants& entrants,
                                    std::vector<uint8_t>* out, uint8_t* codec) {
  uint8_t best_codec = kCodecStored;
  size_t best_size = size;  // stored
  // Strictly smaller wins, so ties keep the codec tried first (stored, lz4, zstd).
  auto consider = [&](uint8_t id, size_t compressed) {
    if (compressed > 0 && compressed < best_size) {
      best_codec = id;
      best_size = compressed;
      best_.swap(candidate_);
    }
  };
  if (size > 0 && size <= static_cast<size_t>(LZ4_MAX_INPUT_SIZE) && entrants.lz4) {
    candidate_.resize(static_cast<size_t>(LZ4_compressBound(static_cast<int>(size))));
    // LZ4 HC's 256 KiB state, kept per thread: allocating and faulting it in per stream
    // cost more than coding a small stream (the call initialises it).
    thread_local std::unique_ptr<uint64_t[]> lz4hc_state;
    if (entrants.lz4hc_level > 0 && lz4hc_state == nullptr) {
      lz4hc_state.reset(new uint64_t[(static_cast<size_t>(LZ4_sizeofStateHC()) + 7) / 8]);
    }
    const int n =
        entrants.lz4hc_level > 0
            ? LZ4_compress_HC_extStateHC(lz4hc_state.get(), reinterpret_cast<const char*>(raw),
                                         reinterpret_cast<char*>(candidate_.data()),
                                         static_cast<int>(size),
                                         static_cast<int>(candidate_.size()), entrants.lz4hc_level)
            : LZ4_compress_default(reinterpret_cast<const char*>(raw),
                                   reinterpret_cast<char*>(candidate_.data()),
                                   static_cast<int>(size), static_cast<int>(candidate_.size()));
    consider(kCodecLz4, n > 0 ? static_cast<size_t>(n) : 0);
  }
  for (const int level : entrants.zstd_levels) {
    if (level == 0 || size == 0) continue;
    if (zstd_ == nullptr) zstd_ = ZSTD_createCCtx();
    auto* cctx = static_cast<ZSTD_CCtx*>(zstd_);
    if (cctx == nullptr) continue;  // out of memory: the other entrants still race
    ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_format, ZSTD_f_zstd1_magicless);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 0);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_dictIDFlag, 0);
    candidate_.resize(ZSTD_compressBound(size));
    const size_t n = ZSTD_compress2(cctx, candidate_.data(), candidate_.size(), raw, size);
    consider(kCodecZstd, ZSTD_isError(n) ? 0 : n);
  }

  out->push_back(best_codec);
  PutVarint(size, out);
  if (best_codec != kCodecStored) PutVarint(best_size, out);
  const uint8_t* body = best_codec == kCodecStored ? raw : best_.data();
  out->insert(out->end(), body, body + best_size);
  *codec = best_codec;
  return true;
}

StreamDecompressor::StreamDecompressor() = default;
StreamDecompressor::~StreamDecompressor() { ZSTD_freeDCtx(static_cast<ZSTD_DCtx*>(zstd_)); }

Status StreamDecompressor::Decode(uint8_t codec, const uint8_t* in, size_t in_size, uint8_t* out,
                                  size_t raw_size) {
  switch (codec) {
    case kCodecStored:
      if (in_size != raw_size) {
        return Status(ErrorCode::kCorruptChunk, "stored stream size differs from its raw size");
      }
      if (raw_size > 0) std::memcpy(out, in, raw_size);
      return Status::Ok();
    case kCodecLz4: {
      if (in_size > static_cast<size_t>(LZ4_MAX_INPUT_SIZE) ||
          raw_size > static_cast<size_t>(LZ4_MAX_INPUT_SIZE)) {
        return Status(ErrorCode::kCorruptChunk, "lz4 stream larger than lz4 allows");
      }
      // LZ4_decompress_safe never reads or writes outside the given buffers.
      const int n =
          LZ4_decompress_safe(reinterpret_cast<const char*>(in), reinterpret_cast<char*>(out),
                              static_cast<int>(in_size), static_cast<int>(raw_size));
      if (n < 0 || static_cast<size_t>(n) != raw_size) {
        return Status(ErrorCode::kCodecFailure, "lz4 stream is corrupt");
      }
      return Status::Ok();
    }
    case kCodecZstd: {
      if (zstd_ == nullptr) zstd_ = ZSTD_createDCtx();
      auto* dctx = static_cast<ZSTD_DCtx*>(zstd_);
      if (dctx == nullptr) return Status(ErrorCode::kOutOfMemory, "cannot allocate zstd context");
      ZSTD_DCtx_reset(dctx, ZSTD_reset_session_and_parameters);
      ZSTD_DCtx_setParameter(dctx, ZSTD_d_format, ZSTD_f_zstd1_magicless);
      ZSTD_DCtx_setParameter(dctx, ZSTD_d_stableOutBuffer, 1);
      ZSTD_inBuffer input = {in, in_size, 0};
      ZSTD_outBuffer output = {out, raw_size, 0};
      // Exactly one frame that fills `out` and uses every input byte.
      const size_t ret = ZSTD_decompressStream(dctx, &output, &input);
      if (ZSTD_isError(ret) || ret != 0 || input.pos != in_size || output.pos != raw_size) {
        return Status(ErrorCode::kCodecFailure, "zstd stream is corrupt");
      }
      return Status::Ok();
    }
    default: return Status(ErrorCode::kReservedBitsSet, "unknown stream codec id");
  }
}

}  // namespace arc_v3
