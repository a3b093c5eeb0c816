// The fp64 reference interpreter: the truth every GPU result is compared with.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "evtc/graph.hpp"
#include "evtc/types.hpp"

namespace evtc {

// Inputs hold values exactly as stored on the device (already rounded to their dtype).
struct ReferenceInputs {
  int64_t m = 0, n = 0, k = 0;
  std::vector<double> a;  // m×k, row-major
  std::vector<double> b;  // k×n, row-major
  // Optional precomputed accumulator (m×n row-major); when set, a and b are not used.
  std::vector<double> acc;
  std::vector<double> c;  // m×n row-major, if the graph reads C
  // fp8 block scales (GemmDesc::fp8_blockwise), empty otherwise: when set, the accumulator is
  // Σ_k a[i,k]·scale_a[i,k/128]·b[k,j]·scale_b[k/128,j/128]. scale_a is m × ceil(k/128) and
  // scale_b ceil(k/128) × ceil(n/128), both row-major here (the device layouts are the
  // runtime's concern).
  std::vector<double> scale_a;
  std::vector<double> scale_b;
  // By operand name: scalar -> 1 value, row_vec -> n, col_vec -> m, aux -> m×n row-major.
  std::map<std::string, std::vector<double>> operands;
};

struct ReferenceOptions {
  // false: compute nodes in fp64 (the truth). true: round every compute result to its dtype
  // (f32), as the GPU does.
  bool round_compute = false;
  // Nonzero: every compute result and the accumulator become v·(1 + perturb·s), s = ±1 drawn
  // per node and element from perturb_seed. A model of the device's rounding and approximation
  // error: how far the outputs move from the unperturbed reference estimates how much each
  // element amplifies such errors (its condition), which random testing adds to its bound.
  double perturb = 0;
  uint64_t perturb_seed = 0;
  // Nonzero: the accumulator also gets perturb_accumulator × its rms added, with a random sign
  // per element: the main loop's error is absolute (a sum of K products rounded as it goes),
  // so an element that cancels to about 0 moves by as much as any other.
  double perturb_accumulator = 0;
  // true: every perturbation above goes the other way (each sign s becomes -s). A comparison of
  // a perturbed value flips only where the perturbation crosses its threshold; the two signs
  // together cover both sides.
  bool perturb_mirror = false;
  // true: outputs keep the value they would be stored from, unrounded to their dtype.
  bool unrounded_outputs = false;
};

// By output name: [m,n] outputs m×n row-major; gated [m,n/2] outputs m×n/2 row-major; row reductions m values, col reductions n,
// whole-matrix reductions 1. Every output is rounded to its store dtype.
using ReferenceOutputs = std::map<std::string, std::vector<double>>;

// Evaluates the nodes that reach an output, in fp64. The accumulator is A@B in fp64 (rounded
// to f32 when options.round_compute); loads are the given values rounded to the node's
// dtype, so raw doubles read as the device would read them. Aux operands and outputs are
// row-major whatever their layout in the graph (the layout concerns device memory only).
// Operands the graph does not read are ignored (a pass may have removed their use).
// Throws UserError naming the operand when an input is missing or has the wrong length.
ReferenceOutputs evaluate_reference(const Graph& g, const ReferenceInputs& inputs,
                                    const ReferenceOptions& options = {});

// Fresh inputs for g on an m×n×k problem: A (m×k, a_dtype), B (k×n, b_dtype), C when g reads
// it, and every operand g names, drawn from normal distributions and rounded to their
// dtypes. A and B have standard deviation k^(-1/4), so that A@B is about N(0, 1) and
// activations are exercised where they bend rather than only where they saturate; C and
// the operands are N(0, 1). Each input has its own stream derived from (seed, its name), so
// adding an operand to a graph does not change the values of the others. The normal variates
// come from std::mt19937_64 through a fixed transform rather than std::normal_distribution,
// whose algorithm differs between standard libraries.
ReferenceInputs random_reference_inputs(const Graph& g, int64_t m, int64_t n, int64_t k,
                                        DType a_dtype, DType b_dtype, uint64_t seed);

// Fills inputs.scale_a and scale_b with fresh fp8 block scales for its m×n×k problem: f32
// values 2^e·u, e uniform in {-3, ..., 3} and u uniform in [0.5, 1), each from its own stream
// of `seed`, so that neighbouring blocks differ in magnitude as quantised weights do.
void add_random_block_scales(ReferenceInputs& inputs, uint64_t seed);
// `count` such scales from the stream `stream` of `seed` (the grouped harness draws its own).
std::vector<double> random_block_scales(uint64_t seed, std::string_view stream, size_t count);
// Integer-valued inputs for exact testing (what CUTLASS's own testbed does): A and B from
// {-1, 0, 1}, C and every operand from {-3, ..., 3}, each input its own stream of (seed, name).
// Every dtype holds these exactly, and an epilogue of ops exact on integers (OpInfo) computes
// integers exactly while they stay below 2^24, so the device must match the reference bit for bit.
ReferenceInputs random_integer_inputs(const Graph& g, int64_t m, int64_t n, int64_t k, uint64_t seed);

// --- comparing device results with the reference ---------------------------------------
//
// An element passes when |got - want| <= atol + rtol * |want|, atol = rtol * rms(want) *
// atol_scale (rms over the reference's finite values): a relative bound, with an absolute
// floor in proportion to the data's magnitude for values that cancel to near zero.
// rtol is one unit in the last place of the output dtype: a device result computed in f32
// and the fp64 truth, rounded to the same dtype, may land on adjacent representable values.
// The whole output must also have rel_l2 = ||got - want|| / ||want|| <= max_rel_l2, the unit
// roundoff (half an ulp), which catches a small error applied to every element.
//
//   dtype    rtol           max_rel_l2
//   f32      1e-5           1e-5        (f32 accumulation order and fast device math)
//   f16      2^-10          2^-11
//   bf16     2^-7           2^-8
//   f8e4m3   2^-3           2^-4
//   f8e5m2   2^-2           2^-3
//
// NaN must match NaN; an infinite reference value must be matched exactly; a non-finite
// device value where the reference is finite fails.
struct Tolerance {
  double rtol = 0;
  double max_rel_l2 = 0;
};
Tolerance tolerance_for(DType dtype);

struct Comparison {
  size_t count = 0;         // elements compared
  double max_abs = 0;       // max |got - want| over elements where both are finite
  double max_rel = 0;       // max |got - want| / |want| over those with want != 0
  double rel_l2 = 0;        // ||got - want|| / ||want|| over elements where both are finite
  size_t mismatches = 0;    // elements outside the per-element bound (NaN ones included)
  size_t nan_mismatch = 0;  // elements where exactly one of got and want is NaN
  size_t exact = 0;         // elements that had to match bit for bit (mismatches include theirs)
  size_t exact_mismatch = 0;
  bool pass = false;
  // Passed although `mismatches` elements are outside their bound, because the output rounds an
  // intermediate value to a narrower type and they are few (runtime::check_outputs).
  bool rounding_flips = false;
  double rtol = 0, atol = 0, max_rel_l2 = 0;  // the bounds applied
  // The first element that failed, if any: its index and values.
  size_t first_bad = 0;
  double first_bad_got = 0, first_bad_want = 0;
  // One line: "PASS: 1024 values, max_abs ..." or "FAIL: ...; first at [17]: got 1.5, want 1".
  std::string describe() const;
};

// Throws UserError when the spans differ in length.
Comparison compare_outputs(std::span<const double> got, std::span<const double> want,
                           DType dtype, double atol_scale = 1.0);
Comparison compare_outputs(std::span<const double> got, std::span<const double> want,
                           const Tolerance& tolerance, double atol_scale = 1.0);
// With an extra allowance per element (`slack`, empty or as long as `want`), added to that
// element's bound, and ||slack|| / ||want|| added to the rel_l2 bound; and elements that must
// match exactly (`exact`, empty or as long as `want`: nonzero where the device computes the
// value exactly, as with integer inputs), counted in Comparison::exact.
Comparison compare_outputs(std::span<const double> got, std::span<const double> want,
                           const Tolerance& tolerance, double atol_scale, std::span<const double> slack,
                           std::span<const char> exact = {});

}  // namespace evtc
