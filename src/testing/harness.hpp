// Device-side harness shared by `evtc run` and the GPU tests: uploads a problem's inputs,
// poisons the outputs, runs a Kernel, reads the outputs back and compares them with the fp64
// reference interpreter.
#pragma once
#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "evtc/reference.hpp"
#include "evtc/runtime.hpp"
#include "runtime/device_buffer.hpp"
#include "runtime/event_timing.hpp"

namespace evtc::runtime {

class DeviceProblem {
 public:
  // Uploads A (in the kernel's A layout), B (in its B layout), C and every operand of
  // `inputs`, and allocates every output of the kernel's signature.
  DeviceProblem(const Kernel& kernel, const ReferenceInputs& inputs);
  // Arguments for Kernel::run over these buffers.
  const Arguments& arguments() const { return args_; }
  // Fills every output with all-ones bytes (NaN in every float dtype), so an element the
  // kernel does not write shows up in the comparison.
  void poison_outputs(cudaStream_t stream) const;
  // Copies the outputs back (synchronises `stream`).
  ReferenceOutputs read_outputs(cudaStream_t stream) const;

 private:
  const Kernel& kernel_;
  std::map<std::string, DeviceBuffer> buffers_;
  std::map<std::string, std::pair<DType, size_t>> outputs_;  // dtype, element count
  Arguments args_;
};

// How closely a device output must match the reference: the dtype's tolerance (see
// reference.hpp), widened for f32 outputs when the epilogue uses the fast hardware math
// forms (relative error up to about 2^-11), and for reductions (fp32 accumulation in a
// different order over many values, atomics included): rtol 2e-3 for sums; and for fp8 A/B,
// whose products the tensor cores add with fewer bits than fp32: rtol 2^-11, or 2^-6 with
// the fast-accumulation main loop.
Tolerance output_tolerance(const Kernel& kernel, const std::string& output);

struct OutputCheck {
  std::string name;
  Comparison comparison;
};
// Compares every output with the reference; pass when all pass.
std::vector<OutputCheck> check_outputs(const Kernel& kernel, const ReferenceOutputs& got,
                                       const ReferenceOutputs& want);

// What a kernel's outputs on `inputs` must match, and the allowance per element:
//  - want: the fp64 reference;
//  - slack: twice how far each output element moves when every computed value (and the
//    accumulator) is perturbed by the device's relative error (2^-11 where the epilogue uses
//    the fast hardware math forms, else 2^-23), and the accumulator also by the main loop's
//    absolute error (2^-11 of its rms for fp8 A/B, 2^-7 with fast accumulation, 2^-19 for
//    16-bit A/B): an estimate of how much that element amplifies such errors (a pow of a
//    tanh, a product with a large operand, a `where` whose condition is a sum that cancels to
//    0), added to its bound;
//  - exact (integer inputs): elements the device computes exactly, which must match bit for
//    bit: those whose evaluation with every computed value rounded to f32 equals the fp64 one
//    before the output's rounding, outside sum reductions (whose order the device chooses).
struct Expected {
  ReferenceOutputs want;
  std::map<std::string, std::vector<double>> slack;
  std::map<std::string, std::vector<char>> exact;
};
Expected expected_outputs(const Kernel& kernel, const ReferenceInputs& inputs, bool integer_inputs);
// Compares with `expected`. An output whose value passes through a rounding of an intermediate
// value to a narrower type (bf16(...), f16(...), an fp8 cast) before its own store may differ on
// a few elements: where the value sits at a rounding boundary, the device's f32 value and the
// reference's fp64 value round to neighbouring representable values, and what follows can
// amplify that one step beyond the output's tolerance. Such an output passes (with
// Comparison::rounding_flips set) when no exact element differs, no NaN differs, at most 0.5 %
// of the elements (or 8) are outside their bound and rel_l2 is within four times its bound.
std::vector<OutputCheck> check_outputs(const Kernel& kernel, const ReferenceOutputs& got, const Expected& expected);
// Whether the value stored by output `name` passes through a rounding to a narrower type
// before the output's own rounding.
bool rounds_intermediate(const Graph& graph, const std::string& name);


}  // namespace evtc::runtime
