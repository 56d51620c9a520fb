#include "bench/generator.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <utility>

#include "bench/bf16.h"
#include "src/common/parallel.h"

namespace arc_v3 {
namespace bench {
namespace {

// AdamW hyper-parameters of the corpus runs (gen_rl_deltas.py / synth.py defaults).
constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kAdamEps = 1e-8, kWeightDecay = 0.01;
constexpr int kAdamStepsBefore = 200;        // moments start as after this many steps
constexpr double kSignalCorrelation = 0.95;  // AR(1) step correlation of the gradient signal
constexpr double kMedianSnr = 0.3;           // per-tensor median signal/noise of gradients
constexpr double kTokensPerStep = 32768;     // sets how many embedding rows are idle
constexpr size_t kCalibrationSamples = 1 << 20;

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// xoshiro256+ (Blackman & Vigna): fast, and good enough in its high bits for simulation.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0) {
    for (uint64_t& s : s_) s = SplitMix64(&seed);
  }
  uint64_t Next() {
    const uint64_t result = s_[0] + s_[3];
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = (s_[3] << 45) | (s_[3] >> 19);
    return result;
  }
  // Uniform in (0, 1).
  double Uniform() { return (static_cast<double>(Next() >> 11) + 0.5) * 0x1.0p-53; }
  // Approximately standard normal: the sum of four 16-bit uniforms (Irwin-Hall), scaled
  // to unit variance. Bounded at +-3.46, which the explicit wide-tail mixtures and
  // outliers below make up for; one random word per sample keeps 50M-parameter steps fast.
  float Normal() {
    const uint64_t r = Next();
    const uint32_t sum =
        static_cast<uint32_t>(r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48);
    return (static_cast<float>(sum) * (1.0f / 65536.0f) - 2.0f + 2.0f / 65536.0f) * 1.7320508f;
  }
  float LogNormal(double sigma) { return static_cast<float>(std::exp(sigma * Normal())); }

 private:
  uint64_t s_[4];
};

// An allocator whose resize() leaves floats uninitialised: the state arrays are written
// in full right after allocation, and zero-filling hundreds of MB first costs ~20%.
template <class T>
struct UninitializedAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <class U>
  UninitializedAllocator(const UninitializedAllocator<U>&) {}
  template <class U>
  void construct(U* p) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using FloatArray = std::vector<float, UninitializedAllocator<float>>;

enum class Kind {
  kEmbed,
  kHead,
  kNormAttn,
  kNormMlp,
  kNormFinal,
  kBias,
  kBiasK,
  kQ,
  kK,
  kV,
  kO,
  kGate,
  kUp,
  kDown
};

struct TensorState {
  TensorLayout layout;
  Kind kind = Kind::kQ;
  double depth = 0.5;  // (layer + 1) / (layers + 1)
  FloatArray w, m, v, z;
  // Gradient structure: scale g_row[r] * g_col[c], signal/noise kap_row[r] * kap_col[c];
  // 1-D tensors are n x 1.
  std::vector<float> g_row, g_col, kap_row, kap_col;
  std::vector<float> p_active;  // per row (embedding): P(token seen in a step); empty = 1
  double gamma_rel = 1;
  Rng rng;
};

// A LLaMA-like dense model of about `params` parameters.
std::vector<TensorState> BuildModel(uint64_t params, uint64_t seed, uint64_t* d_model) {
  const uint64_t d =
      std::clamp<uint64_t>(64 * static_cast<uint64_t>(std::sqrt(params / 28.0) / 64), 64, 4096);
  const uint64_t ffn = std::max<uint64_t>(64, (8 * d / 3 + 32) / 64 * 64);
  const uint64_t vocab = 8 * d;
  const double per_layer = 4.0 * d * d + 3.0 * d * ffn + 5.0 * d;
  const double rest = static_cast<double>(params) - 2.0 * vocab * d - d;
  const int layers = std::max(1, static_cast<int>(std::lround(rest / per_layer)));
  std::vector<TensorState> model;
  auto add = [&](const std::string& name, uint64_t rows, uint64_t cols, Kind kind, int layer) {
    TensorState t;
    t.layout.name = name;
    t.layout.rows = rows;
    t.layout.cols = cols;
    t.kind = kind;
    t.depth = layer < 0 ? 0.5 : (layer + 1.0) / (layers + 1.0);
    model.push_back(std::move(t));
  };
  add("model.embed_tokens.weight", vocab, d, Kind::kEmbed, -1);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", d, 1, Kind::kNormAttn, l);
    add(p + "self_attn.q_proj.weight", d, d, Kind::kQ, l);
    add(p + "self_attn.q_proj.bias", d, 1, Kind::kBias, l);
    add(p + "self_attn.k_proj.weight", d, d, Kind::kK, l);
    add(p + "self_attn.k_proj.bias", d, 1, Kind::kBiasK, l);
    add(p + "self_attn.v_proj.weight", d, d, Kind::kV, l);
    add(p + "self_attn.v_proj.bias", d, 1, Kind::kBias, l);
    add(p + "self_attn.o_proj.weight", d, d, Kind::kO, l);
    add(p + "post_attention_layernorm.weight", d, 1, Kind::kNormMlp, l);
    add(p + "mlp.gate_proj.weight", ffn, d, Kind::kGate, l);
    add(p + "mlp.up_proj.weight", ffn, d, Kind::kUp, l);
    add(p + "mlp.down_proj.weight", d, ffn, Kind::kDown, l);
  }
  add("model.norm.weight", d, 1, Kind::kNormFinal, layers);
  add("lm_head.weight", vocab, d, Kind::kHead, layers);
  size_t offset = 0;
  uint64_t mix = seed;
  for (TensorState& t : model) {
    t.layout.offset = offset;
    offset += t.layout.count();
    t.rng = Rng(SplitMix64(&mix));
  }
  *d_model = d;
  return model;
}

// Master weights as a pretrained model has them (not a pristine init).
void InitWeights(TensorState* t, const std::vector<uint64_t>& massive_cols, uint64_t d_model) {
  const size_t n = t->layout.count(), rows = t->layout.rows, cols = t->layout.cols;
  Rng& rng = t->rng;
  t->w.resize(n);
  switch (t->kind) {
    case Kind::kNormAttn:
    case Kind::kNormMlp:
    case Kind::kNormFinal: {
      const double mu = t->kind == Kind::kNormAttn  ? 0.25 + 0.5 * t->depth
                        : t->kind == Kind::kNormMlp ? 0.4 + 0.8 * t->depth
                                                    : 1.8;
      for (float& w : t->w) {
        w = static_cast<float>(mu) * rng.LogNormal(0.15);
        if (rng.Uniform() < 0.005) w *= static_cast<float>(2 + 4 * rng.Uniform());
      }
      return;
    }
    case Kind::kBias:
    case Kind::kBiasK: {
      const double scale = t->kind == Kind::kBiasK ? 0.08 : 0.02;
      for (float& w : t->w) {
        const double u = rng.Uniform() - 0.5;
        w = static_cast<float>(-scale * std::copysign(std::log(1 - 2 * std::fabs(u)), u));
      }
      return;
    }
    default: break;
  }
  double base;
  switch (t->kind) {
    case Kind::kEmbed: base = 0.018; break;
    case Kind::kHead: base = 0.022; break;
    case Kind::kQ:
    case Kind::kK: base = 0.8; break;
    case Kind::kV:
    case Kind::kDown: base = 0.55; break;
    case Kind::kO: base = 0.5; break;
    case Kind::kGate: base = 0.9; break;
    default: base = 0.7; break;  // kUp
  }
  if (t->kind != Kind::kEmbed && t->kind != Kind::kHead)
    base /= std::sqrt(static_cast<double>(cols));
  if (t->kind == Kind::kO || t->kind == Kind::kDown) base /= std::sqrt(1 + t->depth);
  const double row_sigma = (t->kind == Kind::kQ || t->kind == Kind::kK) ? 0.45 : 0.3;
  std::vector<float> col_factor(cols, 1.0f);
  const bool vocab = t->kind == Kind::kEmbed || t->kind == Kind::kHead;
  if (vocab) {
    for (size_t i = 0; i < std::min<size_t>(2, massive_cols.size()); ++i)
      col_factor[massive_cols[i]] = 3;
  } else if (cols == d_model) {
    for (uint64_t c : massive_cols) col_factor[c] = 4;
  }
  for (size_t r = 0; r < rows; ++r) {
    const float row_scale = rng.LogNormal(row_sigma) * static_cast<float>(base);
    float* w = t->w.data() + r * cols;
    for (size_t c = 0; c < cols; ++c) {
      float z = rng.Normal();
      const uint64_t bits = rng.Next();
      if ((bits & 0xFFFF) < 1966) z *= 2.5f;  // 3% wide-tail mixture
      if ((bits >> 32) < 42950) z *= 10.0f;   // 1e-5 outliers
      w[c] = z * row_scale * col_factor[c];
    }
  }
}

// Gradient structure and the Zipf activity of vocabulary rows.
void InitGradientModel(TensorState* t) {
  const size_t rows = t->layout.rows, cols = t->layout.cols;
  Rng& rng = t->rng;
  const double kappa = kMedianSnr * rng.LogNormal(0.5);
  t->kap_row.resize(rows);
  t->g_row.resize(rows);
  for (size_t r = 0; r < rows; ++r) {
    t->kap_row[r] = static_cast<float>(kappa) * rng.LogNormal(0.5);
    t->g_row[r] = rng.LogNormal(0.5);
  }
  t->kap_col.assign(cols, 1.0f);
  t->g_col.assign(cols, 1.0f);
  if (cols > 1) {
    for (size_t c = 0; c < cols; ++c) {
      t->kap_col[c] = rng.LogNormal(0.3);
      t->g_col[c] = rng.LogNormal(0.3);
    }
  }
  t->gamma_rel = rng.LogNormal(0.7);
  if (t->kind == Kind::kEmbed || t->kind == Kind::kHead) {
    // Zipf token frequencies over a random permutation of the rows.
    std::vector<size_t> rank(rows);
    std::iota(rank.begin(), rank.end(), size_t{1});
    for (size_t i = rows - 1; i > 0; --i) std::swap(rank[i], rank[t->rng.Next() % (i + 1)]);
    std::vector<double> freq(rows);
    double sum = 0;
    for (size_t r = 0; r < rows; ++r) sum += freq[r] = std::pow(rank[r] + 10.0, -1.1);
    for (double& f : freq) f /= sum;
    if (t->kind == Kind::kHead) {
      // The head's gradient for a token row scales with its probability mass.
      for (size_t r = 0; r < rows; ++r)
        t->g_row[r] *= static_cast<float>(std::sqrt(freq[r] * rows));
    } else {
      t->p_active.resize(rows);
      for (size_t r = 0; r < rows; ++r) {
        t->p_active[r] = static_cast<float>(1 - std::exp(-kTokensPerStep * freq[r]));
      }
    }
  }
  const size_t n = t->layout.count();
  t->z.resize(n);
  for (float& z : t->z) z = rng.Normal();
}

double MeanSquare(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return x.empty() ? 0 : s / x.size();
}

// Adam moments in steady state, as if kAdamStepsBefore steps had run at this activity.
void InitMoments(TensorState* t, double gamma) {
  const size_t rows = t->layout.rows, cols = t->layout.cols;
  const float bc1 = static_cast<float>(1 - std::pow(kBeta1, kAdamStepsBefore));
  const float bc2 = static_cast<float>(1 - std::pow(kBeta2, kAdamStepsBefore));
  const float noise = static_cast<float>(std::sqrt((1 - kBeta1) / (1 + kBeta1)));
  t->m.resize(t->layout.count());
  t->v.resize(t->layout.count());
  for (size_t r = 0; r < rows; ++r) {
    const float act = t->p_active.empty() ? 1.0f : t->p_active[r];
    const float g_r = static_cast<float>(gamma * t->gamma_rel) * t->g_row[r];
    for (size_t c = 0; c < cols; ++c) {
      const size_t i = r * cols + c;
      const float kap = t->kap_row[r] * t->kap_col[c];
      const float gsc = g_r * t->g_col[c];
      t->v[i] = (kap * kap + 1) * gsc * gsc * act * bc2;
      t->m[i] = gsc * (kap * t->z[i] * act + noise * std::sqrt(act) * t->rng.Normal()) * bc1;
    }
  }
}

// One AdamW step on a tensor (Adam step number `k`). With `u_out`, the update direction
// is stored there and the weights are left alone (learning-rate calibration).
void Step(TensorState* t, double gamma, int k, double lr, float* u_out) {
  const size_t rows = t->layout.rows, cols = t->layout.cols;
  const float b1 = static_cast<float>(kBeta1), b2 = static_cast<float>(kBeta2);
  const float inv_bc1 = static_cast<float>(1 / (1 - std::pow(kBeta1, k)));
  const float inv_bc2 = static_cast<float>(1 / (1 - std::pow(kBeta2, k)));
  const float phi = static_cast<float>(kSignalCorrelation);
  const float innovation =
      static_cast<float>(std::sqrt(1 - kSignalCorrelation * kSignalCorrelation));
  const float decay = static_cast<float>(1 - lr * kWeightDecay), rate = static_cast<float>(lr);
  const float eps = static_cast<float>(kAdamEps);
  Rng& rng = t->rng;
  for (size_t r = 0; r < rows; ++r) {
    float g_r = static_cast<float>(gamma * t->gamma_rel) * t->g_row[r];
    if (!t->p_active.empty() && rng.Uniform() >= t->p_active[r]) g_r = 0;  // token unseen
    const float kap_r = t->kap_row[r];
    for (size_t c = 0; c < cols; ++c) {
      const size_t i = r * cols + c;
      float z = phi * t->z[i] + innovation * rng.Normal();
      t->z[i] = z;
      const float g = g_r * t->g_col[c] * (kap_r * t->kap_col[c] * z + rng.Normal());
      const float m = b1 * t->m[i] + (1 - b1) * g;
      const float v = b2 * t->v[i] + (1 - b2) * g * g;
      t->m[i] = m;
      t->v[i] = v;
      const float u = (m * inv_bc1) / (std::sqrt(v * inv_bc2) + eps);
      if (u_out != nullptr) {
        u_out[i] = u;
      } else {
        t->w[i] = t->w[i] * decay - rate * u;
      }
    }
  }
}

// Fraction of sampled weights whose BF16 value changes under w' = w (1 - lr wd) - lr u.
double ChangedFraction(const std::vector<float>& w, const std::vector<float>& u, double lr) {
  const float decay = static_cast<float>(1 - lr * kWeightDecay), rate = static_cast<float>(lr);
  size_t changed = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    changed += Bf16FromFloat(w[i] * decay - rate * u[i]) != Bf16FromFloat(w[i]);
  }
  return static_cast<double>(changed) / std::max<size_t>(1, w.size());
}

}  // namespace

Status Generate(const GeneratorOptions& options, GeneratedRun* run) {
  if (options.params < 10000 || !(options.target_density > 0 && options.target_density < 0.5) ||
      options.deltas < 1 || options.burnin_steps < 0) {
    return Status(ErrorCode::kInvalidArgument,
                  "generator: need params >= 10000, 0 < density < 0.5, deltas >= 1, burnin >= 0");
  }
  uint64_t d_model = 0;
  std::vector<TensorState> model = BuildModel(options.params, options.seed, &d_model);
  // Tensors go to workers largest first, for balance; results do not depend on the order.
  std::vector<size_t> order(model.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return model[a].layout.count() > model[b].layout.count();
  });
  const size_t workers = WorkerCount(options.threads, model.size());
  auto for_each_tensor = [&](const auto& func) {
    ParallelFor(order.size(), workers, [&](size_t task, size_t) { func(&model[order[task]]); });
  };

  uint64_t mix = options.seed ^ 0x5DEECE66Dull;
  Rng main_rng(SplitMix64(&mix));
  std::vector<uint64_t> massive_cols;  // a few "massive activation" input channels
  while (massive_cols.size() < std::max<uint64_t>(2, d_model / 300)) {
    const uint64_t c = main_rng.Next() % d_model;
    if (std::find(massive_cols.begin(), massive_cols.end(), c) == massive_cols.end())
      massive_cols.push_back(c);
  }
  for_each_tensor([&](TensorState* t) {
    InitWeights(t, massive_cols, d_model);
    InitGradientModel(t);
  });
  // Absolute gradient scale: global norm ~1 after clipping (grad clip 1.0 with typical
  // pre-clip norms above 1 makes it a near-constant factor, folded in here).
  double total = 0;
  for (const TensorState& t : model) {
    total += t.layout.count() * t.gamma_rel * t.gamma_rel * MeanSquare(t.g_row) *
             MeanSquare(t.g_col) * (MeanSquare(t.kap_row) * MeanSquare(t.kap_col) + 1);
  }
  const double gamma = 1 / std::sqrt(total);
  for_each_tensor([&](TensorState* t) { InitMoments(t, gamma); });

  // Calibration: the first update's direction, then bisection on the learning rate over
  // an evenly strided sample of all weights.
  int k = kAdamStepsBefore + 1;
  std::vector<FloatArray> first_update(model.size());
  for_each_tensor([&](TensorState* t) {
    FloatArray& u = first_update[t - model.data()];
    u.resize(t->layout.count());
    Step(t, gamma, k, 0, u.data());
  });
  const size_t total_params = model.back().layout.offset + model.back().layout.count();
  const size_t stride = std::max<size_t>(1, total_params / kCalibrationSamples);
  std::vector<float> sample_w, sample_u;
  for (size_t ti = 0; ti < model.size(); ++ti) {
    const size_t first = (stride - model[ti].layout.offset % stride) % stride;
    for (size_t i = first; i < model[ti].layout.count(); i += stride) {
      sample_w.push_back(model[ti].w[i]);
      sample_u.push_back(first_update[ti][i]);
    }
  }
  double lo = std::log(1e-10), hi = std::log(1e-1);
  for (int iter = 0; iter < 40; ++iter) {
    const double mid = 0.5 * (lo + hi);
    (ChangedFraction(sample_w, sample_u, std::exp(mid)) < options.target_density ? lo : hi) = mid;
  }
  const double lr = std::exp(0.5 * (lo + hi));
  for_each_tensor([&](TensorState* t) {
    const FloatArray& u = first_update[t - model.data()];
    const float decay = static_cast<float>(1 - lr * kWeightDecay), rate = static_cast<float>(lr);
    for (size_t i = 0; i < u.size(); ++i) t->w[i] = t->w[i] * decay - rate * u[i];
  });
  first_update = {};

  run->layout.clear();
  for (const TensorState& t : model) run->layout.push_back(t.layout);
  run->learning_rate = lr;
  run->snapshots.resize(options.deltas + 1);
  for (std::vector<uint16_t>& snapshot : run->snapshots) snapshot.resize(total_params);
  auto save = [&](const TensorState& t, int snapshot) {
    uint16_t* out = run->snapshots[snapshot].data() + t.layout.offset;
    for (size_t i = 0; i < t.w.size(); ++i) out[i] = Bf16FromFloat(t.w[i]);
  };
  for (int s = 0; s < options.burnin_steps; ++s) {
    ++k;
    for_each_tensor([&](TensorState* t) { Step(t, gamma, k, lr, nullptr); });
  }
  for_each_tensor([&](TensorState* t) { save(*t, 0); });
  for (int snapshot = 1; snapshot <= options.deltas; ++snapshot) {
    ++k;
    for_each_tensor([&](TensorState* t) {
      Step(t, gamma, k, lr, nullptr);
      save(*t, snapshot);
    });
  }
  return Status::Ok();
}

}  // namespace bench
}  // namespace arc_v3
