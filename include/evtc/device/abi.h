/* The C ABI between evtc's runtime and a generated kernel library (kernel.so).
 *
 * Every generated library exports the functions below. Operands are passed through one
 * flat table: `ptrs[i]` is the device pointer of slot i and `scalars[i]` the value of
 * scalar slot i, in the order the library's signature (evtc_kernel_signature, JSON)
 * lists them. The runtime fills the tables by operand name; the generated code builds
 * CUTLASS's nested epilogue arguments from them. */
#ifndef EVTC_DEVICE_ABI_H
#define EVTC_DEVICE_ABI_H

#include <stddef.h>
#include <stdint.h>

#define EVTC_ABI_VERSION 4

#ifdef __cplusplus
extern "C" {
#endif

typedef struct evtc_gemm_args {
  int64_t m, n, k;
  const void* a; /* M×K */
  const void* b; /* K×N */
  const void* c; /* M×N source, or NULL when the epilogue does not read C */
  void* d;       /* M×N main output, or NULL when the epilogue has none */
  int64_t lda, ldb, ldc, ldd; /* leading dimensions, in elements */
  void* const* ptrs;          /* pointer slots */
  const double* scalars;      /* scalar slots */
  int sm_count;               /* multiprocessors to use; 0 = all of the current device */
  /* The persistent tile scheduler's visiting order (run-time choices, no recompile):
   * raster 0 = CUTLASS's heuristic, 1 = along M, 2 = along N; swizzle = the width of the
   * strips tiles are visited in (1, 2, 4 or 8; 0 = 1). */
  int raster;
  int swizzle;
  /* fp8 block scales (GemmDesc::fp8_blockwise), f32; NULL otherwise. scale_a: A's M × ceil(K/128)
   * scales, scale_a[m * scale_a_m_stride + kb * ld_scale_a]; scale_b: B's ceil(K/128) × ceil(N/128)
   * block scales, scale_b[kb * scale_b_k_stride + nb * scale_b_n_stride]. Fused kernels take
   * scale_a with M adjacent (scale_a_m_stride 1) and scale_b row-major (strides ceil(N/128), 1);
   * the unfused path takes any strides. */
  const void* scale_a;
  const void* scale_b;
  int64_t ld_scale_a;
  int64_t scale_a_m_stride, scale_b_k_stride, scale_b_n_stride;
} evtc_gemm_args;

/* Status codes of evtc_can_implement and evtc_run. */
#define EVTC_OK 0
#define EVTC_ERROR_CANNOT_IMPLEMENT 1
#define EVTC_ERROR_LAUNCH 2

typedef int (*evtc_abi_version_fn)(void);
typedef const char* (*evtc_kernel_signature_fn)(void);
typedef int (*evtc_can_implement_fn)(const evtc_gemm_args* args, char* why, size_t why_size);
typedef size_t (*evtc_workspace_size_fn)(const evtc_gemm_args* args);
typedef int (*evtc_run_fn)(const evtc_gemm_args* args, void* workspace, void* stream, char* why,
                           size_t why_size);

#ifdef __cplusplus
}
#endif

#endif /* EVTC_DEVICE_ABI_H */
