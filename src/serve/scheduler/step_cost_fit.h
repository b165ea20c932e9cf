// A running fit of what an engine step costs, for the step-time target (LlmLoopOptions::target_step_ms,
// --target-step-ms): each step's measured time y against its tokens and the KV positions its attention read,
//   y ≈ c0 + c_tok · tokens + c_kv · kv_positions,
// by exponentially weighted least squares (each step's weight decays by `decay` per later step, so the fit
// follows a drifting machine; a small ridge keeps it defined before the features vary). Plain arithmetic: no
// clock, no model; tests feed it synthetic steps.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "serve/scheduler/scheduler.h"

namespace stoke {

class StepCostFit {
 public:
  explicit StepCostFit(double decay = 0.98) : decay_(decay) {}

  void Add(double tokens, double kv_positions, double seconds);
  int64_t samples() const { return samples_; }
  // Seconds predicted for a step of `tokens` tokens whose attention reads `kv_positions` positions.
  double Predict(double tokens, double kv_positions) const;
  // The fitted (c0, c_tok, c_kv) in seconds, per token, per KV position.
  std::array<double, 3> coefficients() const;

  // The time a step's prefill chunks may take so that its predicted time stays within `target_seconds`, after
  // its `decode_tokens` decodes reading `decode_kv_positions` positions, with the fitted cost of a prefill
  // token and of a KV position (each at least 0; min_tokens passed through: Scheduler::set_prefill_room).
  // nullopt (no limit) until `min_samples` steps have been seen.
  std::optional<Scheduler::PrefillRoom> Room(double target_seconds, int decode_tokens,
                                             int64_t decode_kv_positions, int min_tokens,
                                             int64_t min_samples = 8) const;

 private:
  // Features scaled to similar magnitudes (1, tokens / 1024, KV positions / 65536) for the 3x3 solve.
  static std::array<double, 3> Features(double tokens, double kv_positions);
  std::array<double, 3> Solve() const;  // scaled coefficients

  double decay_;
  std::array<std::array<double, 3>, 3> xtx_{};  // Σ w x xᵀ
  std::array<double, 3> xty_{};                  // Σ w x y
  int64_t samples_ = 0;
};

}  // namespace stoke
