/* The C ABI of a generated grouped-GEMM kernel library (evtc::GroupedKernel).
 *
 * One launch computes, for every group g of a token matrix X split by end offsets,
 *   Y[start_g:end_g, :] = epilogue(X[start_g:end_g, :] @ W_g^T, ...)
 * with start_g = offsets[g-1] (0 for g = 0) and end_g = offsets[g], as torch._grouped_mm
 * takes them (a gated epilogue writes N/2 columns: Y[start_g:end_g, :N/2]). The offsets live on the device: a small kernel of the library turns them into
 * CUTLASS's per-group problem shapes, pointers and strides in the workspace, so a launch
 * needs no host synchronisation (it can be captured in a CUDA graph and replayed with other
 * offsets). Offsets are clamped to [0, total_m] and a decreasing offset makes an empty group.
 *
 * Besides evtc_abi_version and evtc_kernel_signature (abi.h), the library exports the
 * functions below. `ptrs`/`scalars` follow the signature's slot order, as in abi.h;
 * group_strides[i] is the number of elements between group g's and group g+1's data of
 * pointer slot i (per-group row vectors: the bias row stride; per-group scalars: 1; 0: one
 * value shared by all groups). */
#ifndef EVTC_DEVICE_GROUPED_ABI_H
#define EVTC_DEVICE_GROUPED_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct evtc_grouped_args {
  int64_t groups;          /* G */
  int64_t total_m;         /* rows of X and Y: the capacity the offsets index into */
  int64_t n, k;
  const void* x;           /* total_m × K, row-major, leading dimension ldx */
  const void* w;           /* G weights: N×K (K-major) or K×N, as compiled */
  const int32_t* offsets;  /* G end offsets, device memory */
  void* y;                 /* total_m × N main output, row-major, leading dimension ldy; for a
                              gated epilogue total_m × N/2, also in its pointer slot */
  int64_t ldx, ldw, w_group_stride, ldy; /* in elements */
  void* const* ptrs;       /* pointer slots */
  const double* scalars;   /* scalar slots */
  const int64_t* group_strides; /* per pointer slot */
  int sm_count;            /* multiprocessors to use; 0 = all of the current device */
  /* fp8 block scales (block-scaled kernels; NULL otherwise), f32, any strides in elements:
   * scale_a is total_m × ceil(K/128), scale_a[r * s[0] + kb * s[1]]; scale_b is
   * G × ceil(N/128) × ceil(K/128), scale_b[g * s[0] + nb * s[1] + kb * s[2]]. The kernel reads
   * scale_a with strides (ceil(K/128), 1) and scale_b with (·, ceil(K/128), 1) in place; other
   * strides are first copied into that layout in the workspace. */
  const float* scale_a;
  int64_t scale_a_strides[2];
  const float* scale_b;
  int64_t scale_b_strides[3];
} evtc_grouped_args;

typedef int (*evtc_grouped_can_implement_fn)(const evtc_grouped_args* args, char* why,
                                             size_t why_size);
typedef size_t (*evtc_grouped_workspace_size_fn)(const evtc_grouped_args* args);
typedef int (*evtc_grouped_run_fn)(const evtc_grouped_args* args, void* workspace, void* stream,
                                   char* why, size_t why_size);

#ifdef __cplusplus
}
#endif

#endif /* EVTC_DEVICE_GROUPED_ABI_H */
