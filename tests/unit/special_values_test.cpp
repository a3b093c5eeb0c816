// NaN, infinities and signed zeros through every op: the fp64 reference (the op table) and the
// device forms (evtc/device/op_list.inc, compiled here for the host: the same expressions the
// kernels use, with the precise forms of the transcendental functions) agree, and both follow
// PyTorch, where a NaN input gives a NaN output (relu(NaN) and max(NaN, 0) are NaN) except
// where the value is not used (where's unselected branch), IEEE pow defines it (pow(1, NaN)
// and pow(NaN, 0) are 1) or the op compares (a comparison with NaN is false, != true).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "evtc/ops.hpp"

// CUDA's rsqrtf, for the host.
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
#define EVTC_PRECISE_MATH
#include "evtc/device/math.cuh"

namespace {

using namespace evtc;

struct DeviceForm {
  int arity;
  std::function<float(float, float, float)> fn;
};

// Every device form by functor name (the op table's cuda_functor column).
const std::map<std::string, DeviceForm>& device_forms() {
  static const std::map<std::string, DeviceForm> forms = [] {
    std::map<std::string, DeviceForm> m;
    using namespace evtc::device;
#define EVTC_UNARY_FN(NAME, EXPR) m[#NAME] = {1, [](float x, float, float) { return EXPR; }};
#define EVTC_BINARY_FN(NAME, EXPR) m[#NAME] = {2, [](float a, float b, float) { return EXPR; }};
#define EVTC_TERNARY_FN(NAME, EXPR) m[#NAME] = {3, [](float a, float b, float c) { return EXPR; }};
#include "evtc/device/op_list.inc"
#undef EVTC_UNARY_FN
#undef EVTC_BINARY_FN
#undef EVTC_TERNARY_FN
    m["LeakyRelu"] = {1, [](float x, float, float) { return LeakyReluFn{}(x, 0.01f); }};
    return m;
  }();
  return forms;
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
const std::vector<double> kValues = {kNaN, kInf, -kInf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 30.0, -30.0};

// Whether PyTorch gives NaN for these arguments because one of them is NaN (other NaNs, such as
// log(-1) or inf - inf, come from the arithmetic and are checked by the agreement alone).
bool nan_expected(const OpInfo& op, const std::vector<double>& args) {
  bool any_nan = false;
  for (double a : args) any_nan = any_nan || std::isnan(a);
  if (!any_nan) return false;
  if (op.comparison) return false;  // NaN > 0 is false, NaN != 0 true: never NaN
  if (op.op == Op::where) return std::isnan(args[0] != 0.0 ? args[1] : args[2]);
  if (op.op == Op::pow) return !(args[0] == 1.0 || args[1] == 0.0);
  if (op.op == Op::clamp) return std::isnan(args[0]);  // NaN bounds: not an epilogue's case
  return true;
}

// The same value: both NaN, or equal within float's precision (infinities of one sign).
bool agree(double ref, float dev) {
  if (std::isnan(ref) || std::isnan(dev)) return std::isnan(ref) && std::isnan(dev);
  if (std::isinf(ref) || std::isinf(dev)) return ref == double(dev);
  return std::fabs(ref - dev) <= 1e-5 * std::max(1.0, std::fabs(ref));
}

TEST(SpecialValues, ReferenceAndDeviceAgreeAndFollowPyTorch) {
  for (const OpInfo& op : op_table()) {
    const auto form = device_forms().find(std::string(op.cuda_functor));
    ASSERT_NE(form, device_forms().end()) << op.name << ": no device form " << op.cuda_functor;
    ASSERT_EQ(form->second.arity, op.arity) << op.name;
    std::vector<std::vector<double>> cases;
    for (double a : kValues) {
      if (op.arity == 1) { cases.push_back({a}); continue; }
      for (double b : {kNaN, kInf, -kInf, 0.0, 1.0, -2.0, 3.0}) {
        if (op.arity == 2) { cases.push_back({a, b}); continue; }
        cases.push_back({a, b, 4.0});
        cases.push_back({a, -4.0, b});
      }
    }
    std::vector<double> attrs(op.attr_defaults.begin(), op.attr_defaults.begin() + op.num_attrs);
    for (const auto& args : cases) {
      const double ref = op.cpu(args, attrs);
      const float dev = form->second.fn(float(args[0]), args.size() > 1 ? float(args[1]) : 0.0f,
                                        args.size() > 2 ? float(args[2]) : 0.0f);
      std::string where = std::string(op.name) + "(";
      for (size_t i = 0; i < args.size(); ++i) where += (i ? ", " : "") + std::to_string(args[i]);
      where += ")";
      EXPECT_TRUE(agree(ref, dev)) << where << ": reference " << ref << ", device " << dev;
      if (nan_expected(op, args)) EXPECT_TRUE(std::isnan(ref)) << where << ": a NaN input gave " << ref;
    }
  }
}

}  // namespace
