// The epilogue IR: a typed DAG over the GEMM accumulator.
//
// A Graph owns its nodes; nodes are created only through Graph's checking constructors,
// which reject mismatched shapes and dtypes with a UserError naming the nodes involved.
// Node ids are indices into the graph and never change; passes build new graphs.
//
// Example (the W1 epilogue, `out D: bf16 = silu(acc + bias[n])`):
//   evtc::Graph g;
//   auto acc = g.accum();
//   auto bias = g.row_vec("bias", evtc::DType::bf16);
//   g.store("D", silu(acc + bias), evtc::DType::bf16);
#pragma once
#include <cstdint>
#include <initializer_list>
#include <span>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "evtc/ops.hpp"
#include "evtc/types.hpp"

namespace evtc {

using NodeId = uint32_t;

enum class NodeKind : uint8_t {
  accum,    // the GEMM accumulator A@B, f32 [m,n]
  index,    // an element's row index m (f32 [m]) or column index n (f32 [n]), 0-based
  scalar,   // a constant, or a runtime scalar parameter (by value or by device pointer)
  row_vec,  // a length-N operand broadcast over M
  col_vec,  // a length-M operand broadcast over N
  aux,      // a full M×N operand
  source,   // the GEMM's C matrix, M×N
  compute,  // an op from the op table
  cast,     // a rounding conversion to another dtype
  pair,     // one half of the interleaved (gate, up) column pairs of an M×N value: M×N/2
  reduce,   // a reduction of an M×N value to [m], [n] or a scalar
  store,    // an output (D, extra outputs, reduction results); has no users
};
std::string_view node_kind_name(NodeKind k);

enum class ScalarKind : uint8_t { constant, value, pointer };
enum class ReduceAxis : uint8_t { row, col, all };  // row: over N -> [m]; col: over M -> [n]
enum class ReduceOp : uint8_t { sum, max, min, amax, logsumexp };
enum class Layout : uint8_t { row_major, col_major };
// Which coordinate an index node gives: m, the row (an [m] value), or n, the column ([n]).
enum class IndexAxis : uint8_t { m, n };
std::string_view index_axis_name(IndexAxis a);  // "m", "n"
// What the index is, for messages: "row" (m) or "column" (n).
std::string_view index_axis_role(IndexAxis a);
// The shape of an index leaf: m varies over rows ([m]), n over columns ([n]).
Shape index_shape(IndexAxis a);
// m and n name the index leaves in the expression language and the canonical text form (no
// operand or output may be called so): the leaf a name stands for, nullopt for other names.
std::optional<IndexAxis> index_axis_named(std::string_view name);
// Which column of each interleaved pair a pair node takes: gate = even columns (2j),
// up = odd columns (2j+1); both give an [m,n/2] value whose column j comes from pair j.
enum class PairPart : uint8_t { gate, up };
std::string_view pair_part_name(PairPart p);      // "gate", "up"
std::string_view reduce_axis_name(ReduceAxis a);  // "row", "col", "all"
std::string_view reduce_op_name(ReduceOp o);      // "sum", "max", "min", "amax", "logsumexp"
// The expression-language name of a reduction: sum, row_max, col_amax, ... (the canonical text
// form prints it; the parser looks it up).
std::string reduction_name(ReduceAxis axis, ReduceOp op);

// The reduction table: every reduction evtc knows, in one place. The parser, the printer, the
// reference interpreter and every backend read it; adding a reduction is one row in
// src/ir/graph.cpp and, where its device fold is new, one functor in evtc/device/reduce.cuh.
struct ReduceOpInfo {
  ReduceOp op;
  std::string_view name;  // sum -> sum(x), row_sum(x), col_sum(x)
  // What the fold starts from: an empty reduction's result, and what a fused kernel's
  // partials hold for rows or columns outside the problem.
  double identity;
  bool of_abs;  // folds |x| (amax): the backends put an abs in front of the fold
  // The fp64 reference's fold step. Every step lets a NaN through, so a NaN anywhere in the
  // reduced values gives NaN (a device max that dropped NaNs would hide the bug looked for).
  double (*step)(double acc, double x);
  // The f32 fold on the device, over one value at a time and over partials in a fixed order:
  // a functor in namespace evtc::device (evtc/device/reduce.cuh).
  std::string_view device_fold;
  // The same fold as the class template that CUTLASS 3.x's reduction visitors take
  // (instantiated on float and on cutlass::Array<float, N>).
  std::string_view cutlass_fold;
  // On integer inputs the f32 fold gives the exact result's rounding (max, min, amax; not a
  // sum, whose order matters, nor logsumexp).
  bool exact_on_integers;
};
std::span<const ReduceOpInfo> reduce_op_table();
const ReduceOpInfo& reduce_op_info(ReduceOp op);

struct Node {
  NodeKind kind{};
  DType dtype = DType::f32;
  Shape shape = Shape::full;
  std::vector<NodeId> inputs;
  std::string name;                             // operand or output name
  double value = 0.0;                           // scalar constant
  ScalarKind scalar_kind = ScalarKind::constant;
  Op op{};                                      // compute
  std::array<double, kMaxOpAttrs> attrs{};      // compute: op parameters
  ReduceAxis axis{};                            // reduce
  ReduceOp reduce_op{};                         // reduce
  PairPart part{};                              // pair
  IndexAxis index_axis{};                       // index
  Layout layout = Layout::row_major;            // aux loads and full stores

  bool is_load() const;  // scalar param/constant, row_vec, col_vec, aux, source
};

class Graph;

// A handle to a node while building; arithmetic operators build compute nodes.
struct Value {
  Graph* graph = nullptr;
  NodeId id = 0;
  const Node& node() const;
};

class Graph {
 public:
  Graph() = default;

  // --- checking constructors -------------------------------------------------------
  Value accum();  // the accumulator; calling twice returns the same node
  // The row (IndexAxis::m) or column (IndexAxis::n) index of each output element as an f32
  // value: exact while it is below 2^24 (kExactF32Integer), which the runtime checks. One node
  // per axis, like the accumulator. Of a gated value's column, n is the full-width column (the
  // index before gate()/up(); a gated [m,n/2] value cannot meet an [n] value).
  Value index(IndexAxis axis);
  Value constant(double v, DType dtype = DType::f32);
  Value param(std::string_view name, DType dtype = DType::f32,
              ScalarKind kind = ScalarKind::value);
  Value row_vec(std::string_view name, DType dtype);
  Value col_vec(std::string_view name, DType dtype);
  Value aux(std::string_view name, DType dtype, Layout layout = Layout::row_major);
  Value source(DType dtype);
  // Computes op over the inputs in `dtype` (inputs must widen losslessly to it).
  Value compute(Op op, std::span<const Value> inputs, std::span<const double> attrs = {},
                DType dtype = DType::f32);
  Value compute(Op op, std::initializer_list<Value> inputs,
                std::initializer_list<double> attrs = {}, DType dtype = DType::f32);
  Value cast(Value v, DType dtype);
  Value reduce(ReduceAxis axis, ReduceOp op, Value v);
  // The gate (even) or up (odd) columns of an [m,n] value: an [m,n/2] value. Gated
  // activations (SwiGLU and its family) combine the two halves elementwise and store an
  // M×N/2 output; N must be even at run time.
  Value pair(PairPart part, Value v);
  // Writes `v` to the output `name`, rounding to `dtype`. Returns the store node.
  Value store(std::string_view name, Value v, DType dtype,
              Layout layout = Layout::row_major);

  // Raw insertion used by the canonical parser and by passes that rebuild graphs: runs the
  // same checks as the typed constructors above, and deduplicates loads by name.
  NodeId add(Node n);

  // --- queries ---------------------------------------------------------------------
  const Node& node(NodeId id) const { return nodes_.at(id); }
  size_t size() const { return nodes_.size(); }
  std::span<const Node> nodes() const { return nodes_; }
  // Store nodes, in creation order.
  const std::vector<NodeId>& outputs() const { return outputs_; }
  // Users of every node (computed on demand).
  std::vector<std::vector<NodeId>> users() const;
  // A short description for error messages: `%3 (row_vec bias)`.
  std::string describe(NodeId id) const;
  Value value(NodeId id) { return Value{this, id}; }

 private:
  NodeId push(Node n);
  std::vector<Node> nodes_;
  std::vector<NodeId> outputs_;
  // Indexes that keep add() constant-time per node: the accumulator and source C nodes, and the
  // node of every named load and output by name.
  std::optional<NodeId> accum_, source_, index_m_, index_n_;
  std::unordered_map<std::string, NodeId> named_;
};

// Builder operators and functions (each checks its operands).
Value operator+(Value a, Value b);
Value operator-(Value a, Value b);
Value operator*(Value a, Value b);
Value operator/(Value a, Value b);
Value operator-(Value a);
Value operator+(Value a, double b);
Value operator-(Value a, double b);
Value operator*(Value a, double b);
Value operator/(Value a, double b);
Value operator+(double a, Value b);
Value operator-(double a, Value b);
Value operator*(double a, Value b);
Value operator/(double a, Value b);
Value apply(Op op, std::initializer_list<Value> args, std::initializer_list<double> attrs = {});
Value relu(Value x);
Value sigmoid(Value x);
Value silu(Value x);
Value gelu(Value x);
Value gelu_tanh(Value x);
Value exp(Value x);
Value log(Value x);
Value tanh(Value x);
Value max(Value a, Value b);
Value min(Value a, Value b);
Value clamp(Value x, double lo, double hi);
Value cast(Value x, DType dtype);
Value gate(Value x);  // x's even columns
Value up(Value x);    // x's odd columns

}  // namespace evtc
