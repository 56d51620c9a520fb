#include "bench/baselines/common.h"

#include <zstd.h>

#include <limits>

namespace arc_v3 {
namespace bench {

std::vector<uint32_t> ChangedPositions(const TensorView& tensor) {
  std::vector<uint32_t> positions;
  for (size_t i = 0; i < tensor.count; ++i) {
    if (tensor.prev[i] != tensor.next[i]) positions.push_back(static_cast<uint32_t>(i));
  }
  return positions;
}

void PutGaps(const std::vector<uint32_t>& positions, ByteWriter* writer) {
  uint32_t max_gap = 0, last = 0;
  for (size_t k = 0; k < positions.size(); ++k) {
    max_gap = std::max(max_gap, positions[k] - (k ? last : 0));
    last = positions[k];
  }
  const bool wide = max_gap > std::numeric_limits<uint16_t>::max();
  writer->Put<uint8_t>(wide ? 4 : 2);
  last = 0;
  for (size_t k = 0; k < positions.size(); ++k) {
    const uint32_t gap = positions[k] - (k ? last : 0);
    if (wide) {
      writer->Put<uint32_t>(gap);
    } else {
      writer->Put<uint16_t>(static_cast<uint16_t>(gap));
    }
    last = positions[k];
  }
}

bool GetGaps(ByteReader* reader, size_t count, size_t limit, std::vector<uint32_t>* positions) {
  uint8_t width = 0;
  if (!reader->Get(&width) || (width != 2 && width != 4)) return false;
  positions->resize(count);
  uint64_t position = 0;
  for (size_t k = 0; k < count; ++k) {
    uint32_t gap = 0;
    if (width == 2) {
      uint16_t narrow = 0;
      if (!reader->Get(&narrow)) return false;
      gap = narrow;
    } else if (!reader->Get(&gap)) {
      return false;
    }
    position = (k ? position : 0) + gap;
    if (position >= limit || (k && gap == 0)) return false;
    (*positions)[k] = static_cast<uint32_t>(position);
  }
  return true;
}

std::vector<uint16_t> XorOf(const TensorView& tensor) {
  std::vector<uint16_t> x(tensor.count);
  for (size_t i = 0; i < tensor.count; ++i) x[i] = tensor.prev[i] ^ tensor.next[i];
  return x;
}

bool ZstdCompress(const void* data, size_t size, int level, std::vector<uint8_t>* out) {
  out->resize(ZSTD_compressBound(size));
  const size_t written = ZSTD_compress(out->data(), out->size(), data, size, level);
  if (ZSTD_isError(written)) return false;
  out->resize(written);
  return true;
}

bool ZstdDecompress(const uint8_t* data, size_t size, std::vector<uint8_t>* out) {
  const unsigned long long content = ZSTD_getFrameContentSize(data, size);
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN ||
      content > (1ull << 40)) {
    return false;
  }
  out->resize(static_cast<size_t>(content));
  const size_t got = ZSTD_decompress(out->data(), out->size(), data, size);
  return !ZSTD_isError(got) && got == content;
}

}  // namespace bench
}  // namespace arc_v3
