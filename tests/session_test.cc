// Sessions: multi-step round trips on realistic deltas, smaller payloads than stateless
// coding, and the errors a receiver gets when its base or history is not the sender's.
#include <doctest/doctest.h>

#include <vector>

#include "arc_v3.hpp"
#include "bench/generator.h"

namespace arc_v3 {
namespace {

struct Steps {
  std::vector<std::vector<uint16_t>> snapshots;
};

Steps MakeSteps(double density, int deltas, uint64_t params = 300000) {
  bench::GeneratorOptions options;
  options.params = params;
  options.target_density = density;
  options.deltas = deltas;
  options.seed = 5;
  bench::GeneratedRun run;
  REQUIRE(bench::Generate(options, &run).ok());
  return Steps{run.snapshots};
}

TEST_CASE("a session round-trips every step and beats stateless coding") {
  for (const double density : {0.003, 0.03}) {
    // Large enough that the session header (16 bytes) is small beside what history saves.
    const Steps steps = MakeSteps(density, 3, 2000000);
    const size_t count = steps.snapshots[0].size();
    Session sender, receiver;
    size_t session_bytes = 0, stateless_bytes = 0;
    std::vector<uint16_t> weights = steps.snapshots[0];  // the receiver's copy, in place
    for (size_t s = 0; s + 1 < steps.snapshots.size(); ++s) {
      const auto& prev = steps.snapshots[s];
      const auto& next = steps.snapshots[s + 1];
      Delta delta;
      REQUIRE(sender.Compress(prev.data(), next.data(), count, &delta).ok());
      const Status status = receiver.Decompress(weights.data(), count, delta.bytes.data(),
                                                delta.bytes.size(), delta.checksum, weights.data());
      REQUIRE_MESSAGE(status.ok(), status.ToString());
      REQUIRE(weights == next);
      CHECK(sender.history_id() == receiver.history_id());
      CHECK(receiver.steps() == s + 1);

      // A stateless call cannot decode a session payload.
      std::vector<uint16_t> out(count);
      CHECK(delta_decompress(prev.data(), count, delta.bytes.data(), delta.bytes.size(),
                             delta.checksum, out.data())
                .code() == ErrorCode::kHistoryMismatch);

      Delta stateless;
      REQUIRE(delta_compress(prev.data(), next.data(), count, &stateless).ok());
      if (s > 0) {  // the first step has no history yet
        session_bytes += delta.bytes.size();
        stateless_bytes += stateless.bytes.size();
      }
    }
    INFO("density ", density, ": session ", session_bytes, " bytes, stateless ", stateless_bytes);
    CHECK(session_bytes < stateless_bytes);
  }
}

TEST_CASE("a receiver with the wrong base or out of step gets an error, not weights") {
  const Steps steps = MakeSteps(0.01, 3);
  const size_t count = steps.snapshots[0].size();
  Session sender;
  std::vector<Delta> deltas(3);
  for (size_t s = 0; s < 3; ++s) {
    REQUIRE(sender.Compress(steps.snapshots[s].data(), steps.snapshots[s + 1].data(), count,
                            &deltas[s])
                .ok());
  }
  std::vector<uint16_t> out(count, 7);
  auto apply = [&](Session* receiver, size_t step, const std::vector<uint16_t>& base) {
    return receiver->Decompress(base.data(), count, deltas[step].bytes.data(),
                                deltas[step].bytes.size(), deltas[step].checksum, out.data());
  };

  Session receiver;
  // Wrong base: the previous step's weights instead of this step's.
  CHECK(apply(&receiver, 0, steps.snapshots[1]).code() == ErrorCode::kWrongBase);
  CHECK(receiver.steps() == 0);
  // Skipping a step: step 1's payload expects the history after step 0.
  CHECK(apply(&receiver, 1, steps.snapshots[1]).code() == ErrorCode::kHistoryMismatch);
  CHECK(out == std::vector<uint16_t>(count, 7));  // nothing written on error
  REQUIRE(apply(&receiver, 0, steps.snapshots[0]).ok());
  CHECK(out == steps.snapshots[1]);
  // Replaying step 0 (with its own base) on the advanced receiver.
  CHECK(apply(&receiver, 0, steps.snapshots[0]).code() == ErrorCode::kHistoryMismatch);
  REQUIRE(apply(&receiver, 1, steps.snapshots[1]).ok());
  CHECK(out == steps.snapshots[2]);

  // Another session's payload for the same tensors.
  Session other_sender, other_receiver;
  Delta first;
  REQUIRE(other_sender.Compress(steps.snapshots[0].data(), steps.snapshots[1].data(), count,
                                &first)
              .ok());
  REQUIRE(other_receiver.Decompress(steps.snapshots[0].data(), count, first.bytes.data(),
                                    first.bytes.size(), first.checksum, out.data())
              .ok());
  // Same first step, same history identity: the identity depends only on the steps.
  Session replica;
  REQUIRE(apply(&replica, 0, steps.snapshots[0]).ok());
  CHECK(other_receiver.history_id() == replica.history_id());
  Session fresh;
  CHECK(apply(&fresh, 2, steps.snapshots[2]).code() == ErrorCode::kHistoryMismatch);

  // A different element count on a running session.
  std::vector<uint16_t> small(100, 0);
  Delta delta;
  CHECK(sender.Compress(small.data(), small.data(), small.size(), &delta).code() ==
        ErrorCode::kSizeMismatch);
  sender.Reset();
  CHECK(sender.steps() == 0);
  CHECK(sender.Compress(small.data(), small.data(), small.size(), &delta).ok());
}

}  // namespace
}  // namespace arc_v3
