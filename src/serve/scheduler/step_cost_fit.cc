#include "serve/scheduler/step_cost_fit.h"

#include <algorithm>
#include <cmath>

namespace stoke {
namespace {

constexpr double kTokScale = 1024.0, kKvScale = 65536.0;
constexpr double kRidge = 1e-9;  // relative to Σ w (the weight of the constant feature)

}  // namespace

std::array<double, 3> StepCostFit::Features(double tokens, double kv_positions) {
  return {1.0, tokens / kTokScale, kv_positions / kKvScale};
}

void StepCostFit::Add(double tokens, double kv_positions, double seconds) {
  const std::array<double, 3> x = Features(tokens, kv_positions);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) xtx_[i][j] = decay_ * xtx_[i][j] + x[i] * x[j];
    xty_[i] = decay_ * xty_[i] + x[i] * seconds;
  }
  ++samples_;
}

std::array<double, 3> StepCostFit::Solve() const {
  // (XᵀX + ridge I) c = Xᵀy by Gaussian elimination with partial pivoting (3x3).
  double a[3][4];
  const double ridge = kRidge * std::max(1.0, xtx_[0][0]);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) a[i][j] = xtx_[i][j] + (i == j ? ridge : 0.0);
    a[i][3] = xty_[i];
  }
  for (int c = 0; c < 3; ++c) {
    int p = c;
    for (int r = c + 1; r < 3; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
    }
    if (std::abs(a[p][c]) < 1e-300) return {0, 0, 0};
    for (int k = 0; k < 4; ++k) std::swap(a[c][k], a[p][k]);
    for (int r = 0; r < 3; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (int k = c; k < 4; ++k) a[r][k] -= f * a[c][k];
    }
  }
  return {a[0][3] / a[0][0], a[1][3] / a[1][1], a[2][3] / a[2][2]};
}

std::array<double, 3> StepCostFit::coefficients() const {
  const std::array<double, 3> c = Solve();
  return {c[0], c[1] / kTokScale, c[2] / kKvScale};
}

double StepCostFit::Predict(double tokens, double kv_positions) const {
  const std::array<double, 3> c = Solve(), x = Features(tokens, kv_positions);
  return c[0] * x[0] + c[1] * x[1] + c[2] * x[2];
}

std::optional<Scheduler::PrefillRoom> StepCostFit::Room(double target_seconds, int decode_tokens,
                                                        int64_t decode_kv_positions, int min_tokens,
                                                        int64_t min_samples) const {
  if (samples_ < min_samples) return std::nullopt;
  const std::array<double, 3> c = coefficients();
  Scheduler::PrefillRoom r;
  r.seconds = target_seconds - Predict(decode_tokens, static_cast<double>(decode_kv_positions));
  r.per_token = std::max(0.0, c[1]);
  r.per_kv_position = std::max(0.0, c[2]);
  r.min_tokens = min_tokens;
  return r;
}

}  // namespace stoke
