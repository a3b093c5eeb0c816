// The check `evtc fuzz --cpu` makes of the pass pipeline without a GPU: the fp64 reference of an
// epilogue after the passes against the one before them, on small inputs, and the record its
// --json report keeps of each output that fails.
//
// The passes may compute a value in f32 that the graph before them computes in fp64 (a folded
// constant, `erf(2)`, becomes an f32 literal). Where an output subtracts nearly equal terms,
// `erf(acc) - erf(2)`, such an error is small relative to the terms but not to their difference,
// and a square after it doubles it. So each element is allowed, on top of the output's
// tolerance (tolerance_for), twice how far it moves when every computed value of the graph
// before the passes is perturbed by 2^-23 (ReferenceOptions::perturb): an estimate of its
// condition, as the GPU check uses (runtime::expected_outputs). A pass that changes a value by
// more than that is still a mismatch.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "evtc/gemm.hpp"
#include "evtc/graph.hpp"
#include "evtc/kernel_config.hpp"
#include "evtc/reference.hpp"

namespace evtc::testing {

struct PassCheck {
  std::string output;
  Comparison comparison;
};

// Every output of `before` (the parsed graph) against the same output of `after` (it after the
// pass pipeline), on `inputs`.
std::vector<PassCheck> check_pipeline(const Graph& before, const Graph& after, const ReferenceInputs& inputs);

// The sources a graph (after the passes) compiles to, generated without compiling them: the fused
// kernel's with `config` where legality allows, and the unfused epilogue's; whatever the emitters
// throw is thrown. Returns whether the graph is fusable for `gemm`.
bool emit_sources(const Graph& after, const GemmDesc& gemm, const KernelConfig& config);

// What identifies a failing case of a random run: its whole epilogue, the failing output's own
// statement, the problem size, the inputs' seed and the `evtc run` options of its dtypes.
struct CaseOrigin {
  size_t kernel = 0;          // the case's index in the run
  std::string kernel_text;    // every output's statement
  std::string expression;     // the failing output's statement
  int64_t m = 0, n = 0, k = 0;
  uint64_t seed = 0;
  std::string options;        // "--dtype f8e4m3 --layout-b c"
};

// The --json record of a failing output: its origin and the comparison's metrics (rel_l2 and its
// bound, max_abs, max_rel, the elements outside their bound, the one-line description).
nlohmann::json failing_case_record(const CaseOrigin& origin, const PassCheck& check);

}  // namespace evtc::testing
