#include "backends/sm80/sm80_emitter.hpp"

#include <fmt/format.h>

#include <map>

#include "backends/host_code.hpp"
#include "backends/visitor_lowering.hpp"
#include "evtc/arch.hpp"
#include "evtc/error.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/passes.hpp"

namespace evtc::sm80 {

WarpShape warp_shape(const KernelConfig& c) {
  if (c.tile_m >= 128 && c.tile_n >= 128) return {64, 64};
  if (c.tile_m >= 128) return {64, 32};  // 128×64: 2×2 warps
  if (c.tile_n >= 128) return {32, 64};  // 64×128: 2×2 warps
  return {32, 32};
}

namespace {

using backend::cutlass_type;
using backend::float_literal;
using backend::Visitor;

constexpr const char* kRound = "cutlass::FloatRoundStyle::round_to_nearest";
constexpr const char* kNs = "cutlass::epilogue::threadblock::";
// Row-major [m,n] tensors in CUTLASS's (M, N, L) convention: N adjacent, rows `ld` apart.
constexpr const char* kRowMajorStride = "cute::Stride<int64_t, cute::_1, int64_t>";

class Sm80Emitter : public backend::VisitorLowering {
 public:
  // Every output is a store node: no collective epilogue stores D here.
  Sm80Emitter(const Graph& g, const GemmDesc& gemm, const KernelConfig& cfg)
      : VisitorLowering(g, false), gemm_(gemm), cfg_(cfg) {}

  backend::EmittedKernel emit() {
    const Visitor root = lower();
    return {assemble(root), sig_};
  }

 private:
  Visitor simple(const std::string& definition, const std::string& comment, const std::string& args = "{}") {
    const std::string type = alias(definition, comment);
    return {type, fmt::format("typename {}::Arguments{}", type, args)};
  }
  Visitor compute(const std::string& functor, DType out, const std::string& comment, const std::string& args = "{}") {
    return simple(fmt::format("evtc::device::Sm80Compute<evtc::device::{}, {}, float, {}>", functor,
                              cutlass_type(out), kRound),
                  comment, args);
  }
  // An [m,n] operand read through CUTLASS's vectorised aux load (non-const pointer in its Arguments).
  Visitor mn_load(const std::string& pointer, const std::string& e, const std::string& ld, const std::string& comment) {
    return simple(fmt::format("{}VisitorAuxLoad<OutputTileThreadMap, {}, {}>", kNs, e, kRowMajorStride), comment,
                  fmt::format("{{const_cast<{0}*>({1}), {0}(0), {{int64_t({2}), cute::_1{{}}, int64_t(0)}}}}", e,
                              pointer, ld));
  }

  // --- one visitor per node --------------------------------------------------------------
  Visitor emit_node(NodeId id) override {
    const Node& n = g_.node(id);
    const std::string e = cutlass_type(n.dtype);
    switch (n.kind) {
      case NodeKind::accum: return simple(std::string(kNs) + "VisitorAccFetch", "acc");
      case NodeKind::source:
        return mn_load(fmt::format("static_cast<const {}*>(a.c)", e), e, "a.ldc", "C");
      case NodeKind::scalar: {
        if (n.scalar_kind == ScalarKind::constant)
          return simple(fmt::format("{}VisitorScalarBroadcast<float>", kNs), fmt::format("constant {}", n.value),
                        fmt::format("{{{{{}}}}}", float_literal(n.value)));
        const std::string type = fmt::format("{}VisitorScalarBroadcast<{}>", kNs, e);
        if (n.scalar_kind == ScalarKind::value)
          return simple(type, "scalar " + n.name,
                        fmt::format("{{{{{}(float(a.scalars[{}]))}}}}", e, scalar_slot_.at(n.name)));
        return simple(type, "scalar " + n.name, fmt::format("{{{{}}, {{{}}}}}", ptr(n.name, e)));
      }
      case NodeKind::row_vec:
        return simple(fmt::format("{}VisitorRowBroadcast<OutputTileThreadMap, {}, cute::Stride<cute::_0, cute::_1, "
                                  "cute::_0>>",
                                  kNs, e),
                      "row vector " + n.name + "[n]", fmt::format("{{{}, {}(0), {{}}}}", ptr(n.name, e), e));
      case NodeKind::col_vec:
        return simple(fmt::format("{}VisitorColBroadcast<OutputTileThreadMap, {}, cute::Stride<cute::_1, cute::_0, "
                                  "cute::_0>>",
                                  kNs, e),
                      "column vector " + n.name + "[m]", fmt::format("{{{}, {}(0), {{}}}}", ptr(n.name, e), e));
      case NodeKind::aux:  // row-major only (legality: column_major_mn)
        return mn_load(ptr(n.name, e), e, "a.n", "aux load " + n.name + "[m,n]");
      case NodeKind::compute: {
        const OpInfo& info = op_info(n.op);
        return compute(std::string(info.cuda_functor), n.dtype, std::string(info.name), backend::op_arguments(n));
      }
      case NodeKind::cast:  // the node's output type rounds; the identity functor computes nothing
        return compute("Identity", n.dtype, fmt::format("cast to {}", dtype_name(n.dtype)));
      case NodeKind::pair:  // see evtc/device/sm90_half_store.cuh
        return compute(n.part == PairPart::gate ? "PairGate" : "PairUp", n.dtype, std::string(pair_part_name(n.part)));
      case NodeKind::index:  // legality refuses it (ArchFeatures::indices)
        internal_fail(__FILE__, __LINE__, "the sm_80 backend has no index node");
      case NodeKind::reduce:
      case NodeKind::store: break;
    }
    internal_fail(__FILE__, __LINE__, "emit_node on a terminal");
  }

  Visitor emit_store(const Node& s) override {
    const std::string e = cutlass_type(s.dtype);
    if (s.shape == Shape::half)  // a gated [m,n/2] output, packed row-major
      return simple(fmt::format("evtc::device::Sm80HalfStore<OutputTileThreadMap, {}, {}>", e, kRound),
                    "gated output " + s.name + "[m,n/2]", fmt::format("{{{}, a.n / 2}}", ptr(s.name, e, false)));
    const bool main = s.name == sig_.d_name;  // D: the ABI's d and ldd
    return simple(fmt::format("{}VisitorAuxStore<OutputTileThreadMap, {}, {}, {}>", kNs, e, kRound, kRowMajorStride),
                  "output " + s.name + "[m,n]",
                  fmt::format("{{{}, {{int64_t({}), cute::_1{{}}, int64_t(0)}}}}",
                              main ? fmt::format("static_cast<{}*>(a.d)", e) : ptr(s.name, e, false),
                              main ? "a.ldd" : "a.n"));
  }

  // Reductions write per-tile partials to evtc's scratch, folded in a fixed order after the
  // kernel (evtc/device/sm80_nodes.cuh, reduce.cuh): deterministic, no atomics.
  Visitor emit_reduce(const Node& r, const Node& s) override {
    const size_t index = reductions_.size();
    reductions_.push_back({ptr_slot_.at(s.name), r.axis, r.reduce_op, s.dtype});
    const std::string op = backend::device_reduce_op(r.reduce_op);
    const std::string name = fmt::format("{}_{} -> output {}", reduce_axis_name(r.axis), reduce_op_name(r.reduce_op), s.name);
    const std::string args =
        fmt::format("{{scratch_partials(a, scratch, {}), {}}}", index, backend::reduction_identity(r.reduce_op));
    switch (r.axis) {
      case ReduceAxis::row:
        return simple(fmt::format("evtc::device::Sm80RowPartials<OutputTileThreadMap, {}, kTileM>", op),
                      name + " (per-tile partials)", args);
      case ReduceAxis::col:
        return simple(fmt::format("evtc::device::Sm80ColPartials<OutputTileThreadMap, {}, kTileN, kEpilogueWarps>", op),
                      name + " (per-tile partials)", args);
      case ReduceAxis::all: break;
    }
    return simple(fmt::format("evtc::device::Sm80ScalarPartials<OutputTileThreadMap, {}, kTileN, kEpilogueWarps>", op),
                  name + " (per-warp partials)", args);
  }

  Visitor abs_op() override { return compute("Abs", DType::f32, "abs (for amax)"); }
  Visitor identity_f32(const std::string& comment) override { return compute("Identity", DType::f32, comment); }
  std::string tree_template() const override { return std::string(kNs) + "Sm80EVT"; }
  std::string topological_template() const override { return std::string(kNs) + "Sm80TopologicalVisitor"; }

  // The element the epilogue's thread map is laid out for: its accesses are 16 bytes of it, so
  // every [m,n] tensor's vectors (16 bytes of its own type, or less) hold whole fragments.
  // 16-bit when any [m,n] tensor is 16-bit (8-element fragments), f32 otherwise (4).
  std::string layout_element() const {
    for (const Node& n : g_.nodes()) {
      const bool mn = n.kind == NodeKind::aux || n.kind == NodeKind::source ||
                      (n.kind == NodeKind::store && g_.node(n.inputs[0]).kind != NodeKind::reduce);
      if (mn && dtype_bytes(n.dtype) < 4) return "cutlass::half_t";
    }
    return "float";
  }

  // Two epilogue stages when the tree loads [m,n] tensors (C or operands): CUTLASS's pipelined
  // 2.x epilogue then issues the loads of the next step's rows (VisitorAuxLoad's begin_step)
  // before visiting this step's, and the loads' latency hides behind the visit. Without such
  // loads nothing is gained and the second shared-memory stage only costs. Measured on W2
  // (acc * gate[m,n], 8192×8192×1024, bench/sm80_evt.py): 1.118× the plain GEMM with one stage,
  // 1.091× with two.
  int epilogue_stages() const {
    for (const Node& n : g_.nodes())
      if (n.kind == NodeKind::aux || n.kind == NodeKind::source) return 2;
    return 1;
  }

  std::string assemble(const Visitor& root);

  GemmDesc gemm_;
  KernelConfig cfg_;
  std::vector<backend::ReductionSlot> reductions_;
};

std::string Sm80Emitter::assemble(const Visitor& root) {
  const WarpShape warp = warp_shape(cfg_);
  const int warps = (cfg_.tile_m / warp.m) * (cfg_.tile_n / warp.n);
  std::string s = backend::source_banner("one CUTLASS 2.x multistage GEMM (sm_80 code) with a fused epilogue", g_,
                                         "kernel config " + cfg_.name());
  s += backend::host_part_device_pass_begin(!reductions_.empty());
  if (cfg_.precise_math) s += "#define EVTC_PRECISE_MATH 1\n";
  s += R"(
#include <cutlass/cutlass.h>
#include <cutlass/gemm/kernel/default_gemm_universal_with_visitor.h>
#include <cutlass/gemm/threadblock/threadblock_swizzle.h>
#include <cutlass/epilogue/threadblock/fusion/visitors.hpp>

#include <cstring>

#include "evtc/device/abi.h"
#include "evtc/device/host_support.h"
#include "evtc/device/kernel_host.h"
#include "evtc/device/ops.cuh"
#include "evtc/device/reduce.cuh"
#include "evtc/device/sm80_nodes.cuh"
#include "evtc/device/sm90_half_store.cuh"

)";
  s += backend::parts_prelude();
  s += "\nnamespace {\n\n";
  s += fmt::format("using ElementA = {};\nusing LayoutA = {};\n", cutlass_type(gemm_.a_dtype),
                   backend::layout_tag(gemm_.a_layout));
  s += fmt::format("using ElementB = {};\nusing LayoutB = {};\n", cutlass_type(gemm_.b_dtype),
                   backend::layout_tag(gemm_.b_layout));
  s += fmt::format(
      "using ThreadblockShape = cutlass::gemm::GemmShape<{0}, {1}, {2}>;\n"
      "using WarpShape = cutlass::gemm::GemmShape<{3}, {4}, {2}>;\n"
      "using InstructionShape = cutlass::gemm::GemmShape<16, 8, 16>;  // mma.sync for 16-bit A and B\n"
      "constexpr int kStages = {5};\n"
      "constexpr int kEpilogueStages = {8};\n"
      "// The element the epilogue's thread map is laid out for (16-byte accesses of it).\n"
      "using ElementLayoutC = {6};\n"
      "constexpr int kAlignmentC = 128 / cutlass::sizeof_bits<ElementLayoutC>::value;\n"
      "using OutputTileThreadMap = cutlass::epilogue::threadblock::OutputTileThreadLayout<\n"
      "    ThreadblockShape, WarpShape, ElementLayoutC, kAlignmentC, kEpilogueStages>;\n"
      "constexpr int kTileM = {0};\n"
      "constexpr int kTileN = {1};\n"
      "constexpr int kEpilogueWarps = {7};\n\n",
      cfg_.tile_m, cfg_.tile_n, cfg_.tile_k, warp.m, warp.n, cfg_.stages, layout_element(), warps,
      epilogue_stages());
  s += declarations();
  s += fmt::format("\nusing Callbacks = {};\n", root.type);
  s += R"(
using GemmKernel = typename cutlass::gemm::kernel::DefaultGemmWithVisitor<
    ElementA, LayoutA, cutlass::ComplexTransform::kNone, 128 / cutlass::sizeof_bits<ElementA>::value,
    ElementB, LayoutB, cutlass::ComplexTransform::kNone, 128 / cutlass::sizeof_bits<ElementB>::value,
    ElementLayoutC, cutlass::layout::RowMajor, kAlignmentC,
    float, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    ThreadblockShape, WarpShape, InstructionShape, Callbacks,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>, kStages,
    cutlass::arch::OpMultiplyAdd, kEpilogueStages>::GemmKernel;
using GemmArguments = typename GemmKernel::Arguments;
using GemmParams = typename GemmKernel::Params;
static_assert(GemmKernel::kThreadCount == kEpilogueWarps * 32, "warps of the CTA tile");

}  // namespace

#if EVTC_PART != 2
// The kernel: CUTLASS's GemmWithEpilogueVisitor under a name the host part can look up.
extern "C" __global__ void __launch_bounds__(GemmKernel::kThreadCount, 1)
evtc_gemm_kernel(CUTLASS_GRID_CONSTANT const GemmParams params) {
  extern __shared__ int smem[];
  GemmKernel::invoke(params, *reinterpret_cast<typename GemmKernel::SharedStorage*>(smem));
}
#endif

#if EVTC_PART != 1
)";
  s += backend::kernel_image_declaration();
  s += "\nnamespace {\n\n";
  s += backend::reduction_scratch_code(reductions_);
  s += fmt::format(R"(
typename Callbacks::Arguments fusion_arguments(const evtc_gemm_args& a, char* scratch) {{
  (void)scratch;
  return {};
}}
)",
                   root.args);
  s += backend::reduction_finish_code(reductions_);
  s += R"(
using evtc::device::set_reason;

GemmArguments gemm_arguments(const evtc_gemm_args& a, char* scratch) {
  using RowMajorC = cutlass::layout::RowMajor;
  // Every output is a store node of the tree (fusion_arguments): the kernel's own C and D are unused.
  return GemmArguments(cutlass::gemm::GemmUniversalMode::kGemm, {int(a.m), int(a.n), int(a.k)}, 1,
                       fusion_arguments(a, scratch), a.a, a.b, nullptr, nullptr, 0, 0, 0, 0,
                       typename LayoutA::Stride::LongIndex(a.lda), typename LayoutB::Stride::LongIndex(a.ldb),
                       typename RowMajorC::Stride::LongIndex(a.n), typename RowMajorC::Stride::LongIndex(a.n));
}

)";
  s += backend::kernel_loader();
  s += R"(
)";
  s += backend::exports_begin(sig_.c_export());
  s += R"(
int evtc_can_implement(const evtc_gemm_args* a, char* why, size_t why_size) {
  const cutlass::Status status = GemmKernel::can_implement(gemm_arguments(*a, nullptr));
  if (status != cutlass::Status::kSuccess) {
    set_reason(why, why_size, cutlassGetStatusString(status));
    return EVTC_ERROR_CANNOT_IMPLEMENT;
  }
  return EVTC_OK;
}

size_t evtc_workspace_size(const evtc_gemm_args* a) { return scratch_bytes(*a); }

)";
  s += backend::run_begin();
  s += R"(  // evtc_can_implement was asked once for this problem (the runtime's plan), as for every backend.
  const GemmArguments args = gemm_arguments(*a, static_cast<char*>(workspace));
  // Building the Params is a few integer operations (no TMA descriptors): no launch cache.
  GemmParams params(args, a->sm_count > 0 ? a->sm_count : evtc::device::sm_count_of_current_device(), 1);
  cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8> swizzle;
  const dim3 grid = swizzle.get_grid_shape(params.grid_tiled_shape);
  const dim3 block(GemmKernel::kThreadCount, 1, 1);
  constexpr int smem = int(sizeof(typename GemmKernel::SharedStorage));
  if (smem >= (48 << 10)) {
    thread_local int configured_device = -1;
    int device = 0;
    cudaGetDevice(&device);
    if (device != configured_device) {
      if (cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
          err != cudaSuccess) {
        cudaGetLastError();
        set_reason(why, why_size, cudaGetErrorString(err));
        return EVTC_ERROR_LAUNCH;
      }
      configured_device = device;
    }
  }
  void* kernel_args[] = {&params};
  if (cudaError_t err = cudaLaunchKernel(kernel, grid, block, kernel_args, smem, s); err != cudaSuccess) {
    set_reason(why, why_size, cudaGetErrorString(err));
    return EVTC_ERROR_LAUNCH;
  }
)";
  s += backend::run_end("static_cast<char*>(workspace)");
  return s;
}

}  // namespace

backend::EmittedKernel emit_kernel(const Graph& g, const GemmDesc& gemm, const KernelConfig& config) {
  EVTC_INTERNAL_ASSERT(config.schedule == MainloopSchedule::multistage, "the sm_80 backend takes multistage configurations");
  return Sm80Emitter(g, gemm, config).emit();
}

}  // namespace evtc::sm80
