// An attacker's tool for the tests: a replacement for a document, of the same size and
// XXH3-64 (seed 0), that says something else. XXH3 is not a cryptographic hash, and for
// inputs of 17 to 240 bytes it is a sum of independent 16-byte blocks' products before a
// final bijection, so a generalized-birthday search (Wagner's 4-list algorithm) over a
// few free characters finds one in seconds: a trusting reader must never take XXH3 alone.
#ifndef ARC_V3_TESTS_SYNC_XXH3_FORGE_H_
#define ARC_V3_TESTS_SYNC_XXH3_FORGE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace arc_v3 {
namespace sync {
namespace test {

// Returns `wanted` (same length as `genuine`, 17 to 240 bytes) with the bytes at `free`
// positions replaced by characters of `alphabet`, so that its XXH3-64 is `genuine`'s; ""
// if no such replacement was found (too few free bytes in independent blocks, or, for
// 129 to 240 bytes, `wanted` differing from `genuine` on both sides of byte 128).
std::string ForgeXxh3(
    const std::string& genuine, const std::string& wanted, const std::vector<size_t>& free,
    const std::string& alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789");

// The positions of a JSON string's characters in `text`: from the end of the first
// occurrence of `opening` (which ends with the string's opening quote) to the next '"'.
// The free bytes to pass ForgeXxh3.
std::vector<size_t> PositionsOf(const std::string& text, const std::string& opening);

}  // namespace test
}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_TESTS_SYNC_XXH3_FORGE_H_
