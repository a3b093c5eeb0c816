// The index leaves `m` and `n` in CUTLASS 3.x epilogues (sm_90a, and the sm90-style visitor trees
// of sm_100a and sm_120a, whose collectives pass coordinates the same way): an EVT leaf that gives each
// element its row index (Axis 0) or its column index (Axis 1) in the whole problem, as a float
// (exact below 2^24; the runtime refuses larger M or N for epilogues that read them).
//
// CUTLASS hands a visitor the coordinates of a thread's elements (ConsumerStoreArgs::tCcD)
// relative to the thread's first element in the tile, and the residue: (M, N) minus that
// first element's coordinates (elements at or past it lie outside the problem; CUTLASS's
// broadcasts and reductions predicate with it). The first element's absolute coordinate is
// therefore (M, N) - residue, and an element's is that plus its relative coordinate
// (evtc/device/sm90_logsumexp.cuh finds its rows the same way). Elements outside the problem
// get indices past its end, which no output stores.
#pragma once

#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "evtc/device/sm90_register_node.cuh"

namespace evtc::device {

template <int Axis>
struct Sm90Index : Sm90RegisterNode {
  static_assert(Axis == 0 || Axis == 1, "Sm90Index: Axis is 0 (the row index m) or 1 (the column index n)");

  struct Arguments {};
  struct Params {};

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const&, void*) {
    return {};
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }

  CUTLASS_HOST_DEVICE Sm90Index() : params{} {}
  CUTLASS_HOST_DEVICE Sm90Index(Params const& params, SharedStorage const&) : params(params) {}

  // Unused, but it keeps the node from being an empty class: cute::tuple stores empty members
  // by value, and the visitors take their ops by reference.
  Params const params;

  template <class CTensor, class ThrResidue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(CTensor coords, int first) : coords(coords), first(first) {}

    CTensor coords;  // (CPY,CPY_M,CPY_N,EPI_M,EPI_N): relative to the thread's first element
    int first;       // the absolute index of the thread's first element along Axis

    template <class ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n) {
      auto c_mn = coords(cute::_, cute::_, cute::_, epi_m, epi_n);
      cutlass::Array<float, FragmentSize> index;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i)
        index[i] = float(first + int(cute::get<Axis>(c_mn(epi_v * FragmentSize + i))));
      return index;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    const int extent = int(cute::get<Axis>(args.problem_shape_mnkl));
    const int first = extent - int(cute::get<Axis>(args.residue_tCcD));
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD)>(args.tCcD, first);
  }
};

}  // namespace evtc::device
