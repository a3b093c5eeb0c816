// normalize_casts: puts roundings where the chosen CastMode says they belong.
//
// Guarantees afterwards, in both modes: no cast that changes no value, that is no cast to
// its operand's own dtype or to a dtype that holds every value of its operand's dtype
// (bf16 -> f32, fp8 -> f16, ...), and no cast directly before a store to the same dtype
// (the store rounds the same way).
//  eager (default): every other cast stays where it is written. A chain
//         acc -> f32 -> ... -> fp8 -> ... rounds to fp8 in the middle, as written, so the
//         fused kernel rounds where PyTorch eager materialised a lower-precision tensor.
//  fast:  no cast is left and every compute node computes in f32: values are rounded once,
//         at each store. Results are at least as accurate as eager's and may differ from
//         them in the last bits of the output type.
#pragma once
#include <optional>

#include "evtc/graph.hpp"
#include "evtc/passes.hpp"

namespace evtc::passes {
Graph normalize_casts(const Graph& g, const PipelineOptions& options);

// The rules for casts that change no value, shared with fold_constants (whose identities can
// leave such a cast behind: store(cast(x, bf16) * 1, bf16)). `built` holds n's operands.
//  - for a cast: its operand, when the cast changes no value; else nullopt;
//  - for a store: the store reading past a cast to the store's own dtype; else n unchanged.
std::optional<NodeId> value_preserving_cast_operand(const Graph& built, const Node& cast);
Node store_without_same_rounding(const Graph& built, Node store);
// Whether node `id` of `g` is what a library GEMM computes and writes itself: the accumulator,
// scaled and offset by broadcast operands only (addmm's alpha·acc + beta·bias, _scaled_mm's
// acc·sa[m]·sb[n] + bias[n]), with no [m,n] operand and no other op on the way. compile mode
// keeps its rounding to 16 bits: the library rounds it before any op a compiler fuses reads it.
bool library_gemm_result(const Graph& g, NodeId id);
}  // namespace evtc::passes
