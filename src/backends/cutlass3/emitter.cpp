#include "backends/cutlass3/emitter.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "evtc/arch.hpp"
#include "evtc/error.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/passes.hpp"
#include "backends/cuda/fallback_emitter.hpp"
#include "backends/host_code.hpp"
#include "backends/visitor_lowering.hpp"
#include "backends/cutlass3/target.hpp"

namespace evtc::cutlass3 {

namespace {

constexpr const char* kRound = "cutlass::FloatRoundStyle::round_to_nearest";

using backend::cutlass_type;
using backend::float_literal;

using backend::layout_tag;

// Stride of an M×N operand in CUTLASS's (M, N, L) convention, and its value from the args.
std::string mn_stride_value(Layout l) {
  return l == Layout::row_major
             ? "cute::make_stride(int64_t(a.n), cute::Int<1>{}, int64_t(0))"
             : "cute::make_stride(cute::Int<1>{}, int64_t(a.m), int64_t(0))";
}

using backend::Visitor;

class Emitter : public backend::VisitorLowering {
 public:
  Emitter(const Graph& g, const GemmDesc& gemm, const KernelConfig& cfg,
          EpilogueTarget target = EpilogueTarget::dense)
      : VisitorLowering(g, true),
        gemm_(gemm),
        cfg_(cfg),
        arch_(target_for(backend_features(gemm.sm, gemm.a_dtype).backend)),
        grouped_(target == EpilogueTarget::grouped) {}

  backend::EmittedKernel emit() {
    const Visitor root = lower();
    return {assemble(root), parts_graph_ ? parts_sig_ : sig_};
  }
  // K in parts (KernelConfig::k_parts): this emitter's graph is the product alone (an f32 D,
  // the partial sums, row-major in the caller's M×N), and `epilogue` the caller's graph, which
  // the second kernel runs on their sum with `epilogue`'s signature.
  void set_parts_epilogue(const Graph& epilogue) {
    parts_graph_ = &epilogue;
    parts_sig_ = make_signature(epilogue);
  }
  // The visitor tree alone, for an assembler of another GEMM kind (the grouped one).
  EpilogueVisitors emit_visitors() {
    const Visitor root = lower();
    return {declarations(), root.type, root.args, sig_};
  }

 private:
  std::string elem_d_desc() const {
    return cutlass_type(sig_.d_name.empty() ? aux_element_ : sig_.d_dtype);
  }

  // --- one emitter per node kind -------------------------------------------------------
  Visitor emit_accum(const Node&) {
    return {alias("cutlass::epilogue::fusion::Sm90AccFetch", "acc"), "{}"};
  }
  // m or n: evtc's index leaf (evtc/device/sm90_index.cuh), the element's coordinate as f32.
  Visitor emit_index(const Node& n) {
    index_leaves_ = true;
    const std::string type = alias(
        fmt::format("evtc::device::Sm90Index<{}>", n.index_axis == IndexAxis::m ? 0 : 1),
        fmt::format("{} index {}", index_axis_role(n.index_axis), index_axis_name(n.index_axis)));
    return {type, fmt::format("typename {}::Arguments{{}}", type)};
  }
  Visitor emit_source(const Node& n) {
    return {alias(fmt::format("cutlass::epilogue::fusion::Sm90SrcFetch<{}>", cutlass_type(n.dtype)),
                  "C"),
            "{}"};
  }
  Visitor emit_scalar(const Node& n) {
    const std::string e = n.scalar_kind == ScalarKind::constant ? "float" : cutlass_type(n.dtype);
    if (grouped_ && n.scalar_kind == ScalarKind::pointer) return grouped_scalar(n, e);
    const std::string type =
        alias(fmt::format("cutlass::epilogue::fusion::Sm90ScalarBroadcast<{}>", e),
              n.scalar_kind == ScalarKind::constant ? fmt::format("constant {}", n.value)
                                                    : "scalar " + n.name);
    std::string args;
    if (n.scalar_kind == ScalarKind::constant)
      args = fmt::format("{{{{{}}}}}", float_literal(n.value));
    else if (n.scalar_kind == ScalarKind::value)
      args = fmt::format("{{{{{}(float(a.scalars[{}]))}}}}", e, scalar_slot_.at(n.name));
    else
      args = fmt::format("{{{{}}, {{{}}}}}", ptr(n.name, e));
    return {type, fmt::format("typename {}::Arguments{}", type, args)};
  }
  Visitor emit_row_vec(const Node& n) {
    const std::string e = cutlass_type(n.dtype);
    if (grouped_) return grouped_row_vec(n, e);
    const std::string type = alias(
        fmt::format("cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, {}, float, "
                    "cute::Stride<cute::_0, cute::_1, cute::_0>>",
                    e),
        "row vector " + n.name + "[n]");
    return {type, fmt::format("typename {}::Arguments{{{}, {}(0), {{}}}}", type, ptr(n.name, e), e)};
  }
  // Grouped GEMMs: the tile's L coordinate is its group. A row vector or a scalar by
  // pointer steps `a.group_strides[slot]` elements per group (0: one for all groups).
  Visitor grouped_row_vec(const Node& n, const std::string& e) {
    const std::string type = alias(
        fmt::format("cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, {}, float, "
                    "cute::Stride<cute::_0, cute::_1, int64_t>>",
                    e),
        "per-group row vector " + n.name + "[n]");
    return {type, fmt::format("typename {}::Arguments{{{}, {}(0), {{cute::_0{{}}, cute::_1{{}}, "
                              "a.group_strides[{}]}}}}",
                              type, ptr(n.name, e), e, ptr_slot_.at(n.name))};
  }
  Visitor grouped_scalar(const Node& n, const std::string& e) {
    const std::string type = alias(
        fmt::format("cutlass::epilogue::fusion::Sm90ScalarBroadcast<{}, cute::Stride<cute::_0, "
                    "cute::_0, int64_t>>",
                    e),
        "per-group scalar " + n.name);
    return {type, fmt::format("typename {}::Arguments{{{{}}, {{{}}}, {{{{cute::_0{{}}, cute::_0{{}}, "
                              "a.group_strides[{}]}}}}}}",
                              type, ptr(n.name, e), ptr_slot_.at(n.name))};
  }
  Visitor emit_col_vec(const Node& n) {
    const std::string e = cutlass_type(n.dtype);
    const std::string type = alias(
        fmt::format("cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, {}, float, "
                    "cute::Stride<cute::_1, cute::_0, cute::_0>>",
                    e),
        "column vector " + n.name + "[m]");
    return {type, fmt::format("typename {}::Arguments{{{}, {}(0), {{}}}}", type, ptr(n.name, e), e)};
  }
  Visitor emit_aux(const Node& n) {
    const std::string e = cutlass_type(n.dtype);
    const std::string desc = alias(
        fmt::format("cutlass::epilogue::collective::detail::{}AuxLoadDescriptor<EpilogueDescriptor, "
                    "{}, {}>",
                    arch_.aux_descriptor_prefix(), layout_tag(n.layout), e),
        "descriptor of " + n.name);
    const std::string type = alias(
        fmt::format("cutlass::epilogue::fusion::Sm90AuxLoad<{0}::Stages, typename {0}::EpilogueTile, "
                    "{1}, typename {0}::Stride, typename {0}::SmemLayoutAtom, typename {0}::CopyOpS2R>",
                    desc, e),
        "aux load " + n.name + "[m,n]");
    return {type, fmt::format("typename {}::Arguments{{{}, {}(0), {}}}", type, ptr(n.name, e), e,
                              mn_stride_value(n.layout))};
  }
  Visitor emit_compute(const Node& n) {
    const OpInfo& info = op_info(n.op);
    const std::string type = alias(
        fmt::format("cutlass::epilogue::fusion::Sm90Compute<evtc::device::{}, {}, float, {}>",
                    info.cuda_functor, cutlass_type(n.dtype), kRound),
        std::string(info.name));
    return {type, fmt::format("typename {}::Arguments{}", type, backend::op_arguments(n))};
  }
  // gate(x) / up(x): both elements of each (gate, up) pair of x's fragment become the
  // pair's gate (up) value (evtc/device/sm90_half_store.cuh); a half store writes one.
  Visitor emit_pair(const Node& n) {
    const std::string type = alias(
        fmt::format("cutlass::epilogue::fusion::Sm90Compute<evtc::device::{}, {}, float, {}>",
                    n.part == PairPart::gate ? "PairGate" : "PairUp", cutlass_type(n.dtype), kRound),
        std::string(pair_part_name(n.part)));
    return {type, fmt::format("typename {}::Arguments{{}}", type)};
  }
  Visitor emit_cast(const Node& n) {
    // The node's output type rounds; the identity functor computes nothing.
    const std::string type = alias(
        fmt::format("cutlass::epilogue::fusion::Sm90Compute<evtc::device::Identity, {}, float, {}>",
                    cutlass_type(n.dtype), kRound),
        fmt::format("cast to {}", dtype_name(n.dtype)));
    return {type, fmt::format("typename {}::Arguments{{}}", type)};
  }
  // An extra [m,n] output (the main output D is written by the collective epilogue).
  Visitor emit_store(const Node& s) override {
    const std::string e = cutlass_type(s.dtype);
    if (s.shape == Shape::half) {  // a gated [m,n/2] output, packed row-major
      const std::string type = alias(
          fmt::format("evtc::device::Sm90HalfStore<{}, {}>", e, kRound),
          "gated output " + s.name + "[m,n/2]");
      // Grouped: each group's rows through the pointer table built from the offsets
      // (t.ptr_y, indexed by the tile's L coordinate), a.ldy elements apart.
      if (grouped_)
        return {type, fmt::format("typename {}::Arguments{{{}, a.ldy, t.ptr_y}}", type,
                                  ptr(s.name, e, false))};
      return {type, fmt::format("typename {}::Arguments{{{}, a.n / 2}}", type, ptr(s.name, e, false))};
    }
    const std::string desc = alias(
        fmt::format("cutlass::epilogue::collective::detail::{}AuxStoreDescriptor<EpilogueDescriptor, "
                    "{}, {}>",
                    arch_.aux_descriptor_prefix(), layout_tag(s.layout), e),
        "descriptor of " + s.name);
    const std::string type = alias(
        fmt::format("cutlass::epilogue::fusion::Sm90AuxStore<{0}::Stages, typename {0}::EpilogueTile, "
                    "{1}, {2}, typename {0}::Stride, typename {0}::SmemLayoutAtom, typename "
                    "{0}::CopyOpR2S>",
                    desc, e, kRound),
        "output " + s.name + "[m,n]");
    return {type, fmt::format("typename {}::Arguments{{{}, {}}}", type, ptr(s.name, e, false),
                              mn_stride_value(s.layout))};
  }
  // A reduction output. Every reduction is deterministic and free of atomics: the fused
  // kernel writes partial results to evtc's scratch (each slot by one warp or one CTA) and a
  // small kernel after it folds them in a fixed order (finish_reductions):
  //  - whole-matrix: evtc's Sm90ScalarPartials, one partial per warp and tile;
  //  - row (over N) / column (over M): CUTLASS's Sm90ColReduction / Sm90RowReduction without
  //    their final stage (which serialises on a tile counter), one partial per CTA tile.
  Visitor emit_reduce(const Node& r, const Node& s) override {
    // amax(x) = max(|x|): the |x| is its own compute node, emitted by the caller.
    const std::string reg(reduce_op_info(r.reduce_op).cutlass_fold);
    const std::string identity = backend::reduction_identity(r.reduce_op);
    // A row logsumexp: evtc's node folding (m, s) pairs, one exp per element and no log
    // (evtc/device/sm90_logsumexp.cuh).
    const bool pairs = r.axis == ReduceAxis::row && r.reduce_op == ReduceOp::logsumexp;
    const std::string name = fmt::format("{}_{} -> output {}", reduce_axis_name(r.axis),
                                         reduce_op_name(r.reduce_op), s.name);
    const size_t index = reductions_.size();
    reductions_.push_back({ptr_slot_.at(s.name), r.axis, r.reduce_op, s.dtype, pairs});
    std::string type;
    if (pairs) {
      lse_pairs_ = true;
      type = alias("evtc::device::Sm90RowLsePartials<TileShape>", name + " (per-tile (m, s) pairs)");
      return {type, fmt::format("typename {}::Arguments{{scratch_partials(a, scratch, {})}}", type, index)};
    }
    switch (r.axis) {
      case ReduceAxis::all:
        type = alias(fmt::format("evtc::device::Sm90ScalarPartials<{}, TileShape>",
                                 backend::device_reduce_op(r.reduce_op)),
                     name + " (per-warp partials)");
        return {type, fmt::format("typename {}::Arguments{{scratch_partials(a, scratch, {}), {}}}",
                                  type, index, identity)};
      case ReduceAxis::row:  // over N -> one value per row: CUTLASS's column reduction
        type = alias(fmt::format("cutlass::epilogue::fusion::Sm90ColReduction<{0}, {0}, {0}, 0, "
                                 "TileShape, float, float, {1}, cute::Stride<cute::_1, cute::_0, "
                                 "cute::_0>, 4, true, false>",
                                 reg, kRound),
                     name + " (per-tile partials)");
        break;
      case ReduceAxis::col:  // over M -> one value per column: CUTLASS's row reduction
        type = alias(fmt::format("cutlass::epilogue::fusion::Sm90RowReduction<{0}, {0}, {0}, 0, "
                                 "TileShape, float, float, {1}, cute::Stride<cute::_0, cute::_1, "
                                 "cute::_0>, 4, true, false>",
                                 reg, kRound),
                     name + " (per-tile partials)");
        break;
    }
    return {type, fmt::format("typename {}::Arguments{{scratch_partials(a, scratch, {}), {}, {{}}}}",
                              type, index, identity)};
  }
  Visitor emit_node(NodeId id) override {
    const Node& n = g_.node(id);
    switch (n.kind) {
      case NodeKind::accum: return emit_accum(n);
      case NodeKind::index: return emit_index(n);
      case NodeKind::source: return emit_source(n);
      case NodeKind::scalar: return emit_scalar(n);
      case NodeKind::row_vec: return emit_row_vec(n);
      case NodeKind::col_vec: return emit_col_vec(n);
      case NodeKind::aux: return emit_aux(n);
      case NodeKind::compute: return emit_compute(n);
      case NodeKind::cast: return emit_cast(n);
      case NodeKind::pair: return emit_pair(n);
      case NodeKind::reduce:
      case NodeKind::store: break;
    }
    internal_fail(__FILE__, __LINE__, "emit_node on a terminal");
  }

  // --- what the shared lowering asks (backends/visitor_lowering.hpp) -------------------

  Visitor abs_op() override {
    const std::string type = alias(
        fmt::format("cutlass::epilogue::fusion::Sm90Compute<evtc::device::Abs, float, float, {}>", kRound),
        "abs (for amax)");
    return {type, fmt::format("typename {}::Arguments{{}}", type)};
  }
  // The collective epilogue takes the root's result as f32 fragments (its compute type) and
  // converts them to D itself, so the main output's value must leave the tree as f32. Most
  // visitors compute in f32; a cast and an aux load give their own element type.
  bool yields_f32(NodeId v) const override {
    const Node& n = g_.node(v);
    return !((n.kind == NodeKind::cast || n.kind == NodeKind::aux) && n.dtype != DType::f32);
  }
  // An f32 -> f32 identity op (the comment says what it is for).
  Visitor identity_f32(const std::string& comment) override {
    const std::string type = alias(
        fmt::format("cutlass::epilogue::fusion::Sm90Compute<evtc::device::Identity, float, float, {}>",
                    kRound),
        comment);
    return {type, fmt::format("typename {}::Arguments{{}}", type)};
  }
  std::string tree_template() const override { return "cutlass::epilogue::fusion::Sm90EVT"; }
  std::string topological_template() const override { return "cutlass::epilogue::fusion::Sm90TopologicalVisitor"; }

  // --- the translation unit ------------------------------------------------------------
  std::string assemble(const Visitor& root);
  std::string parts_epilogue_launch() const;

  GemmDesc gemm_;
  KernelConfig cfg_;
  const Target& arch_;  // what the architecture's CUTLASS 3.x kernels are built with
  std::vector<backend::ReductionSlot> reductions_;
  bool lse_pairs_ = false;  // a row logsumexp: include evtc/device/sm90_logsumexp.cuh
  bool index_leaves_ = false;  // m or n: include evtc/device/sm90_index.cuh
  DType aux_element_ = DType::bf16;
  bool grouped_ = false;
  const Graph* parts_graph_ = nullptr;
  KernelSignature parts_sig_;
};

std::string Emitter::assemble(const Visitor& root) {
  const std::string elem_a = cutlass_type(gemm_.a_dtype);
  const std::string elem_b = cutlass_type(gemm_.b_dtype);
  const std::string elem_c = sig_.reads_c ? cutlass_type(sig_.c_dtype) : "void";
  const std::string desc_d = elem_d_desc();
  // Without D: void, or a D of the descriptor's type that stores into a sink where the
  // architecture's collective epilogue has no void-D form (Target::d_sink_header).
  const bool d_sink = sig_.d_name.empty() && !arch_.d_sink_header().empty();
  const std::string elem_d = d_sink ? desc_d : sig_.d_name.empty() ? "void" : cutlass_type(sig_.d_dtype);
  // Collective epilogues that assign the tree's result to D's fragment without a conversion
  // (Target::root_converts_to_d): where there is a D (or its sink), the root converts to ElementD.
  const bool converting_root = arch_.root_converts_to_d() && elem_d != "void";
  const std::string desc_c = sig_.reads_c ? elem_c : desc_d;
  const std::string align_d = fmt::format("128 / cutlass::sizeof_bits<{}>::value", desc_d);
  const std::string align_c = fmt::format("128 / cutlass::sizeof_bits<{}>::value", desc_c);
  // C and D are row-major, or column-major in a transposed problem (evtc::swap_ab): D's
  // layout is its store's; C's the source node's (without C, D's).
  Layout layout_d = Layout::row_major, layout_c = Layout::row_major;
  for (const Node& n : g_.nodes())
    if (n.kind == NodeKind::store && n.name == sig_.d_name) layout_d = n.layout;
  layout_c = layout_d;
  for (const Node& n : g_.nodes())
    if (n.kind == NodeKind::source) layout_c = n.layout;
  std::string s = backend::source_banner(fmt::format("one CUTLASS Sm{} GEMM with a fused epilogue", gemm_.sm), g_,
                                         "kernel config " + cfg_.name());
  s += backend::host_part_device_pass_begin(!reductions_.empty());
  if (cfg_.precise_math) s += "#define EVTC_PRECISE_MATH 1\n";
  // K in parts: the GEMM lets its dependent (the plain epilogue, launched programmatically after
  // it) start as its last tiles finish.
  if (parts_graph_) s += "#define CUTLASS_ENABLE_GDC_FOR_SM90 1\n";
  // The architecture's CUTLASS headers.
  s += arch_.cutlass_includes(gemm_, cfg_);
  const bool blockwise = gemm_.fp8_blockwise;
  const bool overlapped = overlapped_fp8_promotion(cfg_, gemm_);
  s += R"(
#include <cstdio>
#include <cstring>
#include <mutex>

#include "evtc/device/abi.h"
#include "evtc/device/host_support.h"
#include "evtc/device/kernel_host.h"
#include "evtc/device/ops.cuh"
#include "evtc/device/reduce.cuh"
#include "evtc/device/sm90_half_store.cuh"
#include "evtc/device/sm90_scalar_partials.cuh"
)";
  if (lse_pairs_) s += "#include \"evtc/device/sm90_logsumexp.cuh\"\n";
  if (overlapped) s += "#include \"evtc/device/sm90_fp8_mainloop.cuh\"\n";
  if (index_leaves_) s += "#include \"evtc/device/sm90_index.cuh\"\n";
  if (d_sink) s += fmt::format("#include \"{}\"\n", arch_.d_sink_header());
  s += "\n";
  s += backend::parts_prelude();
  const bool parts = parts_graph_ != nullptr;
  if (parts) {
    s += fmt::format("\n// K in {} parts: the GEMM writes their fp32 products to the workspace, and the plain epilogue\n"
                     "// below adds them in order and evaluates the caller's graph:\n{}\n",
                     cfg_.k_parts, backend::commented_graph(*parts_graph_));
    s += cuda::epilogue_device_code(*parts_graph_, parts_sig_, cfg_.k_parts);
  }
  s += "\nnamespace {\n\n";
  s += fmt::format("using ElementA = {};\nusing LayoutA = {};\n", elem_a, layout_tag(gemm_.a_layout));
  s += fmt::format("using ElementB = {};\nusing LayoutB = {};\n", elem_b, layout_tag(gemm_.b_layout));
  s += fmt::format("using ElementC = {};{}\n", elem_c,
                   sig_.reads_c ? "" : "  // void: the epilogue does not read C");
  s += fmt::format("using ElementD = {};{}\n", elem_d,
                   d_sink                ? "  // no main output: D is a sink (evtc/device/sm100_epilogue.cuh)"
                   : sig_.d_name.empty() ? "  // void: no main output"
                                         : "");
  // A two-SM MMA (Target::two_sm): the builders take the MMA's tile, and each CTA of the pair,
  // whose epilogue the visitor nodes run, holds half its rows (TileShape).
  const bool two_sm = arch_.two_sm(cfg_);
  s += fmt::format("using TileShape = cute::Shape<cute::_{}, cute::_{}, cute::_{}>;{}\n",
                   two_sm ? cfg_.tile_m / 2 : cfg_.tile_m, cfg_.tile_n, cfg_.tile_k,
                   two_sm ? "  // one CTA's half of the two-SM MMA tile" : "");
  if (arch_.separate_mma_tile())
    s += fmt::format("using MmaTileShape = cute::Shape<cute::_{}, cute::_{}, cute::_{}>;\n", cfg_.tile_m,
                     cfg_.tile_n, cfg_.tile_k);
  const char* mma_tile = arch_.separate_mma_tile() ? "MmaTileShape" : "TileShape";
  s += fmt::format("using ClusterShape = cute::Shape<cute::_{}, cute::_{}, cute::_1>;\n",
                   cfg_.cluster_m, cfg_.cluster_n);
  // fp8: the default main loop promotes the tensor cores' partial sums into fp32 registers
  // every few K blocks; the FP8FastAccum kernels accumulate in the tensor cores throughout.
  // Block-scaled fp8 (GemmDesc::fp8_blockwise): the FP8Blockwise kernels multiply each 128-wide
  // K block's partial product by A's row scale and B's 128×128 block scale as they add it into
  // the fp32 accumulators.
  const bool fast_accum =
      !blockwise && cfg_.fp8_fast_accum && (is_fp8(gemm_.a_dtype) || is_fp8(gemm_.b_dtype));
  s += fmt::format("using KernelSchedule = cutlass::gemm::{};\n",
                   arch_.kernel_schedule(cfg_, two_sm, blockwise, fast_accum));
  if (blockwise)
    s += fmt::format(
        "// Scales: A one per row and {0} of K, M adjacent; B one per {0}×{0} block, N blocks adjacent.\n"
        "using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, {0}, {0}>;\n"
        "using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());\n"
        "using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());\n",
        kFp8ScaleBlock);
  s += fmt::format("using EpilogueSchedule = cutlass::epilogue::{};\n", arch_.epilogue_schedule(cfg_, two_sm));
  s += "using EpilogueTile = cutlass::epilogue::collective::EpilogueTileAuto;\n";
  // The epilogue tile and shared-memory layouts of [m,n] operands and outputs, as the collective
  // epilogue's builder works them out.
  s += arch_.epilogue_descriptor(desc_c, desc_d);
  s += declarations();
  if (converting_root) {
    s += fmt::format(
        "\n// The tree's result converted to D's type (Blackwell's epilogues store it as it is).\n"
        "using Callbacks = cutlass::epilogue::fusion::Sm90EVT<cutlass::epilogue::fusion::Sm90Compute<\n"
        "    cutlass::epilogue::thread::Identity, ElementD, float, {}>, {}>;\n",
        kRound, root.type);
  } else if (sig_.d_name.empty()) {
    // Without D, CUTLASS sizes its (unused) D staging from the callbacks' ElementAux.
    s += fmt::format(
        "\nstruct Callbacks : {} {{\n  using {}::{};\n  using ElementAux = {};\n}};\n", root.type,
        root.type, root.type.substr(root.type.rfind(':') + 1), desc_d);
  } else {
    s += fmt::format("\nusing Callbacks = {};\n", root.type);
  }
  s += fmt::format(R"(
using ArchTag = cutlass::arch::Sm{};
using {}CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    ArchTag, cutlass::arch::OpClassTensorOp, {}, ClusterShape, EpilogueTile,
    float, float, ElementC, {}, {},
    ElementD, {}, {}, EpilogueSchedule, Callbacks>::CollectiveOp;
{}
using {}CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    ArchTag, cutlass::arch::OpClassTensorOp,
    ElementA, {}, 128 / cutlass::sizeof_bits<ElementA>::value,
    ElementB, {}, 128 / cutlass::sizeof_bits<ElementB>::value, float,
    {}, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    KernelSchedule>::CollectiveOp;{}

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
    cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, {}>;
using GemmArguments = typename GemmKernel::Arguments;
using GemmParams = typename GemmKernel::Params;

}}  // namespace

#if EVTC_PART != 2
// The kernel: CUTLASS's device_kernel<GemmKernel> under a name the host part can look up.
extern "C" __global__ void __launch_bounds__(GemmKernel::MaxThreadsPerBlock, GemmKernel::MinBlocksPerMultiprocessor)
evtc_gemm_kernel(CUTLASS_GRID_CONSTANT const GemmParams params) {{
  extern __shared__ char smem[];
  GemmKernel op;
  op(params, smem);
}}
#endif

#if EVTC_PART != 1
)",
                   gemm_.sm, d_sink ? "Built" : "", mma_tile, layout_tag(layout_c), align_c,
                   layout_tag(layout_d), align_d,
                   d_sink ? fmt::format("using CollectiveEpilogue = {}<BuiltCollectiveEpilogue>;\n",
                                        arch_.d_sink_epilogue())
                          : "",
                   overlapped ? "Built" : "", blockwise ? "cute::tuple<LayoutA, LayoutSFA>" : "LayoutA",
                   blockwise ? "cute::tuple<LayoutB, LayoutSFB>" : "LayoutB", mma_tile,
                   overlapped ? "\n// fp8: each promotion overlaps the next K tile's WGMMAs (evtc/device/sm90_fp8_mainloop.cuh).\n"
                                "using CollectiveMainloop = evtc::device::Sm90Fp8OverlappedPromotion<BuiltCollectiveMainloop>;"
                              : "",
                   cfg_.scheduler == TileSchedulerKind::stream_k ? "cutlass::gemm::StreamKScheduler"
                                                                 : "void");
  s += backend::kernel_image_declaration();
  s += "\nnamespace {\n\n";
  // Scratch for the reductions' partial results, after CUTLASS's workspace (see emit_reduce),
  // one partial per epilogue warp (Target::epilogue_warps).
  s += R"(constexpr int kTileM = cute::size<0>(TileShape{});
constexpr int kTileN = cute::size<1>(TileShape{});
)";
  s += fmt::format("constexpr int kEpilogueWarps = {};\n\n", arch_.epilogue_warps());
  s += backend::reduction_scratch_code(reductions_);
  s += fmt::format(R"(
typename Callbacks::Arguments fusion_arguments(const evtc_gemm_args& a, char* scratch) {{
  (void)scratch;
  return {};
}}
)",
                   converting_root
                       ? fmt::format("typename Callbacks::Arguments{{{}, {{}}}}", root.args)
                       : root.args);
  s += backend::reduction_finish_code(reductions_);
  s += fmt::format(R"(
constexpr int kPointerSlots = {};
constexpr int kScalarSlots = {};
)",
                   sig_.pointers.size(), sig_.scalars.size());
  s += R"(
using evtc::device::set_reason;
using evtc::device::sm_count_of_current_device;

GemmArguments gemm_arguments(const evtc_gemm_args& a, char* scratch) {
  using StrideA = typename GemmKernel::StrideA;
  using StrideB = typename GemmKernel::StrideB;
  using StrideC = typename GemmKernel::StrideC;
  using StrideD = typename GemmKernel::StrideD;
  StrideA stride_a{};
  StrideB stride_b{};
  StrideC stride_c{};
  StrideD stride_d{};
)";
  // A is M×K: row-major means stride (lda, 1); B is K×N, CUTLASS indexes it as N×K.
  s += gemm_.a_layout == Layout::row_major ? "  cute::get<0>(stride_a) = a.lda;\n"
                                           : "  cute::get<1>(stride_a) = a.lda;\n";
  s += gemm_.b_layout == Layout::col_major ? "  cute::get<0>(stride_b) = a.ldb;\n"
                                           : "  cute::get<1>(stride_b) = a.ldb;\n";
  // C and D: (ld, 1) row-major, (1, ld) column-major.
  s += layout_c == Layout::row_major ? "  cute::get<0>(stride_c) = a.ldc;\n" : "  cute::get<1>(stride_c) = a.ldc;\n";
  if (!parts) {
    s += layout_d == Layout::row_major ? "  cute::get<0>(stride_d) = a.ldd;\n" : "  cute::get<1>(stride_d) = a.ldd;\n";
  } else {
    // K in parts: part l is batch entry l, A's and B's K slices [l·K/parts, (l+1)·K/parts);
    // D is the parts' fp32 products in the scratch, m×n apart, each row-major in the caller's
    // M×N (column-major in a transposed kernel's).
    s += fmt::format("  const int64_t part_k = a.k / {};\n", cfg_.k_parts);
    s += gemm_.a_layout == Layout::row_major ? "  cute::get<2>(stride_a) = part_k;\n"
                                             : "  cute::get<2>(stride_a) = part_k * a.lda;\n";
    s += gemm_.b_layout == Layout::col_major ? "  cute::get<2>(stride_b) = part_k;\n"
                                             : "  cute::get<2>(stride_b) = part_k * a.ldb;\n";
    s += layout_d == Layout::row_major ? "  cute::get<0>(stride_d) = a.n;\n" : "  cute::get<1>(stride_d) = a.m;\n";
    s += "  cute::get<2>(stride_d) = a.m * a.n;\n";
  }
  s += R"(
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = a.sm_count > 0 ? a.sm_count : sm_count_of_current_device();
)";
  if (blockwise)
    s += fmt::format(R"(  // A's scales: M adjacent, K blocks a.ld_scale_a apart; B's: contiguous N blocks per K block.
  const int scale_k_blocks = int((a.k + {0} - 1) / {0});
  const LayoutSFA layout_sfa = cute::make_layout(
      cute::make_shape(cute::make_shape(cute::_1{{}}, int(a.m)), cute::make_shape(cute::Int<{0}>{{}}, scale_k_blocks), 1),
      cute::make_stride(cute::make_stride(cute::_0{{}}, cute::_1{{}}),
                        cute::make_stride(cute::_0{{}}, int(a.ld_scale_a)), int(a.ld_scale_a) * scale_k_blocks));
  const LayoutSFB layout_sfb = ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(int(a.m), int(a.n), int(a.k), 1));
)",
                     kFp8ScaleBlock);
  s += parts ? fmt::format(R"(  GemmArguments args{{
      cutlass::gemm::GemmUniversalMode::kBatched,
      {{int(a.m), int(a.n), int(part_k), {}}},
      {{static_cast<const ElementA*>(a.a), stride_a, static_cast<const ElementB*>(a.b), stride_b)",
                           cfg_.k_parts)
             : R"(  GemmArguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {int(a.m), int(a.n), int(a.k), 1},
      {static_cast<const ElementA*>(a.a), stride_a, static_cast<const ElementB*>(a.b), stride_b)";
  s += blockwise ? ",\n       static_cast<const float*>(a.scale_a), layout_sfa, static_cast<const float*>(a.scale_b), layout_sfb},"
                 : "},";
  s += fmt::format(R"(
      {{fusion_arguments(a, scratch), static_cast<const typename GemmKernel::ElementC*>(a.c), stride_c,
       {}, stride_d}},
      hw}};)",
                   parts ? "reinterpret_cast<typename GemmKernel::ElementD*>(scratch)"
                         : "static_cast<typename GemmKernel::ElementD*>(a.d)");
  s += R"(
  using RasterOptions = typename GemmKernel::TileScheduler::RasterOrderOptions;
  args.scheduler.max_swizzle_size = a.swizzle > 0 ? a.swizzle : 1;
  args.scheduler.raster_order = a.raster == 1   ? RasterOptions::AlongM
                                : a.raster == 2 ? RasterOptions::AlongN
                                                : RasterOptions::Heuristic;
)";
  // Split-K (KernelConfig::splits): every output tile's K loop in equal parts, added in a fixed
  // order by the stream-K scheduler's deterministic reduction.
  if (cfg_.scheduler == TileSchedulerKind::stream_k && cfg_.splits > 1)
    s += fmt::format("  args.scheduler.splits = {};\n"
                     "  args.scheduler.decomposition_mode =\n"
                     "      cutlass::gemm::kernel::detail::DecompositionMode::SplitK;\n",
                     cfg_.splits);
  // fp8's two-level accumulation: the promotion interval, in WGMMAs (KernelConfig::fp8_promotion_k).
  if (backend_features(gemm_.sm, gemm_.a_dtype).two_level_fp8 && cfg_.fp8_promotion_k > 0 && !blockwise && !fast_accum && (is_fp8(gemm_.a_dtype) || is_fp8(gemm_.b_dtype)))
    s += fmt::format("  args.mainloop.mma_promotion_interval =\n"
                     "      {} / cute::size<2>(typename CollectiveMainloop::TiledMma::AtomShape_MNK{{}});\n",
                     cfg_.fp8_promotion_k);
  s += R"(  return args;
}

size_t gemm_workspace_bytes(const GemmArguments& args) {
  return (GemmKernel::get_workspace_size(args) + 255) / 256 * 256;
}

// --- the launch cache ------------------------------------------------------------------
// Building the kernel's Params (CUTLASS's to_underlying_arguments: TMA descriptors through
// the driver, the tile scheduler's set-up) costs several microseconds; a caller repeating a
// call with the same arguments gets the Params of its previous call and only launches.
// Params hold no stream (they are passed to the kernel by value), so one entry serves every
// stream. Per thread, so concurrent callers share nothing; a few entries per thread, so
// alternating between problems (a training step's shapes, two outputs) still hits.
constexpr int kCacheEntries = 4;

struct LaunchEntry {
  bool valid = false;
  int device = -1;
  evtc_gemm_args key{};  // ptrs and scalars are compared through the copies below
  void* ptrs[kPointerSlots > 0 ? kPointerSlots : 1] = {};
  double scalars[kScalarSlots > 0 ? kScalarSlots : 1] = {};
  void* workspace = nullptr;
  size_t gemm_bytes = 0;
  GemmArguments args{};
  GemmParams params{};
  dim3 grid{};
};

struct LaunchCache {
  LaunchEntry entries[kCacheEntries];
  int next = 0;
};

bool same_call(const LaunchEntry& e, const evtc_gemm_args& a, void* workspace, int device) {
  const evtc_gemm_args& k = e.key;
  return e.valid && e.device == device && e.workspace == workspace && k.m == a.m && k.n == a.n &&
         k.k == a.k && k.a == a.a && k.b == a.b && k.c == a.c && k.d == a.d && k.lda == a.lda &&
         k.ldb == a.ldb && k.ldc == a.ldc && k.ldd == a.ldd && k.sm_count == a.sm_count &&
         k.raster == a.raster && k.swizzle == a.swizzle && k.scale_a == a.scale_a &&
         k.scale_b == a.scale_b && k.ld_scale_a == a.ld_scale_a && k.scale_a_m_stride == a.scale_a_m_stride &&
         k.scale_b_k_stride == a.scale_b_k_stride && k.scale_b_n_stride == a.scale_b_n_stride &&
         (kPointerSlots == 0 || std::memcmp(e.ptrs, a.ptrs, sizeof(void*) * kPointerSlots) == 0) &&
         (kScalarSlots == 0 || std::memcmp(e.scalars, a.scalars, sizeof(double) * kScalarSlots) == 0);
}

)";
  s += backend::kernel_loader();
  s += fmt::format("\n// The tile scheduler: persistent (its workspace does not depend on the grid), else stream-K.\n"
                   "constexpr bool kPersistentScheduler = {};\n",
                   cfg_.scheduler == TileSchedulerKind::persistent);
  s += R"(
// The kernel's launch configuration over `grid` on stream `s`: its block and shared memory, and
// its cluster shape as a launch attribute (written to `cluster`).
cudaLaunchConfig_t launch_config(dim3 grid, cudaStream_t s, cudaLaunchAttribute* cluster) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = GemmKernel::get_block_shape();
  config.dynamicSmemBytes = GemmKernel::SharedStorageSize;
  config.stream = s;
  if (cute::size(ClusterShape{}) > 1) {
    cluster->id = cudaLaunchAttributeClusterDimension;
    cluster->val.clusterDim.x = cute::size<0>(ClusterShape{});
    cluster->val.clusterDim.y = cute::size<1>(ClusterShape{});
    cluster->val.clusterDim.z = 1;
    config.attrs = cluster;
    config.numAttrs = 1;
  }
  return config;
}

// Clusters of this kernel resident at once on `device` (0: unknown). Whole clusters fit in a
// GPC, so where the GPCs' multiprocessor counts are no multiple of the cluster's size fewer than
// sm_count / size run at once: 30 clusters of 4 on an H200's 132 multiprocessors. Given it,
// CUTLASS's persistent scheduler launches that many clusters; without it, its estimate (29 of
// 4 there).
int resident_clusters(const void* kernel, int device) {
  constexpr int size = int(cute::size(ClusterShape{}));
  if (size <= 1) return 0;
  static std::mutex mutex;
  static int known[64] = {};
  std::lock_guard<std::mutex> lock(mutex);
  if (device >= 0 && device < 64 && known[device] > 0) return known[device];
  cudaLaunchAttribute cluster{};
  const cudaLaunchConfig_t config =
      launch_config(dim3(cute::size<0>(ClusterShape{}), cute::size<1>(ClusterShape{}), 1), nullptr, &cluster);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (device >= 0 && device < 64) known[device] = clusters;
  return clusters;
}

// What GemmUniversalAdapter::initialize does, into a cache entry.
cutlass::Status prepare(LaunchEntry& e, const void* kernel, const evtc_gemm_args& a, void* workspace, int device,
                        cudaStream_t s) {
  e.valid = false;
  constexpr int smem = GemmKernel::SharedStorageSize;
  if (smem >= (48 << 10) &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
    cudaGetLastError();
    return cutlass::Status::kErrorInternal;
  }
  if (cute::size(ClusterShape{}) > 1 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    cudaGetLastError();
    return cutlass::Status::kErrorInternal;
  }
  e.args = gemm_arguments(a, nullptr);
  e.gemm_bytes = gemm_workspace_bytes(e.args);
  char* scratch = static_cast<char*>(workspace) + e.gemm_bytes;
  e.args = gemm_arguments(a, scratch);
  // The persistent scheduler's grid: the clusters resident at once (CUTLASS takes it where it
  // fits within the multiprocessor count given). Its workspace does not depend on the grid;
  // stream-K's does, so stream-K kernels keep CUTLASS's estimate, as their workspace size did.
  if (kPersistentScheduler) e.args.hw_info.max_active_clusters = resident_clusters(kernel, device);
  cutlass::Status status = GemmKernel::initialize_workspace(e.args, workspace, s, nullptr);
  if (status != cutlass::Status::kSuccess) return status;
  e.params = GemmKernel::to_underlying_arguments(e.args, workspace);
  e.grid = GemmKernel::get_grid_shape(e.params);
  e.key = a;
  e.key.ptrs = nullptr;
  e.key.scalars = nullptr;
  if (kPointerSlots) std::memcpy(e.ptrs, a.ptrs, sizeof(void*) * kPointerSlots);
  if (kScalarSlots) std::memcpy(e.scalars, a.scalars, sizeof(double) * kScalarSlots);
  e.workspace = workspace;
  e.device = device;
  e.valid = true;
  return cutlass::Status::kSuccess;
}

// GemmUniversalAdapter::run for sm90: the cluster shape as a launch attribute.
cudaError_t launch(LaunchEntry& e, const void* kernel, cudaStream_t s) {
  cudaLaunchAttribute cluster{};
  const cudaLaunchConfig_t config = launch_config(e.grid, s, &cluster);
  void* params[] = {&e.params};
  return cudaLaunchKernelExC(&config, kernel, params);
}

)";
  if (parts) s += parts_epilogue_launch();
  s += backend::exports_begin(parts ? parts_sig_.c_export() : sig_.c_export());
  s += R"(
int evtc_can_implement(const evtc_gemm_args* a, char* why, size_t why_size) {
)";
  if (parts)
    s += fmt::format(R"(  // Each K part a whole number of 16-byte rows of A and B (their batch strides, for TMA).
  constexpr int64_t per_16_bytes = 16 / (sizeof(ElementA) < sizeof(ElementB) ? sizeof(ElementA) : sizeof(ElementB));
  if (a->k % {0} != 0 || (a->k / {0}) % per_16_bytes != 0) {{
    char text[160];
    std::snprintf(text, sizeof(text), "K = %lld does not split into {0} parts of a multiple of %lld elements",
                  static_cast<long long>(a->k), static_cast<long long>(per_16_bytes));
    set_reason(why, why_size, text);
    return EVTC_ERROR_CANNOT_IMPLEMENT;
  }}
)",
                     cfg_.k_parts);
  s += fmt::format(R"(  if (!GemmKernel::can_implement(gemm_arguments(*a, nullptr))) {{
    set_reason(why, why_size, cutlassGetStatusString(cutlass::Status::kInvalid));
    return EVTC_ERROR_CANNOT_IMPLEMENT;
  }}
  return EVTC_OK;
}}

size_t evtc_workspace_size(const evtc_gemm_args* a) {{
  return gemm_workspace_bytes(gemm_arguments(*a, nullptr)) + scratch_bytes(*a){};
}}

)",
                   parts ? " + partials_bytes(*a)" : "");
  s += backend::run_begin();
  s += R"(  int device = 0;
  cudaGetDevice(&device);
  thread_local LaunchCache cache;
  LaunchEntry* e = nullptr;
  for (LaunchEntry& c : cache.entries)
    if (same_call(c, *a, workspace, device)) {
      e = &c;
      break;
    }
  if (e) {
    // A CUTLASS workspace (stream-K's tile counters) is set up again for every launch.
    if (e->gemm_bytes) {
      cutlass::Status status = GemmKernel::initialize_workspace(e->args, workspace, s, nullptr);
      if (status != cutlass::Status::kSuccess) {
        set_reason(why, why_size, cutlassGetStatusString(status));
        return EVTC_ERROR_CANNOT_IMPLEMENT;
      }
    }
  } else {
    e = &cache.entries[cache.next];
    cache.next = (cache.next + 1) % kCacheEntries;
    cutlass::Status status = prepare(*e, kernel, *a, workspace, device, s);
    if (status != cutlass::Status::kSuccess) {
      set_reason(why, why_size, cutlassGetStatusString(status));
      return EVTC_ERROR_CANNOT_IMPLEMENT;
    }
  }
  if (cudaError_t err = launch(*e, kernel, s); err != cudaSuccess) {
    e->valid = false;
    set_reason(why, why_size, cudaGetErrorString(err));
    return EVTC_ERROR_LAUNCH;
  }
)";
  if (parts)
    s += R"(  if (int status = run_parts_epilogue(*a, reinterpret_cast<const float*>(static_cast<char*>(workspace) + e->gemm_bytes),
                                        s, why, why_size);
      status != EVTC_OK)
    return status;
)";
  s += backend::run_end("static_cast<char*>(workspace) + e->gemm_bytes");
  return s;
}

}  // namespace

std::string Emitter::parts_epilogue_launch() const {
  return fmt::format(R"(
// --- K in parts: the second kernel -------------------------------------------------------
constexpr int kParts = {0};
// The parts' fp32 products, in the scratch.
size_t partials_bytes(const evtc_gemm_args& a) {{
  return (size_t(kParts) * size_t(a.m) * size_t(a.n) * sizeof(float) + 255) / 256 * 256;
}}

{4}
// The plain epilogue over the sum of the parts, in the caller's M×N ({1}).
int run_parts_epilogue(const evtc_gemm_args& a, const float* partials, cudaStream_t s, char* why, size_t why_size) {{
  cudaError_t load_error = cudaSuccess;
  const void* kernel = epilogue_kernel(&load_error);
  if (!kernel) {{
    set_reason(why, why_size, cudaGetErrorString(load_error));
    return EVTC_ERROR_LAUNCH;
  }}
  const int64_t m = {2}, n = {3};
  evtc_plain::Params p = evtc_plain::params_of(a, m, n, nullptr);
  const int sms = a.sm_count > 0 ? a.sm_count : sm_count_of_current_device();
  constexpr int threads = 256;
  cudaLaunchConfig_t config{{}};
  config.gridDim = dim3(unsigned(evtc_plain::epilogue_blocks(m, n, threads, sms)));
  config.blockDim = dim3(threads);
  config.stream = s;
  // A programmatic dependent of the GEMM: launched while the GEMM's last tiles finish, it waits
  // for the GEMM's results (griddepcontrol.wait) before reading them.
  cudaLaunchAttribute dependent[1];
  dependent[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = dependent;
  config.numAttrs = 1;
  int64_t part_stride = m * n;
  void* args[] = {{&p, &partials, &part_stride}};
  if (cudaError_t err = cudaLaunchKernelExC(&config, kernel, args); err != cudaSuccess) {{
    set_reason(why, why_size, cudaGetErrorString(err));
    return EVTC_ERROR_LAUNCH;
  }}
  return EVTC_OK;
}}

)",
                     cfg_.k_parts,
                     cfg_.swap_ab ? "a transposed kernel's arguments have M and N exchanged" : "the kernel's own",
                     cfg_.swap_ab ? "a.n" : "a.m", cfg_.swap_ab ? "a.m" : "a.n",
                     backend::kernel_loader("epilogue_kernel", "evtc_plain::evtc_plain_epilogue", 1));
}

backend::EmittedKernel emit_kernel(const Graph& g, const GemmDesc& gemm, const KernelConfig& config) {
  return Emitter(g, gemm, config).emit();
}

backend::EmittedKernel emit_parts_kernel(const Graph& g, const GemmDesc& gemm, const KernelConfig& config) {
  // The GEMM's own epilogue writes the product: D = acc in f32, row-major in the caller's M×N.
  Graph product;
  product.store("D", product.accum(), DType::f32);
  GemmDesc kernel_gemm = gemm;
  if (config.swap_ab) {
    SwappedProblem swapped = swap_ab(product, gemm);
    product = std::move(swapped.graph);
    kernel_gemm = swapped.gemm;
  }
  Emitter e(product, kernel_gemm, config);
  e.set_parts_epilogue(g);
  return e.emit();
}

EpilogueVisitors emit_epilogue_visitors(const Graph& g, const GemmDesc& gemm,
                                        const KernelConfig& config, EpilogueTarget target) {
  return Emitter(g, gemm, config, target).emit_visitors();
}

}  // namespace evtc::cutlass3
