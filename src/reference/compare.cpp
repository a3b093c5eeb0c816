// Comparison of device results with the reference (tolerances: see evtc/reference.hpp).
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "evtc/error.hpp"
#include "evtc/reference.hpp"

namespace evtc {

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::f32: return {1e-5, 1e-5};
    case DType::f16: return {0x1p-10, 0x1p-11};
    case DType::bf16: return {0x1p-7, 0x1p-8};
    case DType::f8e4m3: return {0x1p-3, 0x1p-4};
    case DType::f8e5m2: return {0x1p-2, 0x1p-3};
    case DType::i32:
    case DType::i64: break;  // never an output's type (Graph refuses it)
  }
  internal_fail(__FILE__, __LINE__, "tolerance_for: unknown dtype");
}

namespace {
double rms_of_finite(std::span<const double> values) {
  double sum_sq = 0.0;
  size_t count = 0;
  for (double w : values)
    if (std::isfinite(w)) {
      sum_sq += w * w;
      ++count;
    }
  return count == 0 ? 0.0 : std::sqrt(sum_sq / static_cast<double>(count));
}
}  // namespace

Comparison compare_outputs(std::span<const double> got, std::span<const double> want,
                           const Tolerance& tolerance, double atol_scale) {
  return compare_outputs(got, want, tolerance, atol_scale, {});
}

Comparison compare_outputs(std::span<const double> got, std::span<const double> want,
                           const Tolerance& tolerance, double atol_scale, std::span<const double> slack,
                           std::span<const char> exact) {
  if (got.size() != want.size())
    throw UserError(fmt::format("cannot compare {} values with a reference of {} values",
                                got.size(), want.size()));
  if (!slack.empty() && slack.size() != want.size())
    throw UserError(fmt::format("cannot compare with {} allowances for {} values", slack.size(), want.size()));
  if (!exact.empty() && exact.size() != want.size())
    throw UserError(fmt::format("cannot compare with {} exactness flags for {} values", exact.size(), want.size()));
  Comparison c;
  c.count = got.size();
  c.rtol = tolerance.rtol;
  c.max_rel_l2 = tolerance.max_rel_l2;
  c.atol = tolerance.rtol * rms_of_finite(want) * atol_scale;
  double diff_sq = 0.0, want_sq = 0.0, slack_sq = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double allowance = slack.empty() || !std::isfinite(slack[i]) ? 0.0 : slack[i];
    const double g = got[i], w = want[i];
    bool bad = false;
    const bool must_equal = !exact.empty() && exact[i];
    if (must_equal) {
      ++c.exact;
      bad = !(g == w || (std::isnan(g) && std::isnan(w)));
      c.exact_mismatch += bad;
      if (std::isfinite(g) && std::isfinite(w)) {
        const double d = std::fabs(g - w);
        c.max_abs = std::max(c.max_abs, d);
        if (w != 0.0) c.max_rel = std::max(c.max_rel, d / std::fabs(w));
        diff_sq += d * d;
        want_sq += w * w;
      }
    } else if (std::isnan(g) || std::isnan(w)) {
      bad = std::isnan(g) != std::isnan(w);
      c.nan_mismatch += bad;
    } else if (std::isinf(g) || std::isinf(w)) {
      bad = g != w;
    } else {
      const double d = std::fabs(g - w);
      c.max_abs = std::max(c.max_abs, d);
      if (w != 0.0) c.max_rel = std::max(c.max_rel, d / std::fabs(w));
      diff_sq += d * d;
      want_sq += w * w;
      slack_sq += allowance * allowance;
      bad = d > c.atol + c.rtol * std::fabs(w) + allowance;
    }
    if (bad && c.mismatches++ == 0) {
      c.first_bad = i;
      c.first_bad_got = g;
      c.first_bad_want = w;
    }
  }
  c.rel_l2 = want_sq > 0.0   ? std::sqrt(diff_sq / want_sq)
             : diff_sq > 0.0 ? std::numeric_limits<double>::infinity()
                             : 0.0;
  if (want_sq > 0.0) c.max_rel_l2 += std::sqrt(slack_sq / want_sq);
  c.pass = c.mismatches == 0 && c.rel_l2 <= c.max_rel_l2;
  return c;
}

Comparison compare_outputs(std::span<const double> got, std::span<const double> want,
                           DType dtype, double atol_scale) {
  return compare_outputs(got, want, tolerance_for(dtype), atol_scale);
}

std::string Comparison::describe() const {
  std::string s = fmt::format(
      "{}: {} values, max_abs {:.3g}, max_rel {:.3g}, rel_l2 {:.3g} (bound {:.3g}), {} outside "
      "|got-want| <= {:.3g} + {:.3g}*|want|",
      pass ? "PASS" : "FAIL", count, max_abs, max_rel, rel_l2, max_rel_l2, mismatches, atol, rtol);
  if (exact > 0) s += fmt::format(", {} of {} exact values differ", exact_mismatch, exact);
  if (nan_mismatch > 0) s += fmt::format(", {} NaN where the other is not", nan_mismatch);
  if (mismatches > 0)
    s += fmt::format("; first at [{}]: got {}, want {}", first_bad, first_bad_got, first_bad_want);
  if (rounding_flips)
    s += "; allowed: an intermediate value rounded to a narrower type lands on the neighbouring value there";
  return s;
}

}  // namespace evtc
