// The payload checksum: XXH3-64 (seed 0) of the BF16 values' little-endian bytes; and the
// check of a frame's tensor list.
#include <new>

#include "arc_v3.hpp"
#include "src/codec/codec_internal.h"
#include "src/common/xxh3.h"

namespace arc_v3 {

uint64_t Checksum(const uint16_t* values, size_t count) {
  return XXH3_64bits(values, count * sizeof(uint16_t));
}

ChecksumStream::ChecksumStream() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

ChecksumStream::~ChecksumStream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void ChecksumStream::Update(const uint16_t* values, size_t count) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), values, count * sizeof(uint16_t));
}

uint32_t TensorListCheck(const std::vector<uint64_t>& counts) {
  std::vector<uint8_t> bytes(8 * counts.size());  // u64 little-endian each
  for (size_t t = 0; t < counts.size(); ++t) {
    for (int i = 0; i < 8; ++i) bytes[8 * t + i] = static_cast<uint8_t>(counts[t] >> (8 * i));
  }
  return static_cast<uint32_t>(XXH3_64bits(bytes.data(), bytes.size()));
}

uint64_t ChecksumStream::Digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

}  // namespace arc_v3
