// evtc's sm90 fp8 main loop with two-level accumulation whose promotions overlap the tensor cores.
//
// Hopper's fp8 tensor cores add their products with fewer bits than fp32, so the two-level main
// loop (CUTLASS's MainloopSm90TmaGmmaWarpSpecializedFP8) lets them accumulate one K tile of 128
// into a temporary set of registers and then adds ("promotes") that set into the fp32
// accumulators. CUTLASS's loop has a single temporary set: before it can add it, it waits for
// every WGMMA in flight (warpgroup_wait<0>), so the tensor cores idle while the adds run and the
// next K tile's WGMMAs are issued. In a cooperative 128x128 tile both warp groups stall at the same
// point (Nsight Compute on the H200 at 4096^3: issue efficiency 68 % against cuBLASLt's 80 %).
//
// Sm90Fp8OverlappedPromotion keeps two temporary sets. K tile i+1's WGMMAs are issued into one set
// before K tile i's set is added, so the adds run while the tensor cores work (warpgroup_wait<1>
// leaves one batch in flight). The sums are formed in the same order as CUTLASS's loop at a
// promotion interval of one K tile (acc = 0 + p0, then acc += p1, ...), so the results are the
// same bits. It costs one more accumulator set of registers: a cooperative 128x128 or ping-pong
// 64x128 tile holds 3 x 64 floats a thread.
//
// Everything but the consumer's main loop (the producer's loads, the pipeline, the parameters and
// shared storage) is the base collective's, so the kernel is otherwise CUTLASS's own.
#pragma once

#include "cute/tensor.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cutlass/cutlass.h"

namespace evtc::device {

template <class Built>
struct Sm90Fp8OverlappedPromotion : Built {
  using Base = Built;
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "the accumulators must be in registers");
    static_assert(rank(SmemLayoutA{}) == 3 && rank(SmemLayoutB{}) == 3, "A and B stages must be rank 3");

    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N,BLK_K,PIPE)
    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    const auto group_threads = make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(group_threads(group));
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA,MMA_M,MMA_K,PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA,MMA_N,MMA_K,PIPE)

    Tensor part0 = make_fragment_like(accum);
    Tensor part1 = make_fragment_like(accum);
    clear(accum);
    if (k_tile_count <= 0) return;

    // One K tile's WGMMAs into `part`, which they overwrite (the first with ScaleOut::Zero).
    auto issue = [&](auto& part, int stage) {
      warpgroup_fence_operand(part);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), part);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      // No fence on `part` here: an instruction that touches its registers before the batch is
      // waited for makes ptxas serialize every WGMMA (C7514), which undoes the overlap.
    };
    auto promote = [&](auto& part) {
      warpgroup_fence_operand(part);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) += part(i);
      // Pins the adds here, before the next K tile's WGMMAs are issued: left free, the compiler
      // moves them past that issue, where they would read registers of a batch in flight.
      warpgroup_fence_operand(accum);
    };
    PipelineState smem_pipe_release = smem_pipe_read;
    // The next K tile into `next` while `done`'s batch finishes; then `done` is added and its
    // shared-memory stage released. One batch stays in flight, as CUTLASS's loop leaves one.
    auto step = [&](auto& next, auto& done) {
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
      issue(next, smem_pipe_read.index());
      warpgroup_wait<1>();
      promote(done);
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_read;
      ++smem_pipe_release;
    };

    warpgroup_fence_operand(accum);
    pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
    issue(part0, smem_pipe_read.index());
    ++smem_pipe_read;
    --k_tile_count;
    // Two K tiles a trip, so that which set is in flight is known at compile time.
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count >= 2; k_tile_count -= 2) {
      step(part1, part0);
      step(part0, part1);
    }
    if (k_tile_count == 1) {
      step(part1, part0);
      warpgroup_wait<0>();
      promote(part1);
    } else {
      warpgroup_wait<0>();
      promote(part0);
    }
    // The last K tile's stage is released by mma_tail, as for CUTLASS's loop (K_PIPE_MMAS = 1).
    warpgroup_fence_operand(accum);
  }
};

}  // namespace evtc::device
