// The fp64 reference of a grouped GEMM: the ordinary reference interpreter, once per group,
// on that group's rows of X, its weights and its row of each per-group operand; a gated
// [m,n/2] output (Shape::half) is stacked with N/2 columns.
#include <fmt/format.h>

#include <map>

#include "evtc/error.hpp"
#include "evtc/grouped.hpp"

namespace evtc {

namespace {

// Group g's values of a per-group operand of `per_group` values per group (G × per_group or
// one shared set).
std::vector<double> group_slice(const std::string& name, const std::vector<double>& all, size_t groups,
                                size_t per_group, size_t g) {
  if (all.size() == per_group) return all;
  if (all.size() != groups * per_group)
    throw UserError(fmt::format("operand '{}' has {} values: expected {} (one set for all groups) or "
                                "{} ({} groups × {})",
                                name, all.size(), per_group, groups * per_group, groups, per_group));
  return {all.begin() + static_cast<std::ptrdiff_t>(g * per_group),
          all.begin() + static_cast<std::ptrdiff_t>((g + 1) * per_group)};
}

}  // namespace

ReferenceOutputs evaluate_grouped_reference(const Graph& g, const GroupedReferenceInputs& in) {
  const size_t groups = in.rows.size();
  const size_t n = size_t(in.n), k = size_t(in.k);
  size_t total = 0;
  for (int64_t r : in.rows) {
    if (r < 0) throw UserError("grouped reference: a group has a negative row count");
    total += size_t(r);
  }
  if (in.x.size() != total * k)
    throw UserError(fmt::format("grouped reference: x has {} values, expected {} × {}", in.x.size(), total, k));
  if (in.w.size() != groups * n * k)
    throw UserError(fmt::format("grouped reference: w has {} values, expected {} × {} × {}", in.w.size(),
                                groups, n, k));
  ReferenceOutputs out;
  std::map<std::string, size_t> cols;  // of each output
  for (NodeId id : g.outputs()) {
    const Node& s = g.node(id);
    if (s.shape == Shape::half && n % 2 != 0)
      throw UserError(fmt::format("grouped reference: output '{}' is gated: N={} must be even", s.name, n));
    cols[s.name] = s.shape == Shape::half ? n / 2 : n;
    out[s.name].assign(total * cols[s.name], 0.0);
  }
  size_t row0 = 0;
  for (size_t grp = 0; grp < groups; ++grp) {
    const size_t m = size_t(in.rows[grp]);
    if (m == 0) continue;
    ReferenceInputs ri;
    ri.m = int64_t(m);
    ri.n = in.n;
    ri.k = in.k;
    ri.a.assign(in.x.begin() + static_cast<std::ptrdiff_t>(row0 * k),
                in.x.begin() + static_cast<std::ptrdiff_t>((row0 + m) * k));
    ri.b.resize(k * n);  // K×N row-major from the group's N×K
    const double* wg = in.w.data() + grp * n * k;
    for (size_t j = 0; j < n; ++j)
      for (size_t kk = 0; kk < k; ++kk) ri.b[kk * n + j] = wg[j * k + kk];
    if (!in.scale_a.empty() || !in.scale_b.empty()) {  // block-scaled fp8
      const size_t kb = size_t(fp8_scale_blocks(in.k)), nb = size_t(fp8_scale_blocks(in.n));
      if (in.scale_a.size() != total * kb || in.scale_b.size() != groups * nb * kb)
        throw UserError(fmt::format("grouped reference: scale_a has {} values and scale_b {}, expected {} "
                                    "(sum(M_g) × ceil(K/128)) and {} (G × ceil(N/128) × ceil(K/128))",
                                    in.scale_a.size(), in.scale_b.size(), total * kb, groups * nb * kb));
      ri.scale_a.assign(in.scale_a.begin() + static_cast<std::ptrdiff_t>(row0 * kb),
                        in.scale_a.begin() + static_cast<std::ptrdiff_t>((row0 + m) * kb));
      ri.scale_b.resize(kb * nb);  // K blocks × N blocks, from the group's N blocks × K blocks
      const double* sg = in.scale_b.data() + grp * nb * kb;
      for (size_t j = 0; j < nb; ++j)
        for (size_t l = 0; l < kb; ++l) ri.scale_b[l * nb + j] = sg[j * kb + l];
    }
    for (const Node& node : g.nodes()) {
      if (node.kind != NodeKind::row_vec && node.kind != NodeKind::scalar) continue;
      if (node.kind == NodeKind::scalar && node.scalar_kind == ScalarKind::constant) continue;
      auto it = in.operands.find(node.name);
      if (it == in.operands.end()) continue;  // the interpreter reports what it needs
      ri.operands[node.name] =
          group_slice(node.name, it->second, groups, node.kind == NodeKind::row_vec ? n : 1, grp);
    }
    const ReferenceOutputs part = evaluate_reference(g, ri);
    for (const auto& [name, values] : part) {
      auto& dst = out.at(name);
      const size_t c = cols.at(name);
      if (values.size() != m * c)
        throw UserError(fmt::format("grouped reference: output '{}' is not an [m,n] or [m,n/2] output", name));
      std::copy(values.begin(), values.end(), dst.begin() + static_cast<std::ptrdiff_t>(row0 * c));
    }
    row0 += m;
  }
  return out;
}

}  // namespace evtc
