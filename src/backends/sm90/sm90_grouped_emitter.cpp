#include "backends/sm90/sm90_grouped_emitter.hpp"

#include "backends/host_code.hpp"
#include "backends/sm90/wgmma_shapes.hpp"

#include <fmt/format.h>

#include "evtc/error.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/passes.hpp"

namespace evtc::sm90 {

std::string grouped_output_name(const Graph& g) {
  const KernelSignature sig = make_signature(g);
  if (!sig.d_name.empty()) return sig.d_name;
  for (const OperandSlot& s : sig.pointers)
    if (s.is_output && s.kind == NodeKind::store && s.shape == Shape::half) return s.name;
  return "";
}

std::vector<std::string> grouped_refusals(const Graph& g, const GemmDesc& gemm) {
  std::vector<std::string> why;
  const bool sixteen = gemm.a_dtype == DType::bf16 || gemm.a_dtype == DType::f16;
  if (is_fp8(gemm.a_dtype) || is_fp8(gemm.b_dtype)) {
    if (!is_fp8(gemm.a_dtype) || !is_fp8(gemm.b_dtype))
      why.push_back(fmt::format("grouped fp8 GEMMs take fp8 X and W (got {} and {})", dtype_name(gemm.a_dtype),
                                dtype_name(gemm.b_dtype)));
    else if (gemm.b_layout != Layout::col_major)
      why.push_back("fp8 weights must be G × N × K (K-major, b_layout col_major): the fp8 tensor-core "
                    "instructions read both operands K-major");
  } else if (!sixteen || gemm.b_dtype != gemm.a_dtype) {
    why.push_back(fmt::format("grouped GEMMs take bf16 or f16 X and W of one dtype, or fp8 X and W (got {} "
                              "and {})",
                              dtype_name(gemm.a_dtype), dtype_name(gemm.b_dtype)));
  }
  if (std::string r = fp8_blockwise_refusal(gemm); !r.empty()) why.push_back(std::move(r));
  else if (gemm.fp8_fast_accum)
    why.push_back("grouped fp8 GEMMs have no fast accumulation (fp8_fast_accum): they accumulate in two levels");
  if (gemm.a_layout != Layout::row_major)
    why.push_back("grouped GEMMs take a row-major token matrix X (sum of M_g × K)");
  const KernelSignature sig = make_signature(g);
  // The one output: the [m,n] main output, else a gated [m,n/2] output.
  const std::string out = grouped_output_name(g);
  if (out.empty()) why.push_back("a grouped kernel needs an output ([m,n], or a gated [m,n/2])");
  if (std::string deep = depth_refusal(g); !deep.empty()) why.push_back(std::move(deep));
  for (NodeId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    switch (n.kind) {
      case NodeKind::aux:
        why.push_back(fmt::format(
            "operand '{}' is a full [m,n] operand: grouped kernels cannot read per-group [m,n] "
            "operands (CUTLASS 4.2's TMA Sm90AuxLoad does not compile with GroupProblemShape)",
            n.name));
        break;
      case NodeKind::col_vec:
        why.push_back(fmt::format(
            "operand '{}[m]' is a column vector: grouped kernels take row vectors ([n], one per "
            "group or shared) and scalars, not per-token [m] operands",
            n.name));
        break;
      case NodeKind::source:
        why.push_back("the epilogue reads the GEMM's source C: grouped kernels have no C");
        break;
      case NodeKind::index:
        why.push_back(fmt::format("the epilogue reads the index '{}': grouped kernels do not read the indices m "
                                  "and n (evtc's index node is built for dense kernels)",
                                  index_axis_name(n.index_axis)));
        break;
      case NodeKind::row_vec:
        if (is_integer(n.dtype))
          why.push_back(fmt::format("operand '{}[n]' is {}: grouped kernels take floating-point row vectors only",
                                    n.name, dtype_name(n.dtype)));
        break;
      case NodeKind::store: {
        const Node& in = g.node(n.inputs[0]);
        if (in.kind == NodeKind::reduce)
          why.push_back(fmt::format(
              "output '{}' is a reduction: grouped kernels have none (CUTLASS 4.2's "
              "Sm90ColReduction does not compile with GroupProblemShape)",
              n.name));
        else if (n.name != out)
          why.push_back(fmt::format(
              "output '{}' is a second output: grouped kernels write one (the main output "
              "'{}'; CUTLASS 4.2 has no per-group aux stores)",
              n.name, out));
        else if (n.layout != Layout::row_major)
          why.push_back(fmt::format("output '{}' must be row-major in a grouped kernel", n.name));
        break;
      }
      default: break;
    }
  }
  return why;
}

namespace {

using backend::cutlass_type;
using backend::layout_tag;

}  // namespace

backend::EmittedKernel emit_grouped_kernel(const Graph& g, const GemmDesc& gemm, const KernelConfig& cfg) {
  const auto refusals = grouped_refusals(g, gemm);
  EVTC_INTERNAL_ASSERT(refusals.empty(), refusals.empty() ? "" : refusals.front());
  const cutlass3::EpilogueVisitors tree =
      cutlass3::emit_epilogue_visitors(g, gemm, cfg, cutlass3::EpilogueTarget::grouped);
  const KernelSignature& sig = tree.signature;
  // A gated graph has no [m,n] main output: the collective epilogue is built without D
  // (ElementD = void) and the visitor tree's Sm90HalfStore writes the [m,n/2] output Y.
  const bool gated = sig.d_name.empty();
  DType y_dtype = sig.d_dtype;
  for (const OperandSlot& o : sig.pointers)
    if (gated && o.name == grouped_output_name(g)) y_dtype = o.dtype;
  const bool coop = cfg.schedule == MainloopSchedule::cooperative;
  std::string s = backend::source_banner(
      "one CUTLASS Sm90 grouped (ptr-array) GEMM with a fused epilogue", g,
      fmt::format("kernel config {}; weights {}", cfg.name(),
                  gemm.b_layout == Layout::col_major ? "G x N x K (K-major)" : "G x K x N (N-major)"));
  if (cfg.precise_math) s += "#define EVTC_PRECISE_MATH 1\n";
  s += sm90::extended_wgmma_widths_define(cfg.tile_n);
  s += R"(
#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
)";
  const bool blockwise = gemm.fp8_blockwise;
  if (blockwise)  // the ptr-array main loop that scales each 128-wide K block's partial product
    s += "#include <cutlass/detail/blockwise_scale_layout.hpp>\n"
         "#include <cutlass/gemm/collective/sm90_mma_array_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp>\n";
  s += R"(
#include <cstdio>
#include <cstring>

#include "evtc/device/abi.h"
#include "evtc/device/grouped_abi.h"
#include "evtc/device/host_support.h"
#include "evtc/device/ops.cuh"
)";
  if (gated) s += "#include \"evtc/device/sm90_half_store.cuh\"\n";
  s += R"(
namespace {

)";
  s += fmt::format("using ElementA = {};\nusing LayoutA = cutlass::layout::RowMajor;\n",
                   cutlass_type(gemm.a_dtype));
  s += fmt::format("using ElementB = {};\nusing LayoutB = {};\n", cutlass_type(gemm.b_dtype),
                   layout_tag(gemm.b_layout));
  if (gated) {
    // CUTLASS sizes its (unused) D staging from the callbacks' ElementAux (ElementDesc).
    s += "using ElementD = void;  // void: the gated output is written by the half store\n";
    s += fmt::format("using ElementY = {};  // the gated [m,n/2] output\n", cutlass_type(y_dtype));
    s += "using ElementDesc = cutlass::bfloat16_t;\n";
  } else {
    s += fmt::format("using ElementD = {};\nusing ElementY = ElementD;  // the main output\n"
                     "using ElementDesc = ElementD;\n",
                     cutlass_type(sig.d_dtype));
  }
  s += fmt::format("using TileShape = cute::Shape<cute::_{}, cute::_{}, cute::_{}>;\n", cfg.tile_m,
                   cfg.tile_n, cfg.tile_k);
  s += fmt::format("using ClusterShape = cute::Shape<cute::_{}, cute::_{}, cute::_1>;\n",
                   cfg.cluster_m, cfg.cluster_n);
  s += fmt::format("using KernelSchedule = cutlass::gemm::{}{};\n",
                   coop ? "KernelPtrArrayTmaWarpSpecializedCooperative" : "KernelPtrArrayTmaWarpSpecializedPingpong",
                   blockwise ? "FP8Blockwise" : "");
  // Block scales, K adjacent in both: group g's A scales are rows [start_g, end_g) of a
  // row-major total_m × ceil(K/128) matrix, so one pointer per group finds them. CUTLASS
  // derives each group's scale layouts from its problem shape (the per-group layout tables are
  // not read).
  if (blockwise)
    s += fmt::format(
        "using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, {0}, {0}, cute::GMMA::Major::K, "
        "cute::GMMA::Major::K>;\n"
        "using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());\n"
        "using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());\n"
        "constexpr int kScaleBlock = {0};\n",
        kFp8ScaleBlock);
  s += fmt::format("using EpilogueSchedule = cutlass::epilogue::{};\n",
                   coop ? "PtrArrayTmaWarpSpecializedCooperative" : "PtrArrayTmaWarpSpecializedPingpong");
  s += "using EpilogueTile = cutlass::epilogue::collective::EpilogueTileAuto;\n";
  s += "using EpilogueDescriptor = cutlass::epilogue::collective::detail::EpilogueDescriptor<\n"
       "    TileShape, EpilogueTile, ElementDesc, ElementDesc, EpilogueSchedule>;\n\n";
  s += tree.declarations;
  if (gated)
    s += fmt::format("\nstruct Callbacks : {0} {{\n  using {0}::{1};\n  using ElementAux = ElementDesc;\n}};\n",
                     tree.root_type, tree.root_type.substr(tree.root_type.rfind(':') + 1));
  else
    s += fmt::format("\nusing Callbacks = {};\n", tree.root_type);
  s += R"(
using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape, EpilogueTile,
    float, float, void, cutlass::layout::RowMajor*, 128 / cutlass::sizeof_bits<ElementDesc>::value,
    ElementD, cutlass::layout::RowMajor*, 128 / cutlass::sizeof_bits<ElementDesc>::value,
    EpilogueSchedule, Callbacks>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
)";
  s += blockwise ? "    ElementA, cute::tuple<LayoutA*, LayoutSFA*>, 128 / cutlass::sizeof_bits<ElementA>::value,\n"
                   "    ElementB, cute::tuple<LayoutB*, LayoutSFB*>, 128 / cutlass::sizeof_bits<ElementB>::value, float,\n"
                 : "    ElementA, LayoutA*, 128 / cutlass::sizeof_bits<ElementA>::value,\n"
                   "    ElementB, LayoutB*, 128 / cutlass::sizeof_bits<ElementB>::value, float,\n";
  s += R"(
    TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    KernelSchedule>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

using StrideA = typename GemmKernel::InternalStrideA;
using StrideB = typename GemmKernel::InternalStrideB;
using StrideC = typename GemmKernel::InternalStrideC;
using StrideD = typename GemmKernel::InternalStrideD;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;

// The per-group tables CUTLASS reads, in the front of the workspace.
struct GroupTables {
  Shape3* shapes;
  const ElementA** ptr_a;
  const ElementB** ptr_b;
  ElementY** ptr_y;  // each group's first output row
  StrideA* stride_a;
  StrideB* stride_b;
  StrideD* stride_d;
  // Block-scaled kernels: each group's first A and B scale, and the scales copied into the
  // layout the kernel reads when they came in other strides (null when read in place).
  const float** ptr_sfa;
  const float** ptr_sfb;
  float* sfa_copy;
  float* sfb_copy;
};

)";
  s += fmt::format("constexpr bool kBlockScaled = {};\n", blockwise ? "true" : "false");
  s += fmt::format("constexpr int64_t kScaleBlockSize = {};\n", kFp8ScaleBlock);
  s += R"(
size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

int64_t scale_k_blocks(const evtc_grouped_args& a) { return (a.k + kScaleBlockSize - 1) / kScaleBlockSize; }
int64_t scale_n_blocks(const evtc_grouped_args& a) { return (a.n + kScaleBlockSize - 1) / kScaleBlockSize; }
// Whether the scales already have the kernel's layout: scale_a row-major total_m × Kb, each
// group's scale_b row-major Nb × Kb (strides of one-element dimensions do not matter).
bool scale_a_in_place(const evtc_grouped_args& a) {
  const int64_t kb = scale_k_blocks(a);
  return (kb == 1 || a.scale_a_strides[1] == 1) && (a.total_m <= 1 || a.scale_a_strides[0] == kb);
}
bool scale_b_in_place(const evtc_grouped_args& a) {
  const int64_t kb = scale_k_blocks(a);
  return (kb == 1 || a.scale_b_strides[2] == 1) && (scale_n_blocks(a) == 1 || a.scale_b_strides[1] == kb);
}

size_t table_bytes(const evtc_grouped_args& a) {
  const size_t g = size_t(a.groups);
  size_t bytes = align256(g * sizeof(Shape3)) + 3 * align256(g * sizeof(void*)) + align256(g * sizeof(StrideA)) +
                 align256(g * sizeof(StrideB)) + align256(g * sizeof(StrideD));
  if (kBlockScaled) {
    const size_t kb = size_t(scale_k_blocks(a)), nb = size_t(scale_n_blocks(a));
    bytes += 2 * align256(g * sizeof(void*));
    if (!scale_a_in_place(a)) bytes += align256(size_t(a.total_m) * kb * sizeof(float));
    if (!scale_b_in_place(a)) bytes += align256(g * nb * kb * sizeof(float));
  }
  return bytes;
}

GroupTables group_tables(void* workspace, const evtc_grouped_args& a) {
  const size_t g = size_t(a.groups);
  char* p = static_cast<char*>(workspace);
  GroupTables t{};
  auto take = [&](size_t bytes) { char* q = p; p += align256(bytes); return q; };
  t.shapes = reinterpret_cast<Shape3*>(take(g * sizeof(Shape3)));
  t.ptr_a = reinterpret_cast<const ElementA**>(take(g * sizeof(void*)));
  t.ptr_b = reinterpret_cast<const ElementB**>(take(g * sizeof(void*)));
  t.ptr_y = reinterpret_cast<ElementY**>(take(g * sizeof(void*)));
  t.stride_a = reinterpret_cast<StrideA*>(take(g * sizeof(StrideA)));
  t.stride_b = reinterpret_cast<StrideB*>(take(g * sizeof(StrideB)));
  t.stride_d = reinterpret_cast<StrideD*>(take(g * sizeof(StrideD)));
  if (kBlockScaled) {
    const size_t kb = size_t(scale_k_blocks(a)), nb = size_t(scale_n_blocks(a));
    t.ptr_sfa = reinterpret_cast<const float**>(take(g * sizeof(void*)));
    t.ptr_sfb = reinterpret_cast<const float**>(take(g * sizeof(void*)));
    if (!scale_a_in_place(a)) t.sfa_copy = reinterpret_cast<float*>(take(size_t(a.total_m) * kb * sizeof(float)));
    if (!scale_b_in_place(a)) t.sfb_copy = reinterpret_cast<float*>(take(g * nb * kb * sizeof(float)));
  }
  return t;
}

// dst[b][r][c] = src[b * s0 + r * s1 + c * s2]: block scales into the kernel's layout.
__global__ void compact_scales(const float* __restrict__ src, int64_t batches, int64_t rows, int64_t cols,
                               int64_t s0, int64_t s1, int64_t s2, float* __restrict__ dst) {
  const int64_t total = batches * rows * cols;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = e % cols, r = (e / cols) % rows, b = e / (cols * rows);
    dst[e] = src[b * s0 + r * s1 + c * s2];
  }
}

// One thread per group: its rows [start, end) of X and Y from the end offsets (clamped to
// [0, total_m]; a decreasing offset gives an empty group, which CUTLASS's group scheduler
// skips), its weights, its block scales (block-scaled kernels: sfa row-major with kb columns,
// sfb sfb_group_stride apart), and the strides.
__global__ void build_group_tables(GroupTables t, const int32_t* offsets, int groups, int64_t total_m,
                                   int n, int k, const ElementA* x, int64_t ldx, const ElementB* w,
                                   int64_t ldw, int64_t w_group_stride, ElementY* y, int64_t ldy,
                                   const float* sfa, const float* sfb, int64_t sfb_group_stride) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  int64_t start = g == 0 ? 0 : int64_t(offsets[g - 1]);
  int64_t end = int64_t(offsets[g]);
  start = start < 0 ? 0 : (start > total_m ? total_m : start);
  end = end < start ? start : (end > total_m ? total_m : end);
  t.shapes[g] = Shape3{int(end - start), n, k};
  t.ptr_a[g] = x + start * ldx;
  t.ptr_b[g] = w + int64_t(g) * w_group_stride;
  if (kBlockScaled) {
    t.ptr_sfa[g] = sfa + start * ((k + kScaleBlockSize - 1) / kScaleBlockSize);
    t.ptr_sfb[g] = sfb + int64_t(g) * sfb_group_stride;
  }
  t.ptr_y[g] = y + start * ldy;
  StrideA sa{};
  StrideB sb{};
  StrideD sd{};
  cute::get<0>(sa) = ldx;
)";
  // B is K×N to CUTLASS, indexed as N×K: N×K weights (K-major) step ldw along N.
  s += gemm.b_layout == Layout::col_major ? "  cute::get<0>(sb) = ldw;\n" : "  cute::get<1>(sb) = ldw;\n";
  s += fmt::format(R"(  cute::get<0>(sd) = ldy;
  t.stride_a[g] = sa;
  t.stride_b[g] = sb;
  t.stride_d[g] = sd;
}}

typename Callbacks::Arguments fusion_arguments(const evtc_grouped_args& a, const GroupTables& t) {{
  (void)t;
  return {};
}}
)",
                   tree.root_args);
  s += R"(
using evtc::device::set_reason;
using evtc::device::sm_count_of_current_device;

// CUTLASS's arguments over the tables (problem shapes on the device only: no host copy, so
// the group scheduler sizes the persistent grid by the multiprocessors).
typename Gemm::Arguments gemm_arguments(const evtc_grouped_args& a, const GroupTables& t) {
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = a.sm_count > 0 ? a.sm_count : sm_count_of_current_device();
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {int(a.groups), t.shapes, nullptr},
      {t.ptr_a, t.stride_a, t.ptr_b, t.stride_b)";
  // The per-group scale layout tables: CUTLASS computes each group's from its problem shape.
  s += blockwise ? ", t.ptr_sfa, nullptr, t.ptr_sfb, nullptr},\n" : "},\n";
  s += R"(
      {fusion_arguments(a, t), nullptr, nullptr, )";
  s += gated ? "nullptr, nullptr},  // no D: the half store writes Y\n" : "t.ptr_y, t.stride_d},\n";
  s += R"(      hw};
  return args;
}

)";
  s += backend::exports_begin(sig.c_export());
  s += R"(
int evtc_grouped_can_implement(const evtc_grouped_args* a, char* why, size_t why_size) {
  if (a->groups < 1 || a->groups > (int64_t(1) << 30) || a->n < 1 || a->k < 1 ||
      a->n > INT32_MAX || a->k > INT32_MAX || a->total_m > INT32_MAX) {
    set_reason(why, why_size, "G, N, K and total M must be positive and fit in 32 bits");
    return EVTC_ERROR_CANNOT_IMPLEMENT;
  }
  if (kBlockScaled && (!a->scale_a || !a->scale_b)) {
    set_reason(why, why_size, "a block-scaled kernel needs scale_a and scale_b");
    return EVTC_ERROR_CANNOT_IMPLEMENT;
  }
  cutlass::Status status = Gemm::can_implement(gemm_arguments(*a, GroupTables{}));
  if (status != cutlass::Status::kSuccess) {
    set_reason(why, why_size, cutlassGetStatusString(status));
    return EVTC_ERROR_CANNOT_IMPLEMENT;
  }
  return EVTC_OK;
}

size_t evtc_grouped_workspace_size(const evtc_grouped_args* a) {
  return table_bytes(*a) + Gemm::get_workspace_size(gemm_arguments(*a, GroupTables{}));
}

int evtc_grouped_run(const evtc_grouped_args* a, void* workspace, void* stream, char* why, size_t why_size) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const GroupTables t = group_tables(workspace, *a);
  const int threads = 128;
  const float* sfa = a->scale_a;
  const float* sfb = a->scale_b;
  int64_t sfb_group_stride = a->scale_b_strides[0];
  if (kBlockScaled) {
    const int64_t kb = scale_k_blocks(*a), nb = scale_n_blocks(*a);
    auto blocks = [&](int64_t total) {  // a grid-stride loop: at most 1024 blocks of 256
      const int64_t needed = (total + 255) / 256;
      return int(needed < 1 ? 1 : (needed < 1024 ? needed : 1024));
    };
    if (t.sfa_copy) {
      compact_scales<<<blocks(a->total_m * kb), 256, 0, s>>>(sfa, 1, a->total_m, kb, 0, a->scale_a_strides[0],
                                                              a->scale_a_strides[1], t.sfa_copy);
      sfa = t.sfa_copy;
    }
    if (t.sfb_copy) {
      compact_scales<<<blocks(a->groups * nb * kb), 256, 0, s>>>(sfb, a->groups, nb, kb, a->scale_b_strides[0],
                                                                  a->scale_b_strides[1], a->scale_b_strides[2],
                                                                  t.sfb_copy);
      sfb = t.sfb_copy;
      sfb_group_stride = nb * kb;
    }
  }
  build_group_tables<<<int((a->groups + threads - 1) / threads), threads, 0, s>>>(
      t, a->offsets, int(a->groups), a->total_m, int(a->n), int(a->k),
      static_cast<const ElementA*>(a->x), a->ldx, static_cast<const ElementB*>(a->w), a->ldw,
      a->w_group_stride, static_cast<ElementY*>(a->y), a->ldy, sfa, sfb, sfb_group_stride);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) {
    set_reason(why, why_size, cudaGetErrorString(err));
    return EVTC_ERROR_LAUNCH;
  }
  auto args = gemm_arguments(*a, t);
  Gemm gemm;
  cutlass::Status status = gemm.initialize(args, static_cast<char*>(workspace) + table_bytes(*a), s);
  if (status != cutlass::Status::kSuccess) {
    set_reason(why, why_size, cutlassGetStatusString(status));
    return EVTC_ERROR_CANNOT_IMPLEMENT;
  }
  status = gemm.run(s);
  if (status != cutlass::Status::kSuccess) {
    cudaError_t err = cudaGetLastError();
    set_reason(why, why_size, err != cudaSuccess ? cudaGetErrorString(err) : cutlassGetStatusString(status));
    return EVTC_ERROR_LAUNCH;
  }
  return EVTC_OK;
}

}  // extern "C"
)";
  return {s, sig};
}

}  // namespace evtc::sm90
