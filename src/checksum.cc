// The payload checksum: XXH3-64 (seed 0) of the BF16 values' little-endian bytes.
#include <xxhash.h>

#include "arc_v3.hpp"

namespace arc_v3 {

uint64_t Checksum(const uint16_t* values, size_t count) {
  return XXH3_64bits(values, count * sizeof(uint16_t));
}

}  // namespace arc_v3
