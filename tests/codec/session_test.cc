// Sessions: multi-step round trips on realistic deltas, smaller payloads than stateless
// coding, and the errors a receiver gets when its base or history is not the sender's.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "bench/generator.h"
#include "src/codec/format.h"
#include "tests/golden_files.h"
#include "tests/test_data.h"

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

// Each step of a run through `sender`, in order.
std::vector<Delta> CompressEverySnapshot(Session* sender, const Steps& steps) {
  const size_t count = steps.snapshots[0].size();
  std::vector<Delta> deltas(steps.snapshots.size() - 1);
  for (size_t s = 0; s < deltas.size(); ++s) {
    REQUIRE(
        sender
            ->Compress(steps.snapshots[s].data(), steps.snapshots[s + 1].data(), count, &deltas[s])
            .ok());
  }
  return deltas;
}

TEST_CASE("a receiver with the wrong base or out of step gets an error, not weights") {
  const Steps steps = MakeSteps(0.01, 3);
  const size_t count = steps.snapshots[0].size();
  Session sender;
  const std::vector<Delta> deltas = CompressEverySnapshot(&sender, steps);
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
  REQUIRE(other_sender.Compress(steps.snapshots[0].data(), steps.snapshots[1].data(), count, &first)
              .ok());
  REQUIRE(other_receiver
              .Decompress(steps.snapshots[0].data(), count, first.bytes.data(), first.bytes.size(),
                          first.checksum, out.data())
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

// A one-tensor session step that continues the last one as the frame that names its base
// instead (Base_Checksum after Chunk_Log, no Continues flag): what the encoder writes for
// a step from another base.
std::vector<uint8_t> NamingItsBase(const std::vector<uint8_t>& bytes, uint64_t base_checksum) {
  REQUIRE(bytes.size() > 16);
  REQUIRE(bytes[4] == kFormatVersion);
  REQUIRE(bytes[5] == 0x05);  // Session | Continues
  size_t at = 6;
  while (bytes[at] & 0x80) ++at;  // Element_Count
  at += 2;                        // its last byte, Chunk_Log
  std::vector<uint8_t> named(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(at));
  named[5] = 0x01;
  for (int i = 0; i < 8; ++i) named.push_back(static_cast<uint8_t>(base_checksum >> (8 * i)));
  named.insert(named.end(), bytes.begin() + static_cast<ptrdiff_t>(at), bytes.end());
  return named;
}

TEST_CASE("carried models: a failed step leaves them as they were") {
  const Steps steps = MakeSteps(0.005, 3);
  const size_t count = steps.snapshots[0].size();
  Session sender;
  const std::vector<Delta> deltas = CompressEverySnapshot(&sender, steps);
  // Sparse steps are modelled: from the second on, from the models the first ended on,
  // with the history, in frames that continue the step before.
  CHECK((deltas[0].bytes[5] & kFlagContinues) == 0);
  CHECK((deltas[1].bytes[5] & kFlagContinues) != 0);
  CHECK((deltas[2].bytes[5] & kFlagContinues) != 0);
  std::vector<uint16_t> out(count);
  auto apply = [&](Session* receiver, const std::vector<uint8_t>& bytes, size_t step) {
    return receiver->Decompress(steps.snapshots[step].data(), count, bytes.data(), bytes.size(),
                                deltas[step].checksum, out.data());
  };
  Session receiver;
  REQUIRE(apply(&receiver, deltas[0].bytes, 0).ok());
  // A corrupt step 1 (a byte inside its last chunk, a modelled one) fails, and the
  // receiver's models, like its history, stay those of step 0: the good payload decodes.
  std::vector<uint8_t> corrupt = deltas[1].bytes;
  REQUIRE(corrupt.size() > 100);
  corrupt[corrupt.size() - 40] ^= 0xFF;
  CHECK(!apply(&receiver, corrupt, 1).ok());
  CHECK(receiver.steps() == 1);
  // The same chunks in a frame that names its base decode, and the next step continues it.
  const uint64_t base = Checksum(steps.snapshots[1].data(), count);
  REQUIRE(apply(&receiver, NamingItsBase(deltas[1].bytes, base), 1).ok());
  CHECK(out == steps.snapshots[2]);
  REQUIRE(apply(&receiver, deltas[2].bytes, 2).ok());
  CHECK(out == steps.snapshots[3]);
  // Reset forgets the models with the history: both sides start over.
  sender.Reset();
  receiver.Reset();
  Delta again;
  REQUIRE(
      sender.Compress(steps.snapshots[1].data(), steps.snapshots[2].data(), count, &again).ok());
  CHECK((again.bytes[5] & kFlagContinues) == 0);
  REQUIRE(receiver
              .Decompress(steps.snapshots[1].data(), count, again.bytes.data(), again.bytes.size(),
                          again.checksum, out.data())
              .ok());
  CHECK(out == steps.snapshots[2]);
}

TEST_CASE("a step continues the last one exactly when its base is that step's result") {
  const Steps steps = MakeSteps(0.01, 3);
  const size_t count = steps.snapshots[0].size();
  const auto& snap = steps.snapshots;
  // (base, target) per step: the third starts again from snapshot 1, not from the
  // second's result; the fourth goes on from the third's.
  const std::vector<std::pair<size_t, size_t>> plan = {{0, 1}, {1, 2}, {1, 3}, {3, 2}};
  const std::vector<bool> continues = {false, true, false, true};
  Session sender, receiver;
  std::vector<uint16_t> out(count);
  for (size_t s = 0; s < plan.size(); ++s) {
    CAPTURE(s);
    const std::vector<uint16_t>& base = snap[plan[s].first];
    const std::vector<uint16_t>& target = snap[plan[s].second];
    Delta delta;
    REQUIRE(sender.Compress(base.data(), target.data(), count, &delta).ok());
    PayloadInfo info;
    REQUIRE(delta_inspect(delta.bytes.data(), delta.bytes.size(), &info).ok());
    CHECK(info.session);
    CHECK(info.continues == continues[s]);
    const auto decode = [&](Session* session, const std::vector<uint16_t>& src,
                            const std::vector<uint8_t>& bytes) {
      return session->Decompress(src.data(), count, bytes.data(), bytes.size(), delta.checksum,
                                 out.data());
    };
    if (continues[s]) {
      // The payload does not name its base, but the receiver still knows it: its last
      // result. Another src is the wrong base; a session that did not decode the step
      // before, or a stateless decoder, cannot decode it.
      const std::vector<uint16_t>& other = snap[plan[s].first == 1 ? 0 : 1];
      CHECK(decode(&receiver, other, delta.bytes).code() == ErrorCode::kWrongBase);
      Session fresh;
      CHECK(decode(&fresh, base, delta.bytes).code() == ErrorCode::kHistoryMismatch);
      CHECK(delta_decompress(base.data(), count, delta.bytes.data(), delta.bytes.size(),
                             delta.checksum, out.data())
                .code() == ErrorCode::kHistoryMismatch);
      // Flags byte: Session | Continues. The Continues bit means nothing without the
      // Session bit.
      std::vector<uint8_t> bad = delta.bytes;
      REQUIRE(bad[5] == 0x05);
      bad[5] = 0x04;
      CHECK(decode(&receiver, base, bad).code() == ErrorCode::kCorruptHeader);
      CHECK(receiver.steps() == s);
    }
    const Status status = decode(&receiver, base, delta.bytes);
    REQUIRE_MESSAGE(status.ok(), status.ToString());
    CHECK(out == target);
    CHECK(receiver.history_id() == sender.history_id());
  }
  // A receiver may decode one-tensor payloads through DecompressTensors with a list of
  // one: what it remembers is the frame's (no list), so the continuing steps match.
  {
    Session one_sender, list_receiver;
    std::vector<uint16_t> weights = snap[0];
    for (size_t s = 0; s < 2; ++s) {
      Delta delta;
      REQUIRE(one_sender.Compress(snap[s].data(), snap[s + 1].data(), count, &delta).ok());
      const TensorOut whole = {weights.data(), weights.data(), count};
      const Status status = list_receiver.DecompressTensors(&whole, 1, delta.bytes.data(),
                                                            delta.bytes.size(), delta.checksum);
      REQUIRE_MESSAGE(status.ok(), status.ToString());
      CHECK(weights == snap[s + 1]);
    }
  }
  // After a Reset on both sides nothing continues.
  sender.Reset();
  receiver.Reset();
  Delta delta;
  REQUIRE(sender.Compress(snap[2].data(), snap[3].data(), count, &delta).ok());
  PayloadInfo info;
  REQUIRE(delta_inspect(delta.bytes.data(), delta.bytes.size(), &info).ok());
  CHECK(!info.continues);
  REQUIRE(receiver
              .Decompress(snap[2].data(), count, delta.bytes.data(), delta.bytes.size(),
                          delta.checksum, out.data())
              .ok());
  CHECK(out == snap[3]);
}

// A run's snapshots cut into tensors of these sizes, back to back in memory as in a
// safetensors file, for the group calls.
struct GroupViews {
  std::vector<TensorDelta> Deltas(const std::vector<size_t>& sizes,
                                  const std::vector<uint16_t>& prev,
                                  const std::vector<uint16_t>& next) const {
    std::vector<TensorDelta> tensors;
    size_t at = 0;
    for (const size_t n : sizes) {
      tensors.push_back({prev.data() + at, next.data() + at, n});
      at += n;
    }
    return tensors;
  }
  std::vector<TensorOut> Outs(const std::vector<size_t>& sizes, const std::vector<uint16_t>& base,
                              uint16_t* out) const {
    std::vector<TensorOut> tensors;
    size_t at = 0;
    for (const size_t n : sizes) {
      tensors.push_back({base.data() + at, out + at, n});
      at += n;
    }
    return tensors;
  }
};

TEST_CASE("a session over a group of tensors round-trips and beats one session per tensor") {
  const Steps steps = MakeSteps(0.003, 4, 300000);
  const size_t count = steps.snapshots[0].size();
  // Uneven tensors, one empty; they add up to the snapshot.
  const std::vector<size_t> sizes = {1000, 0, 120000, 77, count - 121077};
  const GroupViews views;
  Session sender, receiver;
  std::vector<Session> senders(sizes.size());
  std::vector<uint16_t> weights = steps.snapshots[0];  // the receiver's copy, in place
  size_t group_bytes = 0, per_tensor_bytes = 0;
  for (size_t s = 0; s + 1 < steps.snapshots.size(); ++s) {
    const auto& prev = steps.snapshots[s];
    const auto& next = steps.snapshots[s + 1];
    const std::vector<TensorDelta> tensors = views.Deltas(sizes, prev, next);
    Delta delta;
    REQUIRE(sender.CompressTensors(tensors.data(), tensors.size(), &delta).ok());
    // The first step names the tensors; the others continue it and leave them out.
    PayloadInfo info;
    REQUIRE(delta_inspect(delta.bytes.data(), delta.bytes.size(), &info).ok());
    CHECK(info.session);
    CHECK(info.continues == (s > 0));
    CHECK(info.tensor_count == (s > 0 ? 0 : sizes.size()));
    // Stateless calls refuse it; the receiver rebuilds its weights in place.
    std::vector<uint16_t> out(count, 7);
    const std::vector<TensorOut> stateless = views.Outs(sizes, prev, out.data());
    CHECK(delta_decompress_tensors(stateless.data(), stateless.size(), delta.bytes.data(),
                                   delta.bytes.size(), delta.checksum)
              .code() == ErrorCode::kHistoryMismatch);
    CHECK(out == std::vector<uint16_t>(count, 7));
    const std::vector<TensorOut> in_place = views.Outs(sizes, weights, weights.data());
    const Status status = receiver.DecompressTensors(
        in_place.data(), in_place.size(), delta.bytes.data(), delta.bytes.size(), delta.checksum);
    REQUIRE_MESSAGE(status.ok(), status.ToString());
    REQUIRE(weights == next);
    CHECK(sender.history_id() == receiver.history_id());
    group_bytes += delta.bytes.size() + sizeof(delta.checksum);
    for (size_t t = 0; t < sizes.size(); ++t) {
      Delta one;
      REQUIRE(senders[t].Compress(tensors[t].src, tensors[t].dst, tensors[t].count, &one).ok());
      per_tensor_bytes += one.bytes.size() + sizeof(one.checksum);
    }
  }
  INFO("group ", group_bytes, " bytes, one session per tensor ", per_tensor_bytes);
  CHECK(group_bytes < per_tensor_bytes);

  // A wrong list, a wrong base and a missed step are refused, with the session intact.
  const auto& prev = steps.snapshots[3];
  const auto& next = steps.snapshots[4];
  Delta delta;
  const std::vector<TensorDelta> tensors = views.Deltas(sizes, prev, next);
  REQUIRE(sender.CompressTensors(tensors.data(), tensors.size(), &delta).ok());
  std::vector<uint16_t> out(count, 7);
  const auto decode = [&](const std::vector<TensorOut>& list) {
    return receiver.DecompressTensors(list.data(), list.size(), delta.bytes.data(),
                                      delta.bytes.size(), delta.checksum);
  };
  const uint64_t before = receiver.history_id();
  std::vector<TensorOut> fewer = views.Outs(sizes, prev, out.data());
  fewer.pop_back();
  CHECK(decode(fewer).code() == ErrorCode::kSizeMismatch);
  std::vector<size_t> other_split = sizes;
  other_split[0] += 1;
  other_split[2] -= 1;
  CHECK(decode(views.Outs(other_split, prev, out.data())).code() == ErrorCode::kSizeMismatch);
  CHECK(decode(views.Outs(sizes, steps.snapshots[2], out.data())).code() == ErrorCode::kWrongBase);
  CHECK(out == std::vector<uint16_t>(count, 7));
  CHECK(receiver.history_id() == before);
  // Scattered outputs (not back to back) decode the same.
  std::vector<std::vector<uint16_t>> parts;
  std::vector<TensorOut> scattered;
  size_t at = 0;
  for (const size_t n : sizes) parts.emplace_back(n, 0);
  for (size_t t = 0; t < sizes.size(); ++t) {
    scattered.push_back({prev.data() + at, parts[t].data(), sizes[t]});
    at += sizes[t];
  }
  REQUIRE(decode(scattered).ok());
  std::vector<uint16_t> joined;
  for (const auto& part : parts) joined.insert(joined.end(), part.begin(), part.end());
  CHECK(joined == next);
  CHECK(receiver.history_id() == sender.history_id());
}

// A committed session payload: the file's bytes, or, when updating the golden files
// (ARC_V3_UPDATE_GOLDEN=1 under `bazel run`), `made`, written to the source tree first.
// Update mode is not a test (the payload would be compared with itself): each file it
// writes is a visible failure; run the test again without ARC_V3_UPDATE_GOLDEN to check.
std::vector<uint8_t> CommittedPayload(const std::string& path, const Delta& made) {
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (std::getenv("ARC_V3_UPDATE_GOLDEN") == nullptr || workspace == nullptr) {
    return test::ReadFile(path);
  }
  std::ofstream out(std::string(workspace) + "/" + path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(made.bytes.data()),
            static_cast<std::streamsize>(made.bytes.size()));
  REQUIRE(out.good());
  FAIL_CHECK("update mode (ARC_V3_UPDATE_GOLDEN): wrote ", path,
             ", not checked: run again without it");
  return made.bytes;
}

// Committed session payloads (tests/golden/session/): 16,384 elements of a real GPT-2 run
// (real_gpt2_lr1e-6, h.0.attn.c_attn.weight, steps 0-3), coded by one Session per step
// (sN.arc3) and by one group Session over three tensors of it (gN.arc3). The encoder must
// keep writing them byte for byte, and a receiver must keep decoding them, history and
// all (regenerate only with the format: ARC_V3_UPDATE_GOLDEN=1 bazel run
// //tests/codec:session_test).
TEST_CASE("committed session payloads, one tensor and a group, decode step by step") {
  const std::string dir = std::string(test::kGoldenDir) + "session/";
  std::vector<std::vector<uint16_t>> steps;
  for (int i = 0; i < 4; ++i)
    steps.push_back(test::ReadBf16(dir + "step" + std::to_string(i) + ".bf16"));
  const size_t count = steps[0].size();
  const std::vector<size_t> sizes = {4096, 8192, 4096};
  const GroupViews views;
  Session sender, group_sender, receiver, group_receiver;
  std::vector<uint16_t> weights = steps[0], group_weights = steps[0];
  for (int i = 1; i < 4; ++i) {
    CAPTURE(i);
    Delta delta, group_delta;
    REQUIRE(sender.Compress(steps[i - 1].data(), steps[i].data(), count, &delta).ok());
    const std::vector<TensorDelta> tensors = views.Deltas(sizes, steps[i - 1], steps[i]);
    REQUIRE(group_sender.CompressTensors(tensors.data(), tensors.size(), &group_delta).ok());
    const std::vector<uint8_t> single_bytes =
        CommittedPayload(dir + "s" + std::to_string(i) + ".arc3", delta);
    const std::vector<uint8_t> group_bytes =
        CommittedPayload(dir + "g" + std::to_string(i) + ".arc3", group_delta);
    CHECK(single_bytes == delta.bytes);
    CHECK(group_bytes == group_delta.bytes);
    REQUIRE(single_bytes.size() > 5);
    REQUIRE(group_bytes.size() > 5);
    CHECK(single_bytes[4] == kFormatVersion);
    CHECK(group_bytes[4] == kFormatVersion);
    // Steps after the first continue the one before.
    CHECK(((single_bytes[5] & kFlagContinues) != 0) == (i > 1));
    CHECK(((group_bytes[5] & kFlagContinues) != 0) == (i > 1));
    const uint64_t checksum = Checksum(steps[i].data(), count);
    Status status = receiver.Decompress(weights.data(), count, single_bytes.data(),
                                        single_bytes.size(), checksum, weights.data());
    REQUIRE_MESSAGE(status.ok(), status.ToString());
    CHECK(weights == steps[i]);
    const std::vector<TensorOut> outs = views.Outs(sizes, group_weights, group_weights.data());
    status = group_receiver.DecompressTensors(outs.data(), outs.size(), group_bytes.data(),
                                              group_bytes.size(), checksum);
    REQUIRE_MESSAGE(status.ok(), status.ToString());
    CHECK(group_weights == steps[i]);
    CHECK(receiver.history_id() == sender.history_id());
    CHECK(group_receiver.history_id() == group_sender.history_id());
  }
}

// Committed dense session payloads (tests/golden/session/dN.arc3): 65,536 elements of
// the real_gpt2_lr5e-6 run (h.3.mlp.c_fc.weight, steps 0-2, ~6.4% changed). Step 1 has
// no history yet: a plain rANS chunk. Step 2 is an rANS chunk coded with the history
// (Chunk_Mode 4) in a frame that continues step 1. Regenerated with the payloads above.
TEST_CASE("committed dense session payloads: rANS with the history") {
  const std::string dir = std::string(test::kGoldenDir) + "session/";
  std::vector<std::vector<uint16_t>> steps;
  for (int i = 0; i < 3; ++i) {
    steps.push_back(test::ReadBf16(dir + "dense" + std::to_string(i) + ".bf16"));
  }
  const size_t count = steps[0].size();
  Session sender, receiver;
  std::vector<uint16_t> weights = steps[0];
  for (int i = 1; i < 3; ++i) {
    CAPTURE(i);
    const std::string path = dir + "d" + std::to_string(i) + ".arc3";
    Delta delta;
    REQUIRE(sender.Compress(steps[i - 1].data(), steps[i].data(), count, &delta).ok());
    const std::vector<uint8_t> bytes = CommittedPayload(path, delta);
    CHECK(bytes == delta.bytes);
    const uint64_t checksum = Checksum(steps[i].data(), count);
    PayloadStats stats;
    REQUIRE(delta_stats(bytes.data(), bytes.size(), &stats).ok());
    CHECK(stats.info.format_version == kFormatVersion);
    CHECK(stats.info.continues == (i == 2));
    CHECK(stats.chunk_modes[i == 1 ? kChunkRans : kChunkRansHistory] == 1);
    const Status status = receiver.Decompress(weights.data(), count, bytes.data(), bytes.size(),
                                              checksum, weights.data());
    REQUIRE_MESSAGE(status.ok(), status.ToString());
    CHECK(weights == steps[i]);
  }
}

TEST_CASE("efforts 1-2 code a chunk as rANS from 1/128 changed, in a session from 1/64") {
  // One 2^20-element chunk; each step flips the lowest mantissa bit (a +-1 step) of every
  // `stride`-th element, at an offset of its own.
  constexpr size_t kCount = size_t{1} << 20;
  std::mt19937 rng(11);
  const std::vector<uint16_t> first = test::GaussianWeights(kCount, &rng);
  for (const size_t stride : {100, 50}) {  // 1% and 2% changed
    INFO("1/" << stride << " changed");
    std::vector<std::vector<uint16_t>> steps = {first};
    for (size_t s = 0; s < 2; ++s) {
      std::vector<uint16_t> next = steps.back();
      for (size_t i = s * 7 % stride; i < kCount; i += stride) next[i] ^= 1;
      steps.push_back(next);
    }
    // Stateless: rANS either way (>= 2048 changes, >= 1/128 changed).
    Delta stateless;
    REQUIRE(delta_compress(steps[1].data(), steps[2].data(), kCount, &stateless).ok());
    PayloadStats stats;
    REQUIRE(
        delta_stats(steps[1].data(), kCount, stateless.bytes.data(), stateless.bytes.size(), &stats)
            .ok());
    CHECK(stats.chunk_modes[3] == 1);
    // A session's second step, with a history: the modelled coder below 1/64, rANS (with
    // or without the history) from there on.
    Session sender, receiver;
    std::vector<uint16_t> weights = steps[0];
    Delta delta;
    for (size_t s = 0; s < 2; ++s) {
      REQUIRE(sender.Compress(steps[s].data(), steps[s + 1].data(), kCount, &delta).ok());
      REQUIRE(receiver
                  .Decompress(weights.data(), kCount, delta.bytes.data(), delta.bytes.size(),
                              delta.checksum, weights.data())
                  .ok());
      REQUIRE(weights == steps[s + 1]);
    }
    REQUIRE(
        delta_stats(steps[1].data(), kCount, delta.bytes.data(), delta.bytes.size(), &stats).ok());
    if (stride == 100) {
      CHECK(stats.chunk_modes[2] == 1);
    } else {
      CHECK(stats.chunk_modes[3] + stats.chunk_modes[4] == 1);
    }
  }
}

}  // namespace
}  // namespace arc_v3
