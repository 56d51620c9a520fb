// The cryptography of a signed step, per operation on this machine: SHA-256 throughput,
// Ed25519 signing and verifying (medians of 7 runs). One JSON line.
//   signing_primitives [--mib 256]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "src/sync/signing.h"

namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double MedianSeconds(int runs, const F& f) {
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto start = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 256;
  if (argc == 3 && std::strcmp(argv[1], "--mib") == 0) mib = std::strtoull(argv[2], nullptr, 10);
  std::vector<uint8_t> data(mib << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  arc_v3::sync::Digest sink{};
  const double hash =
      MedianSeconds(7, [&] { sink = arc_v3::sync::Sha256(data.data(), data.size()); });
  arc_v3::sync::SigningKey key;
  if (!arc_v3::sync::SigningKey::Generate(&key).ok()) return 1;
  const std::string message(2048, 'r');  // about a root of a few hundred shards
  std::string sig;
  const int ops = 1000;
  const double sign = MedianSeconds(7, [&] {
    for (int i = 0; i < ops; ++i) (void)key.Sign(message, &sig);  // a loaded key signs
  });
  bool ok = true;
  const double verify = MedianSeconds(7, [&] {
    for (int i = 0; i < ops; ++i) ok = key.public_key().Verify(message, sig) && ok;
  });
  std::printf(
      "{\"sha256_gb_per_s\": %.3f, \"ed25519_sign_us\": %.1f, \"ed25519_verify_us\": %.1f, \"ok\": "
      "%s, "
      "\"digest_byte\": %d}\n",
      data.size() / hash / 1e9, sign / ops * 1e6, verify / ops * 1e6, ok ? "true" : "false",
      sink[0]);
  return ok ? 0 : 1;
}
