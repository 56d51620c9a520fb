// The general-purpose compressor race of the ARCv3 scheme: each stream is offered to
// stored, lz4/lz4hc and zstd (several levels) and the smallest result is kept. This is
// the only part of the library that includes zstd.h / lz4.h.
#ifndef ARC_V3_SRC_CODEC_ENTROPY_H_
#define ARC_V3_SRC_CODEC_ENTROPY_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "arc_v3.hpp"

namespace arc_v3 {

// Which compressors race at an effort level (Options::effort, 0..3).
struct RaceEntrants {
  bool lz4 = false;
  int lz4hc_level = 0;          // 0: plain LZ4 (when lz4), otherwise LZ4HC at this level
  int zstd_levels[2] = {0, 0};  // 0 = unused slot
};
RaceEntrants EntrantsForEffort(int effort);

// One per encoding thread (owns a zstd context).
class StreamCompressor {
 public:
  StreamCompressor();
  ~StreamCompressor();
  StreamCompressor(const StreamCompressor&) = delete;
  StreamCompressor& operator=(const StreamCompressor&) = delete;

  // Appends one stream record (src/codec/FORMAT.md "Stream"): codec id, raw size, stored size if
  // compressed, then the bytes of whichever entrant was smallest. Returns the codec id.
  // false only when memory runs out.
  bool AppendStream(const uint8_t* raw, size_t size, const RaceEntrants& entrants,
                    std::vector<uint8_t>* out, uint8_t* codec);

 private:
  void* zstd_ = nullptr;  // ZSTD_CCtx
  std::vector<uint8_t> candidate_;
  std::vector<uint8_t> best_;
};

// One per decoding thread (owns a zstd context).
class StreamDecompressor {
 public:
  StreamDecompressor();
  ~StreamDecompressor();
  StreamDecompressor(const StreamDecompressor&) = delete;
  StreamDecompressor& operator=(const StreamDecompressor&) = delete;

  // Decodes `in` (stored with `codec`) into exactly `raw_size` bytes at `out`.
  // Fails (kCodecFailure / kCorruptChunk) unless the input decodes to exactly raw_size
  // bytes and is consumed entirely. Never writes beyond out + raw_size.
  Status Decode(uint8_t codec, const uint8_t* in, size_t in_size, uint8_t* out, size_t raw_size);

 private:
  void* zstd_ = nullptr;  // ZSTD_DCtx
};

}  // namespace arc_v3

#endif  // ARC_V3_SRC_CODEC_ENTROPY_H_
