// The tests' XXH3 forger (xxh3_forge.h) does what the signed-step tests rely on: another
// text of the same size and XXH3-64 as the library computes it, for short and mid-size
// documents.
#include "tests/sync/xxh3_forge.h"

#include <doctest/doctest.h>

#include <string>

#include "src/common/xxh3.h"

namespace arc_v3 {
namespace sync {
namespace test {
namespace {

uint64_t Xxh3(const std::string& s) { return XXH3_64bits(s.data(), s.size()); }

TEST_CASE("xxh3 forge: same size and XXH3, other meaning, for 17..128 and 129..240 bytes") {
  // 128 bytes (its eight blocks apart: shorter inputs overlap them), and mid-size (the
  // change and the free characters both in the first 128 bytes, whose sum the middle
  // avalanche closes).
  const std::string pad(90, 'a');
  for (const std::string& genuine :
       {"{\"p\": \"" + pad.substr(0, 128 - 41) + "\", \"weight_map\": {\"w\": \"m-1.st\"}}\n",
        "{\"weight_map\": {\"w\": \"m-00001.st\"}, \"metadata\": {\"pad\": \"" + pad + "\"}}\n"}) {
    std::string wanted = genuine;
    const size_t at = wanted.find("-1.st") != std::string::npos ? wanted.find("-1.st") + 1
                                                                : wanted.find("00001.st") + 4;
    wanted[at] = '2';
    INFO("bytes ", genuine.size());
    REQUIRE((genuine.size() == 128 || genuine.size() >= 144));
    const std::string forged = ForgeXxh3(genuine, wanted, PositionsOf(wanted, ": \"a"));
    REQUIRE(!forged.empty());
    CHECK(forged.size() == genuine.size());
    CHECK(Xxh3(forged) == Xxh3(genuine));
    CHECK(forged[at] == '2');
    CHECK(forged != genuine);
  }
  // Not what it can do: a long input, or too few free bytes.
  CHECK(ForgeXxh3(std::string(300, 'x'), std::string(300, 'y'), {1, 2, 3}).empty());
  CHECK(ForgeXxh3(std::string(100, 'x'), std::string(100, 'y'), {1, 2, 3}).empty());
}

}  // namespace
}  // namespace test
}  // namespace sync
}  // namespace arc_v3
