#include "tiermoe/model/rope_frequencies.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tiermoe {

namespace {

// transformers' get_mscale.
double yarn_mscale(double scale, double mscale = 1.0) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The dim whose wavelength turns `rotations` times over `max_positions`.
double correction_dim(double rotations, double dim, double base, double max_positions) {
  return dim * std::log(max_positions / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
}

}  // namespace

RopeFrequencies rope_frequencies(const ModelConfig& c) {
  RopeFrequencies r;
  r.rotary_dim = c.rotary_dim();
  r.theta = c.rope_theta;
  const RopeScaling& s = c.rope_scaling;
  if (s.kind == RopeScaling::Kind::none) return r;
  const int64_t dim = c.rotary_dim();
  const double base = c.rope_theta, orig = double(s.original_max_position_embeddings);
  if (s.attention_factor) {
    r.attention_factor = *s.attention_factor;
  } else if (s.mscale && s.mscale_all_dim && *s.mscale != 0 && *s.mscale_all_dim != 0) {
    r.attention_factor =
        yarn_mscale(s.factor, *s.mscale) / yarn_mscale(s.factor, *s.mscale_all_dim);
  } else {
    r.attention_factor = yarn_mscale(s.factor);
  }
  double low = correction_dim(s.beta_fast, double(dim), base, orig);
  double high = correction_dim(s.beta_slow, double(dim), base, orig);
  if (s.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;  // as transformers: no zero-width ramp
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double pos_freq = std::pow(base, double(2 * i) / double(dim));
    const double extrapolation = 1.0 / pos_freq, interpolation = 1.0 / (s.factor * pos_freq);
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double extra_factor = 1.0 - ramp;
    r.inv_freq.push_back(interpolation * (1.0 - extra_factor) + extrapolation * extra_factor);
  }
  return r;
}

double attention_softmax_scale(const ModelConfig& c) {
  double scale = 1.0 / std::sqrt(double(c.qk_head_dim()));
  const RopeScaling& s = c.rope_scaling;
  if (c.mla() && s.kind != RopeScaling::Kind::none && s.mscale_all_dim && *s.mscale_all_dim != 0) {
    const double m = yarn_mscale(s.factor, *s.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

}  // namespace tiermoe
