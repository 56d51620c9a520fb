// The split build's program (see sender.cc): three steps through a stateless payload and
// a session each, every result checked. Prints "split build: ok" or the first error.
#include <cstdio>
#include <vector>

#include "../third_party/arc_v3/arc_v3.hpp"
#include "split.h"

int main() {
  std::vector<uint16_t> prev(300000);
  for (size_t i = 0; i < prev.size(); ++i) prev[i] = static_cast<uint16_t>(0x3C00 + i % 977);
  arc_v3::Session sender, receiver;
  for (int step = 1; step <= 3; ++step) {
    std::vector<uint16_t> next = prev;
    for (size_t i = step; i < next.size(); i += 61 * step) next[i] += (i & 1) ? 1 : -1;
    arc_v3::Delta stateless, session_step;
    std::vector<uint16_t> a, b;
    arc_v3::Status s = Send(prev, next, &sender, &stateless, &session_step);
    if (s.ok()) s = Receive(prev, stateless, session_step, &receiver, &a, &b);
    if (!s.ok() || a != next || b != next) {
      std::printf("split build: step %d: %s%s\n", step, s.ToString().c_str(),
                  s.ok() ? ", wrong result" : "");
      return 1;
    }
    prev = next;
  }
  std::printf("split build: ok (%s, format %u)\n", arc_v3::ActiveTarget(), arc_v3::FormatVersion());
  return 0;
}
