// classify_loads: gives each full-matrix (aux) operand the cheapest load its bound view
// allows, using the strides in PipelineOptions::views (classify_view in evtc/passes.hpp has
// the table).
//
// Guarantees afterwards: every aux operand with a view is a by-pointer scalar, a row vector,
// a column vector, or an aux load with the view's layout (row- or column-major), keeping its
// name and dtype. A view that fits none of these leaves its operand as it was; legality
// (check_legality with the same views) then refuses the fusion and says why. Operands without
// a view are left as declared.
#pragma once
#include "evtc/graph.hpp"
#include "evtc/passes.hpp"

namespace evtc::passes {
Graph classify_loads(const Graph& g, const PipelineOptions& options);
}  // namespace evtc::passes
