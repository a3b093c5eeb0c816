// The backend-neutral half of every emitter: how an epilogue graph becomes a CUTLASS epilogue
// visitor tree, whichever architecture's visitor nodes spell it.
//
// Lowering (plan_dag in passes/dag_plan decides which values are shared):
//  - a graph whose values are each used once and that has one output becomes nested trees
//    (Sm90EVT / Sm80EVT);
//  - otherwise the shared values and the outputs become the ops of one topological visitor
//    (Sm90TopologicalVisitor / Sm80TopologicalVisitor), each op a nested tree of the values
//    only it uses.
// Cheap leaves (acc, C, broadcasts, aux loads) are re-read at each use rather than shared.
//
// A backend derives from VisitorLowering and spells the nodes: one visitor per graph node
// (emit_node), per output (emit_terminal_node), the pass-through ops the lowering inserts, and
// the names of its tree and topological visitor templates.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "evtc/gemm.hpp"
#include "evtc/graph.hpp"
#include "evtc/kernel_config.hpp"

namespace evtc::backend {

// The CUTLASS element type spelling of a dtype ("cutlass::bfloat16_t", ...).
std::string cutlass_type(DType t);
// A float expression of `v` in generated code (NaN and infinities through numeric_limits).
std::string float_literal(double v);

// One fused reduction: its output's pointer slot, axis, operation and output type.
struct ReductionSlot {
  size_t slot;
  ReduceAxis axis;
  ReduceOp op;
  DType dtype;
  // Row partials of two floats, a logsumexp's (m, s) pairs (evtc/device/sm90_logsumexp.cuh),
  // instead of one.
  bool pair_partials = false;
};
// The identity of a reduction's operation, as a float expression.
std::string reduction_identity(ReduceOp op);
// The reduction's device fold, evtc::device::SumOp / MaxOp / MinOp / LogAddExpOp (amax
// reduces |x| with MaxOp): the reduction table's device_fold.
std::string device_reduce_op(ReduceOp op);
// The generated library's reduction scratch (evtc/device/kernel_host.h's ReductionScratch:
// kReductionAxes, kReductions, scratch_bytes, scratch_partials), given the constants kTileM,
// kTileN and kEpilogueWarps declared before it.
std::string reduction_scratch_code(const std::vector<ReductionSlot>& reductions);
// finish_reductions(a, scratch, stream): the fixed-order final stage of every reduction.
std::string reduction_finish_code(const std::vector<ReductionSlot>& reductions);

// "cutlass::layout::RowMajor" / "cutlass::layout::ColumnMajor".
std::string layout_tag(Layout l);
// The braced argument list of an op's attributes ("{float(0.2)}"; "{}" without attributes),
// which evtc's compute nodes pass to the functor (Sm90Compute, Sm80Compute).
std::string op_arguments(const Node& n);

// A visitor: its C++ type and an expression building its Arguments.
struct Visitor {
  std::string type;
  std::string args;
};

class VisitorLowering {
 public:
  // `collective_stores_d`: the GEMM's collective epilogue stores the main output itself
  // (Hopper's D, KernelSignature::d_name), whose value leaves the tree as the root's result;
  // false when every output is a visitor node.
  VisitorLowering(const Graph& g, bool collective_stores_d);
  virtual ~VisitorLowering() = default;

  // Plans the tree and emits every visitor's declaration (declarations()); returns the root.
  Visitor lower();
  // The `using Vk = ...;` declarations the root's type refers to, in dependency order.
  const std::string& declarations() const { return decls_; }

 protected:
  // Names `definition` as the next alias V0, V1, ... (with `comment` above it).
  std::string alias(const std::string& definition, const std::string& comment);
  // Operand or output `name`'s pointer from the ABI's table, as `ctype*` (const unless not).
  std::string ptr(const std::string& name, const std::string& ctype, bool is_const = true) const;

  // --- what a backend spells ----------------------------------------------------------
  // A non-output node: a leaf (acc, C, scalar, vector, [m,n] operand) or an op.
  virtual Visitor emit_node(NodeId id) = 0;
  // An output's store ([m,n] or gated [m,n/2]), or the reduction `r` that output `s` holds.
  virtual Visitor emit_store(const Node& s) = 0;
  virtual Visitor emit_reduce(const Node& r, const Node& s) = 0;
  // |x| for an amax reduction's input; an f32 -> f32 identity (the comment says what for).
  virtual Visitor abs_op() = 0;
  virtual Visitor identity_f32(const std::string& comment) = 0;
  // "cutlass::epilogue::fusion::Sm90EVT", "cutlass::epilogue::fusion::Sm90TopologicalVisitor".
  virtual std::string tree_template() const = 0;
  virtual std::string topological_template() const = 0;
  // Whether the main output's value leaves the tree as the f32 its collective epilogue takes;
  // when not, an identity op converts it.
  virtual bool yields_f32(NodeId) const { return true; }

  const Graph& g_;
  const KernelSignature sig_;       // the ABI's tables: pointer and scalar slots
  std::map<std::string, size_t> ptr_slot_, scalar_slot_;
  std::optional<NodeId> d_value_;   // the main output's value
  std::vector<NodeId> terminals_;   // the other outputs' stores, by name

 private:
  Visitor tree(NodeId v);
  Visitor evt(const Visitor& op, const std::vector<Visitor>& kids);
  Visitor terminal_tree(NodeId store, const Visitor& input);
  Visitor emit_terminal_node(NodeId store);
  bool terminal_needs_abs(NodeId store) const;
  Visitor topological(const std::vector<bool>& materialised);

  std::string main_output_;
  std::string decls_;
  int next_alias_ = 0;
};

}  // namespace evtc::backend
