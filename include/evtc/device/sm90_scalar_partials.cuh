// An Sm90 epilogue visitor node for whole-matrix reductions (sum, max, min of an [m,n]
// value into one scalar).
//
// CUTLASS's Sm90ScalarReduction issues one global atomic per thread per tile on a single
// address (contended, and its float sums are not reproducible); going through a row
// reduction instead pays for a shared-memory reduction and a tile counter per tile. This node
// does neither: each thread folds the elements it visits into one register; when the tile
// ends, each warp reduces its lanes with shuffles and lane 0 writes the warp's partial to its
// own slot of a workspace array,
//
//   partials[((tile_n * tiles_m) + tile_m) * warps_per_tile + warp],
//
// so every slot is written exactly once by exactly one warp and nothing contends. A second
// kernel (reduce_partials in reduce.cuh) folds the slots in a fixed order: the result is the
// same bits on every run.
#pragma once

#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "evtc/device/reduce.cuh"
#include "evtc/device/sm90_register_node.cuh"

namespace evtc::device {

template <class ReduceOp, class CtaTileShapeMNK>
struct Sm90ScalarPartials : Sm90RegisterNode {
  struct Arguments {
    // tiles_m * tiles_n * (MMA threads / 32) floats in evtc's own scratch, after CUTLASS's
    // (unused) workspace; the generated host code sizes it
    float* partials = nullptr;
    float identity = 0.0f;
  };

  struct Params {
    float* partials = nullptr;
    float identity = 0.0f;
    int tiles_m = 0;
    int tiles_n = 0;
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem_shape,
                                                  Arguments const& args, void*) {
    auto mnkl = cute::append<4>(problem_shape, 1);
    constexpr int kTileM = cute::size<0>(CtaTileShapeMNK{});
    constexpr int kTileN = cute::size<1>(CtaTileShapeMNK{});
    const int m = int(cute::get<0>(mnkl)), n = int(cute::get<1>(mnkl));
    return {args.partials, args.identity, (m + kTileM - 1) / kTileM, (n + kTileN - 1) / kTileN};
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }

  CUTLASS_HOST_DEVICE Sm90ScalarPartials() {}
  CUTLASS_HOST_DEVICE Sm90ScalarPartials(Params const& params, SharedStorage const&)
      : params(params) {}

  Params const params;

  template <class CTensor, class ThrResidue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(CTensor coords, ThrResidue residue, int slot,
                                          Params const& params)
        : value(params.identity), coords(coords), residue(residue), slot(slot), params(params) {}

    float value;
    CTensor coords;      // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) coordinates of this thread's elements
    ThrResidue residue;  // elements at or past it lie outside the problem
    int slot;            // this warp's partial; negative for a tile outside the problem
    Params params;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v,
                              int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const& input) {
      auto coords_mn = coords(cute::_, cute::_, cute::_, epi_m, epi_n);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i)
        if (cute::elem_less(coords_mn(epi_v * FragmentSize + i), residue))
          value = ReduceOp{}(value, float(input[i]));
      return input;
    }

    CUTLASS_DEVICE void end() {
      CUTLASS_PRAGMA_UNROLL
      for (int offset = 16; offset > 0; offset /= 2)
        value = ReduceOp{}(value, __shfl_xor_sync(0xffffffffu, value, offset));
      if (slot >= 0 && threadIdx.x % 32 == 0) params.partials[slot] = value;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    // The epilogue's threads are those of the tiled copy that hands it the accumulators
    // (Hopper: the MMA's threads; sm_100a: the warps that read tensor memory); thread_idx
    // counts from 0 within them.
    constexpr int kWarps = decltype(args.tiled_copy)::TiledNumThr::value / 32;
    const int tile_m = int(cute::get<0>(args.tile_coord_mnkl));
    const int tile_n = int(cute::get<1>(args.tile_coord_mnkl));
    // A cluster may hold a CTA whose tile lies wholly outside the problem: it writes nothing.
    const bool inside = tile_m < params.tiles_m && tile_n < params.tiles_n;
    const int slot =
        inside ? (tile_n * params.tiles_m + tile_m) * kWarps + args.thread_idx / 32 : -1;
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD)>(
        args.tCcD, args.residue_tCcD, slot, params);
  }
};

}  // namespace evtc::device
