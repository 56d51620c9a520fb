// A deterministic generator of realistic RL weight-update deltas (BF16 checkpoints).
//
// It simulates the mechanism that makes real deltas what they are (the method of the
// real-run corpus's Python synthesizer, written for speed): FP32 master weights with per-tensor
// realistic distributions (Gaussian with per-row log-normal scales, a wide-tail mixture,
// "massive activation" columns, rare outliers; RMSNorm gains around a per-layer mean;
// Laplace biases), gradients g = scale(row, col) * (kappa(row, col) * z + noise) where z
// is a persistent AR(1) signal (momentum-like sign persistence), idle embedding rows of
// rare tokens, then real AdamW arithmetic in FP32 (bias-corrected, steady-state moments
// at the start) and the BF16 round-to-nearest-even cast after every step. The learning
// rate is calibrated by bisection so that the first update changes `target_density` of
// the BF16 values.
//
// Same options and seed -> same bytes, whatever the thread count.
#ifndef ARC_V3_BENCH_GENERATOR_H_
#define ARC_V3_BENCH_GENERATOR_H_

#include <cstdint>
#include <vector>

#include "bench/dataset.h"

namespace arc_v3 {
namespace bench {

struct GeneratorOptions {
  uint64_t params = 4'000'000;   // approximate model size (a LLaMA-like dense layout)
  double target_density = 0.02;  // fraction of BF16 values changed per step
  int deltas = 3;                // saved step pairs (deltas + 1 snapshots)
  int burnin_steps = 3;          // unsaved steps after calibration
  uint64_t seed = 1;
  int threads = 0;  // 0 = all hardware threads
};

struct GeneratedRun {
  std::vector<TensorLayout> layout;
  std::vector<std::vector<uint16_t>> snapshots;  // BF16 bits, tensors concatenated
  double learning_rate = 0;
};

// Fails (kInvalidArgument) on nonsensical options: params < 10000, density outside
// (0, 0.5), deltas < 1, burnin_steps < 0.
Status Generate(const GeneratorOptions& options, GeneratedRun* run);

}  // namespace bench
}  // namespace arc_v3

#endif  // ARC_V3_BENCH_GENERATOR_H_
