// fold_constants: evaluates what is known before the kernel runs and drops arithmetic
// identities.
//
// Guarantees afterwards:
//  - no compute or cast node has only constant operands: each such subtree is one constant,
//    evaluated in fp64 with the op table's reference function and rounded to the node's
//    dtype (as the device would round its result);
//  - no x*1, 1*x, x/1, x+0, 0+x, x-0 and no neg(neg(x)): each is x itself;
//  - no cast that changes no value (normalize_casts.h lists them): an identity can expose
//    one, as in store(cast(x, bf16) * 1, bf16);
//  - (x*c1)*c2 is x*(c1*c2) and (x+c1)+c2 is x+(c1+c2) (any operand order) where that cannot
//    change overflow or NaN (see fold_constants.cpp and docs/passes.md).
// The graph computes the same values, except that x+0 maps -0 to +0 no longer.
#pragma once
#include "evtc/graph.hpp"
#include "evtc/passes.hpp"

namespace evtc::passes {
Graph fold_constants(const Graph& g, const PipelineOptions& options);
}  // namespace evtc::passes
