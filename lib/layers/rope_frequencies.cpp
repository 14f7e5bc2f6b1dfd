// RoPE frequency rules, written from the published definitions (Hugging Face transformers'
// modeling_rope_utils: linear, Llama 3, YaRN; the NTK-aware base change), in double precision so
// that the angle p * f'_j stays exact to ~1e-9 rad for positions up to ~1e7.
#include "layers/rope_frequencies.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <string>

#include "api/checks.h"

namespace cpuattn::detail {
namespace {

std::string num_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void require(bool ok, const char* name, const char* field, double value, const char* range) {
  if (!ok) {
    fail(std::string(name) + "." + field + " must be " + range + ", got " + num_str(value));
  }
}

// Llama 3.1: high frequencies (short wavelengths) kept, low ones divided by s, a linear blend of
// the two between the wavelengths L0 / high_freq_factor and L0 / low_freq_factor.
double llama3(double f, const RopeScaling& sc) {
  const double L0 = static_cast<double>(sc.original_max_position);
  const double wavelen = 2 * std::numbers::pi / f;
  if (wavelen < L0 / sc.high_freq_factor) return f;
  if (wavelen > L0 / sc.low_freq_factor) return f / sc.factor;
  const double t = (L0 / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor);
  return (1 - t) * f / sc.factor + t * f;
}

// YaRN's dimension whose pair turns `rotations` times over the original context.
double yarn_correction_dim(double rotations, double R, double base, double L0) {
  return R * std::log(L0 / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
}

}  // namespace

void check_rope_scaling(const char* name, const RopeScaling& sc) {
  const std::string n = std::string(name);
  switch (sc.type) {
    case RopeScalingType::none:
      return;
    case RopeScalingType::linear:
    case RopeScalingType::ntk:
    case RopeScalingType::llama3:
    case RopeScalingType::yarn:
      break;
    default:
      fail(n + ".type has invalid value " + std::to_string(static_cast<int>(sc.type)) +
           "; expected none, linear, ntk, llama3 or yarn");
  }
  require(std::isfinite(sc.factor) && sc.factor >= 1, name, "factor", sc.factor, "finite and >= 1");
  if (sc.type == RopeScalingType::llama3 || sc.type == RopeScalingType::yarn) {
    if (sc.original_max_position < 1) {
      fail(n + ".original_max_position must be >= 1, got " +
           std::to_string(sc.original_max_position));
    }
  }
  if (sc.type == RopeScalingType::llama3) {
    require(std::isfinite(sc.low_freq_factor) && sc.low_freq_factor > 0, name, "low_freq_factor",
            sc.low_freq_factor, "finite and > 0");
    require(std::isfinite(sc.high_freq_factor) && sc.high_freq_factor > sc.low_freq_factor, name,
            "high_freq_factor", sc.high_freq_factor,
            ("finite and > low_freq_factor (" + num_str(sc.low_freq_factor) + ")").c_str());
  }
  if (sc.type == RopeScalingType::yarn) {
    require(std::isfinite(sc.beta_slow) && sc.beta_slow > 0, name, "beta_slow", sc.beta_slow,
            "finite and > 0");
    require(std::isfinite(sc.beta_fast) && sc.beta_fast > sc.beta_slow, name, "beta_fast",
            sc.beta_fast, ("finite and > beta_slow (" + num_str(sc.beta_slow) + ")").c_str());
    require(std::isfinite(sc.attention_factor) && sc.attention_factor >= 0, name,
            "attention_factor", sc.attention_factor, "finite and >= 0 (0: 0.1 ln factor + 1)");
  }
}

RopeFrequencies rope_frequencies(const RopeOptions& opts, std::int64_t R) {
  const RopeScaling& sc = opts.scaling;
  const std::int64_t half = R / 2;
  const auto Rd = static_cast<double>(R);
  // NTK-aware: the base grows so that the lowest frequency, base^(-(R-2)/R), is divided by s.
  const double base = sc.type == RopeScalingType::ntk && R > 2
                          ? opts.base * std::pow(sc.factor, Rd / (Rd - 2))
                          : opts.base;
  RopeFrequencies out;
  out.inv_freq.resize(static_cast<std::size_t>(half));
  double lo = 0, hi = 0;
  if (sc.type == RopeScalingType::yarn) {
    const auto L0 = static_cast<double>(sc.original_max_position);
    lo = std::max(std::floor(yarn_correction_dim(sc.beta_fast, Rd, base, L0)), 0.0);
    hi = std::min(std::ceil(yarn_correction_dim(sc.beta_slow, Rd, base, L0)), Rd - 1);
    if (lo == hi) hi += 0.001;
    out.attention_factor = sc.attention_factor > 0 ? sc.attention_factor
                           : sc.factor > 1         ? 0.1 * std::log(sc.factor) + 1
                                                   : 1.0;
  }
  for (std::int64_t j = 0; j < half; ++j) {
    const double f = std::pow(base, -2.0 * static_cast<double>(j) / Rd);
    double g = f;
    switch (sc.type) {
      case RopeScalingType::linear:
        g = f / sc.factor;
        break;
      case RopeScalingType::llama3:
        g = llama3(f, sc);
        break;
      case RopeScalingType::yarn: {
        const double t = std::clamp((static_cast<double>(j) - lo) / (hi - lo), 0.0, 1.0);
        g = t * (f / sc.factor) + (1 - t) * f;
        break;
      }
      default:
        break;
    }
    out.inv_freq[static_cast<std::size_t>(j)] = g;
  }
  return out;
}

void rope_turns(const RopeFrequencies& f, double position, float* cosv, float* sinv) {
  for (std::size_t j = 0; j < f.inv_freq.size(); ++j) {
    const double angle = position * f.inv_freq[j];
    cosv[j] = static_cast<float>(f.attention_factor * std::cos(angle));
    sinv[j] = static_cast<float>(f.attention_factor * std::sin(angle));
  }
}

void rope_rotate(float* head, std::int64_t half, bool interleaved, const float* cosv,
                 const float* sinv) {
  if (interleaved) {
    for (std::int64_t j = 0; j < half; ++j) {
      const float x1 = head[2 * j], x2 = head[2 * j + 1];
      head[2 * j] = x1 * cosv[j] - x2 * sinv[j];
      head[2 * j + 1] = x1 * sinv[j] + x2 * cosv[j];
    }
  } else {
    float* const h2 = head + half;
    for (std::int64_t j = 0; j < half; ++j) {
      const float x1 = head[j], x2 = h2[j];
      head[j] = x1 * cosv[j] - x2 * sinv[j];
      h2[j] = x1 * sinv[j] + x2 * cosv[j];
    }
  }
}

}  // namespace cpuattn::detail
