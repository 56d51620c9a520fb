// XXH3 for the codec's checksums. On x86-64 the calls go to libxxhash's runtime dispatch
// (xxh_x86dispatch: AVX2 or AVX-512 where the CPU has them) instead of the SSE2 code the
// library is compiled for: the same hashes, about twice as fast when streamed tile by
// tile. Define ARC_V3_NO_XXH_DISPATCH for
// a libxxhash built without the dispatcher (CMake checks this itself).
#ifndef ARC_V3_SRC_COMMON_XXH3_H_
#define ARC_V3_SRC_COMMON_XXH3_H_

#include <xxhash.h>

#if (defined(__x86_64__) || defined(_M_X64)) && !defined(ARC_V3_NO_XXH_DISPATCH) && \
    __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>  // redefines XXH3_64bits and XXH3_64bits_update
#endif

#endif  // ARC_V3_SRC_COMMON_XXH3_H_
