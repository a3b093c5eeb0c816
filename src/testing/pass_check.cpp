#include "testing/pass_check.hpp"

#include <fmt/format.h>

#include <cmath>

#include "backends/cuda/fallback_emitter.hpp"
#include "backends/emit.hpp"
#include "evtc/error.hpp"
#include "evtc/passes.hpp"

namespace evtc::testing {

std::vector<PassCheck> check_pipeline(const Graph& before, const Graph& after, const ReferenceInputs& inputs) {
  const ReferenceOutputs want = evaluate_reference(before, inputs);
  const ReferenceOutputs got = evaluate_reference(after, inputs);
  ReferenceOptions perturbed;  // the condition of each element: see pass_check.hpp
  perturbed.perturb = std::ldexp(1.0, -23);
  perturbed.perturb_seed = 0x5eed;
  const ReferenceOutputs moved = evaluate_reference(before, inputs, perturbed);
  std::map<std::string, DType> dtypes;
  for (NodeId id : before.outputs()) dtypes[before.node(id).name] = before.node(id).dtype;
  std::vector<PassCheck> checks;
  for (const auto& [name, w] : want) {
    const auto it = got.find(name);
    if (it == got.end()) throw InternalError(fmt::format("the passes removed output '{}'", name));
    const std::vector<double>& m = moved.at(name);
    std::vector<double> slack(w.size());
    for (size_t i = 0; i < w.size(); ++i) slack[i] = 2 * std::fabs(m[i] - w[i]);
    checks.push_back({name, compare_outputs(it->second, w, tolerance_for(dtypes.at(name)), 1.0, slack)});
  }
  return checks;
}

nlohmann::json failing_case_record(const CaseOrigin& origin, const PassCheck& check) {
  const Comparison& c = check.comparison;
  return {{"kernel", origin.kernel},
          {"output", check.output},
          {"expression", origin.expression},
          {"kernel_text", origin.kernel_text},
          {"m", origin.m},
          {"n", origin.n},
          {"k", origin.k},
          {"seed", origin.seed},
          {"options", origin.options},
          {"rel_l2", c.rel_l2},
          {"rel_l2_bound", c.max_rel_l2},
          {"max_abs", c.max_abs},
          {"max_rel", c.max_rel},
          {"outside_bound", c.mismatches},
          {"what", c.describe()}};
}

bool emit_sources(const Graph& after, const GemmDesc& gemm, const KernelConfig& config) {
  const bool fusable = check_legality(after, gemm).fusable();
  if (fusable) (void)backend::emit_dense_kernel(after, gemm, config);
  (void)cuda::emit_fallback_kernel(after, make_signature(after));
  return fusable;
}

}  // namespace evtc::testing
