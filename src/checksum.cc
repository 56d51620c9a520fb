// The payload checksum: XXH3-64 (seed 0) of the BF16 values' little-endian bytes.
#include <new>

#include "arc_v3.hpp"
#include "src/codec_internal.h"
#include "src/xxh3.h"

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

uint64_t ChecksumStream::Digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

}  // namespace arc_v3
