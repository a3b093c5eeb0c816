// The canonical text form of a Graph, its hash and its JSON form.
//
// The canonical form lists nodes in an order that depends only on the graph's structure
// (depth-first from the outputs, sorted by name, operands in order), numbered %0, %1, ...
// So two graphs that differ only in the order nodes were added print the same, and
// print(parse_canonical(print(g))) == print(g).
//
//   %0 = accum : f32[m,n]
//   %1 = row_vec bias : bf16[n]
//   %2 = add %0, %1 : f32[m,n]
//   %3 = silu %2 : f32[m,n]
//   %4 = store D %3 : bf16[m,n]
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "evtc/graph.hpp"

namespace evtc {

// Node ids of g in canonical order (every node, reachable from an output or not).
std::vector<NodeId> canonical_order(const Graph& g);
std::string print(const Graph& g);
// Parses the canonical form; errors are UserErrors with line:column.
Graph parse_canonical(std::string_view text);
// 64-bit XXH3 hash of print(g): stable across runs, machines and insertion orders.
uint64_t graph_hash(const Graph& g);
std::string graph_hash_hex(const Graph& g);  // 16 lowercase hex digits
// The graph in the expression language, one line per statement: every value with several uses
// as a named intermediate (`v3 = ...`), then `out NAME: dtype = ...` per output, in canonical
// order, after an `input` declaration of each integer operand. What a cache listing shows; it
// parses back to an equivalent graph.
std::string expression_text(const Graph& g);
// The graph as JSON: {"nodes":[{"id":0,"kind":"accum",...}], "outputs":[...], "hash":"..."}.
std::string to_json(const Graph& g, int indent = 2);

}  // namespace evtc
