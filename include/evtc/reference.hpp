// The fp64 reference interpreter: the truth every GPU result is compared with.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "evtc/graph.hpp"

namespace evtc {

// Inputs hold values exactly as stored on the device (already rounded to their dtype).
struct ReferenceInputs {
  int64_t m = 0, n = 0, k = 0;
  std::vector<double> a;  // m×k, row-major
  std::vector<double> b;  // k×n, row-major
  // Optional precomputed accumulator (m×n row-major); when set, a and b are not used.
  std::vector<double> acc;
  std::vector<double> c;  // m×n row-major, if the graph reads C
  // By operand name: scalar -> 1 value, row_vec -> n, col_vec -> m, aux -> m×n row-major.
  std::map<std::string, std::vector<double>> operands;
};

struct ReferenceOptions {
  // false: compute nodes in fp64 (the truth). true: round every compute result to its dtype
  // (f32), as the GPU does.
  bool round_compute = false;
};

// By output name: [m,n] outputs m×n row-major; row reductions m values, col reductions n,
// whole-matrix reductions 1. Every output is rounded to its store dtype.
using ReferenceOutputs = std::map<std::string, std::vector<double>>;

ReferenceOutputs evaluate_reference(const Graph& g, const ReferenceInputs& inputs,
                                    const ReferenceOptions& options = {});

}  // namespace evtc
