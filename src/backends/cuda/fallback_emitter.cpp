#include "backends/cuda/fallback_emitter.hpp"

#include <fmt/format.h>

#include <cmath>
#include <map>

#include "evtc/error.hpp"
#include "evtc/ir_text.hpp"

namespace evtc::cuda {
namespace {

std::string storage_type(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f16: return "__half";
    case DType::bf16: return "__nv_bfloat16";
    case DType::f8e4m3: return "__nv_fp8_e4m3";
    case DType::f8e5m2: return "__nv_fp8_e5m2";
    case DType::i32: return "int32_t";
    case DType::i64: return "int64_t";
  }
  return "?";
}

std::string literal(double v) {
  if (std::isnan(v)) return "__int_as_float(0x7fffffff)";
  if (std::isinf(v)) return v > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float(0xff800000)";
  return fmt::format("{}f", v == std::floor(v) && std::fabs(v) < 1e15 ? fmt::format("{:.1f}", v)
                                                                      : fmt::format("{}", v));
}

}  // namespace

std::string epilogue_device_code(const Graph& g, const KernelSignature& sig, int parts) {
  std::map<std::string, size_t> ptr_slot, scalar_slot;
  for (size_t i = 0; i < sig.pointers.size(); ++i) ptr_slot[sig.pointers[i].name] = i;
  for (size_t i = 0; i < sig.scalars.size(); ++i) scalar_slot[sig.scalars[i].name] = i;
  const auto order = canonical_order(g);

  // Graphs with gated values (gate()/up() of interleaved column pairs) run one thread per
  // (gate, up) pair: [m,n] values are computed for both columns of the pair ("lanes" 0 and
  // 1, at columns j0 and j1), [m,n/2] values once, at column jh of the half-width output.
  bool gated = false;
  for (const Node& n : g.nodes()) gated |= n.kind == NodeKind::pair;

  std::string body;
  std::string init;
  std::string finish;
  // Whole-matrix reductions accumulate per thread (before: `pre`, in the loop: `body`), then
  // per warp (`post`), and one atomic per warp reaches memory: one address taking an atomic
  // per element serialises the whole epilogue.
  std::string pre;
  std::string post;
  std::string scratch_offset = "0";  // where the next reduction's fp32 accumulator starts
  // How many fp32 accumulators a reduction needs: one per row, per column, or one.
  auto reduction_count = [](const Node& r) -> std::string {
    return r.axis == ReduceAxis::row ? "m" : r.axis == ReduceAxis::col ? "n" : "1";
  };
  // The variable of node `id` as seen from lane `lane` (-1: the half-width part).
  auto var = [&](NodeId id, int lane) {
    if (!gated) return fmt::format("v{}", id);
    if (g.node(id).shape == Shape::half) return fmt::format("v{}", id);
    return fmt::format("v{}_{}", id, lane < 0 ? 0 : lane);  // scalars and [m] agree in lanes
  };
  auto emit_node = [&](NodeId id, int lane) {
    const Node& n = g.node(id);
    const std::string v = var(id, lane);
    const std::string j = !gated ? "j" : lane == 1 ? "j1" : "j0";
    auto in = [&](size_t k) { return var(n.inputs[k], lane); };
    switch (n.kind) {
      case NodeKind::accum:
        body += fmt::format("  const float {} = acc_sum(acc, i * n + {}, part_stride);\n", v, j);
        break;
      case NodeKind::index:  // the element's row i, or its column (of the full-width value)
        body += fmt::format("  const float {} = float({});\n", v, n.index_axis == IndexAxis::m ? "i" : j);
        break;
      case NodeKind::source:
        body += fmt::format("  const float {} = to_float(static_cast<const {}*>(p.c)[i * p.ldc + {}]);\n", v,
                            storage_type(n.dtype), j);
        break;
      case NodeKind::scalar:
        if (n.scalar_kind == ScalarKind::constant)
          body += fmt::format("  const float {} = {};\n", v, literal(n.value));
        else if (n.scalar_kind == ScalarKind::value)
          body += fmt::format("  const float {} = to_float(from_float<{}>(p.scalars[{}]));\n", v,
                              storage_type(n.dtype), scalar_slot.at(n.name));
        else
          body += fmt::format("  const float {} = to_float(*static_cast<const {}*>(p.ptrs[{}]));\n", v,
                              storage_type(n.dtype), ptr_slot.at(n.name));
        break;
      case NodeKind::row_vec:
      case NodeKind::col_vec:
        // An integer operand converts to the nearest float (float(x) rounds to nearest).
        body += fmt::format("  const float {} = {}(static_cast<const {}*>(p.ptrs[{}])[{}]);\n", v,
                            is_integer(n.dtype) ? "float" : "to_float", storage_type(n.dtype),
                            ptr_slot.at(n.name), n.kind == NodeKind::row_vec ? j : "i");
        break;
      case NodeKind::aux:
        body += fmt::format("  const float {} = to_float(static_cast<const {}*>(p.ptrs[{}])[{}]);\n", v,
                            storage_type(n.dtype), ptr_slot.at(n.name),
                            n.layout == Layout::row_major ? "i * n + " + j : j + " * m + i");
        break;
      case NodeKind::compute: {
        const OpInfo& info = op_info(n.op);
        std::string args;
        for (size_t k = 0; k < n.inputs.size(); ++k) args += (k ? ", " : "") + in(k);
        for (int k = 0; k < info.num_attrs; ++k) args += ", " + literal(n.attrs[k]);
        body += fmt::format("  const float {} = evtc::device::{}Fn{{}}({});\n", v, info.cuda_functor, args);
        break;
      }
      case NodeKind::cast:
        body += fmt::format("  const float {} = to_float(from_float<{}>({}));\n", v, storage_type(n.dtype), in(0));
        break;
      case NodeKind::pair:
        body += fmt::format("  const float {} = {};\n", v,
                            var(n.inputs[0], n.part == PairPart::gate ? 0 : 1));
        break;
      case NodeKind::reduce: break;  // done by its store
      case NodeKind::store: {
        const Node& src = g.node(n.inputs[0]);
        if (src.kind == NodeKind::reduce) {
          const size_t slot = ptr_slot.at(n.name);
          const std::string x = var(src.inputs[0], lane);
          const ReduceOpInfo& info = reduce_op_info(src.reduce_op);
          const std::string val = info.of_abs ? "fabsf(" + x + ")" : x;
          const std::string idx = src.axis == ReduceAxis::row ? "i" : src.axis == ReduceAxis::col ? j : "0";
          const bool lse = src.reduce_op == ReduceOp::logsumexp;
          const std::string fn = src.reduce_op == ReduceOp::sum   ? "atomicAdd"
                                 : src.reduce_op == ReduceOp::min ? "atomic_min_float"
                                 : lse                            ? "atomic_log_add_exp"
                                                                  : "atomic_max_float";
          // Accumulate in fp32 scratch, then write the output in its dtype.
          const std::string acc_at = fmt::format("(p.scratch + {})", scratch_offset);
          const std::string identity = literal(info.identity);
          if (src.axis == ReduceAxis::all) {
            const std::string r = fmt::format("red{}", slot);
            auto combine = [&](const std::string& a, const std::string& b2) {
              return src.reduce_op == ReduceOp::sum   ? fmt::format("{} + {}", a, b2)
                     : src.reduce_op == ReduceOp::min ? fmt::format("fminf({}, {})", a, b2)
                     : lse                            ? fmt::format("evtc::device::log_add_exp({}, {})", a, b2)
                                                      : fmt::format("fmaxf({}, {})", a, b2);
            };
            body += fmt::format("  {} = {};\n", r, combine(r, val));
            if (lane != 1) {
              pre += fmt::format("  float {} = {};\n", r, identity);
              post += fmt::format(
                  "  for (int o = 16; o > 0; o /= 2) {0} = {1};\n"
                  "  if ((threadIdx.x & 31) == 0) {2}({3}, {0});\n",
                  r, combine(r, fmt::format("__shfl_xor_sync(0xffffffffu, {}, o)", r)), fn, acc_at);
            }
          } else if (lse && src.axis == ReduceAxis::row) {
            // Consecutive lanes mostly share a row: fold them first, one atomic per row and warp.
            body += fmt::format("  warp_log_add_exp({} + {}, {}, {});\n", acc_at, idx, idx, val);
          } else {
            body += fmt::format("  {}({} + {}, {});\n", fn, acc_at, idx, val);
          }
          if (lane == 1) break;  // lane 0 set up the accumulator
          const std::string count = reduction_count(src);
          init += fmt::format("  for (int64_t t = tid; t < {}; t += stride) {}[t] = {};\n", count, acc_at,
                              identity);
          finish += fmt::format(
              "  for (int64_t t = tid; t < {0}; t += stride) static_cast<{1}*>(p.ptrs[{2}])[t] = "
              "from_float<{1}>({3}[t]);\n",
              count, storage_type(n.dtype), slot, acc_at);
        } else if (n.shape == Shape::half) {
          body += fmt::format("  static_cast<{0}*>(p.ptrs[{1}])[i * (n / 2) + jh] = from_float<{0}>({2});\n",
                              storage_type(n.dtype), ptr_slot.at(n.name), var(n.inputs[0], -1));
        } else if (n.name == sig.d_name) {
          body += fmt::format("  static_cast<{0}*>(p.d)[i * p.ldd + {2}] = from_float<{0}>({1});\n",
                              storage_type(n.dtype), in(0), j);
        } else {
          body += fmt::format("  static_cast<{0}*>(p.ptrs[{1}])[{2}] = from_float<{0}>({3});\n",
                              storage_type(n.dtype), ptr_slot.at(n.name),
                              n.layout == Layout::row_major ? "i * n + " + j : j + " * m + i", in(0));
        }
        break;
      }
    }
  };
  for (NodeId id : order) {
    const Node& n = g.node(id);
    const bool half = n.shape == Shape::half;
    if (!gated) {
      emit_node(id, 0);
    } else if (half) {
      emit_node(id, -1);
    } else {
      emit_node(id, 0);
      emit_node(id, 1);
    }
    const Node& src = n.kind == NodeKind::store ? g.node(n.inputs[0]) : n;
    if (n.kind == NodeKind::store && src.kind == NodeKind::reduce)
      scratch_offset += " + " + reduction_count(src);
  }

  std::string s = "#pragma nv_diag_suppress 177  // helpers this graph does not use\n";
  s += R"(#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "evtc/device/abi.h"
#include "evtc/device/math.cuh"

namespace evtc_plain {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__nv_fp8_e4m3 x) { return float(x); }
__device__ __forceinline__ float to_float(__nv_fp8_e5m2 x) { return float(x); }

template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
// fp8 conversions saturate to the largest finite value, like the fused kernels.
template <> __device__ __forceinline__ __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float x) {
  __nv_fp8_e4m3 r; r.__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); return r;
}
template <> __device__ __forceinline__ __nv_fp8_e5m2 from_float<__nv_fp8_e5m2>(float x) {
  __nv_fp8_e5m2 r; r.__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2); return r;
}

__device__ __forceinline__ void atomic_max_float(float* p, float v) {
  if (!signbit(v)) atomicMax(reinterpret_cast<int*>(p), __float_as_int(v));
  else atomicMin(reinterpret_cast<unsigned int*>(p), __float_as_uint(v));
}
__device__ __forceinline__ void atomic_min_float(float* p, float v) {
  if (!signbit(v)) atomicMin(reinterpret_cast<int*>(p), __float_as_int(v));
  else atomicMax(reinterpret_cast<unsigned int*>(p), __float_as_uint(v));
}
// *p = log(e^*p + e^v), atomically (a compare-and-swap loop).
__device__ __forceinline__ void atomic_log_add_exp(float* p, float v) {
  unsigned int* bits = reinterpret_cast<unsigned int*>(p);
  unsigned int seen = *bits, assumed;
  do {
    assumed = seen;
    const unsigned int next = __float_as_uint(evtc::device::log_add_exp(__uint_as_float(assumed), v));
    if (next == assumed) return;
    seen = atomicCAS(bits, assumed, next);
  } while (seen != assumed);
}
// atomic_log_add_exp(p, v), the converged lanes with the same key (the same p) folding their
// values first, in lane order, and the first of them taking the atomic.
__device__ __forceinline__ void warp_log_add_exp(float* p, int64_t key, float v) {
  const unsigned int peers = __match_any_sync(__activemask(), static_cast<unsigned long long>(key));
  float folded = v;
  for (unsigned int rest = peers & (peers - 1); rest != 0; rest &= rest - 1)  // the others, in lane order
    folded = evtc::device::log_add_exp(folded, __shfl_sync(peers, v, __ffs(rest) - 1));
  if ((threadIdx.x & 31) == __ffs(peers) - 1) atomic_log_add_exp(p, folded);
}

)";
  s += fmt::format(R"(// The product's element e, as the sum of {} fp32 partial products `stride` apart: every load
// issued first, then added in order (one part: the product itself).
constexpr int kAccParts = {};
)",
                   parts, parts);
  s += R"(__device__ __forceinline__ float acc_sum(const float* __restrict__ acc, int64_t e, int64_t stride) {
  float part[kAccParts];
#pragma unroll
  for (int l = 0; l < kAccParts; ++l) part[l] = acc[e + l * stride];
  float s = part[0];
#pragma unroll
  for (int l = 1; l < kAccParts; ++l) s += part[l];
  return s;
}

)";
  s += fmt::format(R"(constexpr bool kHasReductions = {};
constexpr int kNumPtrs = {};
constexpr int kNumScalars = {};
)",
                   init.empty() ? "false" : "true", sig.pointers.size(), sig.scalars.size());
  s += R"(
// Kernel parameters: the ABI's pointer and scalar tables copied by value (the ABI's arrays
// live in host memory).
struct Params {
  int64_t m, n, ldc, ldd;
  const void* c;
  void* d;
  void* ptrs[kNumPtrs > 0 ? kNumPtrs : 1];
  float* scratch;  // fp32 accumulators of the reductions
  float scalars[kNumScalars > 0 ? kNumScalars : 1];
};

// The fp32 accumulators the reductions need for an m×n problem.
inline size_t scratch_floats(int64_t m, int64_t n) {
  (void)m; (void)n;
)";
  s += fmt::format("  return size_t({});\n}}\n\n", scratch_offset);
  s += R"(// The kernels, with C names: a library compiled in two parts finds them in its cubin.
#if !defined(EVTC_PART) || EVTC_PART != 2
)";
  // The two small reduction kernels: a grid-stride loop over each reduction's elements.
  auto grid_stride_kernel = [](const char* name, const std::string& statements) {
    return fmt::format(R"(extern "C" __global__ void {}(Params p) {{
  const int64_t m = p.m, n = p.n;
  (void)m; (void)n;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  (void)tid; (void)stride;
{}}}

)",
                       name, statements);
  };
  s += grid_stride_kernel("evtc_plain_init_reductions", init);
  s += grid_stride_kernel("evtc_plain_finish_reductions", finish);
  // acc: kAccParts m×n row-major fp32 products part_stride floats apart, summed (one: the
  // product). Launched as a programmatic dependent of the GEMM that writes them (Hopper and
  // later), it waits for that grid's results before reading them; otherwise the wait is a no-op.
  s += fmt::format(R"(extern "C" __global__ void evtc_plain_epilogue(Params p, const float* __restrict__ acc,
                                         int64_t part_stride) {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const int64_t m = p.m, n = p.n;
  const int64_t total = m * {};
{}  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {{
{}
)", gated ? "(n / 2)" : "n", pre,
                   gated ? "    const int64_t i = e / (n / 2), jh = e % (n / 2), j0 = 2 * jh, j1 = j0 + 1;\n"
                           "    (void)i; (void)jh; (void)j0; (void)j1;"
                         : "    const int64_t i = e / n, j = e % n;\n    (void)i; (void)j;");
  // Indent the body one more level.
  std::string indented;
  size_t b = 0;
  while (b < body.size()) {
    size_t e = body.find('\n', b);
    indented += "  " + body.substr(b, e - b) + "\n";
    b = e + 1;
  }
  s += indented;
  s += "  }\n" + post + "}\n";
  s += R"(#endif

// Launches: `blocks` of `threads` for the epilogue over an m×n problem (a grid-stride loop).
inline int epilogue_blocks(int64_t m, int64_t n, int threads, int sms) {
  const int64_t total = m * n;  // (half as many threads for gated epilogues: enough)
  int64_t blocks = (total + threads - 1) / threads;
  if (blocks > int64_t(sms) * 32) blocks = int64_t(sms) * 32;
  return blocks < 1 ? 1 : int(blocks);
}

// The ABI's arguments as the kernels' parameters.
inline Params params_of(const evtc_gemm_args& a, int64_t m, int64_t n, float* scratch) {
  Params p{};
  p.m = m;
  p.n = n;
  p.ldc = a.ldc;
  p.ldd = a.ldd;
  p.c = a.c;
  p.d = a.d;
  for (int i = 0; i < kNumPtrs; ++i) p.ptrs[i] = a.ptrs[i];
  for (int i = 0; i < kNumScalars; ++i) p.scalars[i] = float(a.scalars[i]);
  p.scratch = scratch;
  return p;
}

}  // namespace evtc_plain
)";
  return s;
}

std::string emit_fallback_kernel(const Graph& g, const KernelSignature& sig, const GemmDesc* gemm) {
  std::string s = fmt::format("// Generated by evtc {}: plain CUDA epilogue (fallback path).\n// Graph hash {}.\n",
                              EVTC_VERSION, graph_hash_hex(g));
  s += epilogue_device_code(g, sig, 1);
  s += R"(
extern "C" {

int evtc_abi_version(void) { return EVTC_ABI_VERSION; }

)";
  s += sig.c_export();
  s += R"(
size_t evtc_fallback_scratch_floats(int64_t m, int64_t n) { return evtc_plain::scratch_floats(m, n); }

int evtc_fallback_run(const evtc_gemm_args* a, const float* acc, float* scratch, void* stream) {
  using namespace evtc_plain;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int threads = 256;
  const Params p = params_of(*a, a->m, a->n, scratch);
  if (kHasReductions) evtc_plain_init_reductions<<<sms, threads, 0, s>>>(p);
  evtc_plain_epilogue<<<epilogue_blocks(a->m, a->n, threads, sms), threads, 0, s>>>(p, acc, 0);
  if (kHasReductions) evtc_plain_finish_reductions<<<sms, threads, 0, s>>>(p);
  return cudaGetLastError() == cudaSuccess ? EVTC_OK : EVTC_ERROR_LAUNCH;
}

}  // extern "C"
)";
  if (gemm && gemm->fp8_blockwise) {
    // One thread per element: the operands are read once, and this path is the slow one.
    s += fmt::format(R"(
namespace {{

// x (rows×k, row-major with leading dimension ld) times its block scale, in fp32. Row r's K
// block kb has scale s[(r / rows_per_block) * row_stride + kb * k_stride] (A: one per row; B:
// per 128 rows).
template <typename T>
__global__ void scale_operand(const T* __restrict__ x, int64_t rows, int64_t k, int64_t ld,
                              const float* __restrict__ scale, int64_t rows_per_block, int64_t row_stride,
                              int64_t k_stride, float* __restrict__ out) {{
  const int64_t total = rows * k;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {{
    const int64_t r = e / k, l = e % k;
    out[e] = float(x[r * ld + l]) * scale[(r / rows_per_block) * row_stride + (l / {0}) * k_stride];
  }}
}}

}}  // namespace

extern "C" int evtc_fallback_scale_operands(const evtc_gemm_args* a, float* a32, float* b32, void* stream) {{
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int threads = 256;
  auto blocks = [&](int64_t total) {{  // a grid-stride loop: at most 8 × 65535 blocks
    const int64_t needed = (total + threads - 1) / threads;
    return int(needed < 65535 * 8 ? needed : 65535 * 8);
  }};
  scale_operand<<<blocks(a->m * a->k), threads, 0, s>>>(static_cast<const {1}*>(a->a), a->m, a->k, a->lda,
      static_cast<const float*>(a->scale_a), 1, a->scale_a_m_stride, a->ld_scale_a, a32);
  scale_operand<<<blocks(a->n * a->k), threads, 0, s>>>(static_cast<const {2}*>(a->b), a->n, a->k, a->ldb,
      static_cast<const float*>(a->scale_b), {0}, a->scale_b_n_stride, a->scale_b_k_stride, b32);
  return cudaGetLastError() == cudaSuccess ? EVTC_OK : EVTC_ERROR_LAUNCH;
}}
)",
                     kFp8ScaleBlock, storage_type(gemm->a_dtype), storage_type(gemm->b_dtype));
  }
  return s;
}

}  // namespace evtc::cuda
