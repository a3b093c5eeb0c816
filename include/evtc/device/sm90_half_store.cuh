// Gated epilogues on Sm90: the (gate, up) column pairs of the accumulator tile become one
// output column each, so the kernel writes an M×N/2 result from an M×N product.
//
// The weights are laid out so that gate and up columns alternate (gate in column 2j, up in
// column 2j+1; evtc::interleave_gate_up builds that layout from stacked [W_gate; W_up]).
// In the Hopper wgmma accumulator layout every thread holds adjacent column pairs in
// adjacent registers, and the epilogue visits them in fragments of an even number of
// elements starting at a pair's first column, so both halves of a pair meet in one fragment
// of one thread and no data moves between threads.
//
// Three pieces, all ordinary EVT nodes:
//  - PairGate / PairUp (Sm90Compute functors): element i of the result is the pair's gate
//    (resp. up) value, for both elements of the pair. Everything downstream (the gated
//    activation, scalings, casts) is ordinary elementwise EVT compute over full-size
//    fragments in which both elements of a pair carry the same value.
//  - Sm90HalfStore: writes the value of each pair once, at output column n/2, straight from
//    registers to global memory (no shared-memory staging: a half-width tile does not match
//    the collective's TMA box), masked by the problem's residue. In a grouped (ptr-array)
//    GEMM it writes each group's rows through a per-group pointer table indexed by the
//    tile's L coordinate (the group), the problem shape and residue being the group's.
#pragma once

#include <cutlass/array.h>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>
#include <cutlass/numeric_conversion.h>

#include "evtc/device/sm90_register_node.cuh"

namespace evtc::device {

// Element i of the result is element (i & ~1) + Part of x: the pair's gate (Part 0) or up
// (Part 1) value, in both elements of the pair.
template <int Part, class T>
struct PairPart;
template <int Part, class E, int N>
struct PairPart<Part, cutlass::Array<E, N>> {
  static_assert(N % 2 == 0, "a gated epilogue needs fragments of whole (gate, up) pairs");
  CUTLASS_HOST_DEVICE cutlass::Array<E, N> operator()(cutlass::Array<E, N> const& x) const {
    cutlass::Array<E, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = x[(i & ~1) + Part];
    return y;
  }
};
template <class T>
using PairGate = PairPart<0, T>;
template <class T>
using PairUp = PairPart<1, T>;

// Stores a gated value (equal in both elements of each pair) as a row-major M×(N/2)
// matrix: the element at accumulator column n (even) goes to output column n/2.
template <class ElementOutput, cutlass::FloatRoundStyle RoundStyle>
struct Sm90HalfStore : Sm90RegisterNode {
  struct Arguments {
    ElementOutput* ptr = nullptr;
    int64_t ld = 0;  // elements between output rows (N/2 for a packed output)
    // Grouped GEMMs: group g's output starts at group_ptr[g] (row 0 of the group), g being
    // the tile's L coordinate; null: every tile writes relative to `ptr`.
    ElementOutput* const* group_ptr = nullptr;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args,
                                                  void*) {
    return args;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto mnkl = cute::append<4>(problem_shape, 1);
    const int64_t n = int64_t(cute::get<1>(mnkl));
    return n % 2 == 0 && args.ld >= n / 2;
  }

  CUTLASS_HOST_DEVICE Sm90HalfStore() {}
  CUTLASS_HOST_DEVICE Sm90HalfStore(Params const& params, SharedStorage const&) : params(params) {}

  Params const params;

  template <class CTensor, class ThrResidue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(CTensor coords, ThrResidue residue, int64_t row0,
                                          int64_t col0, ElementOutput* base, int64_t ld)
        : coords(coords), residue(residue), row0(row0), col0(col0), base(base), ld(ld) {}

    CTensor coords;      // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) coordinates relative to this thread's
                         // first element
    ThrResidue residue;  // elements at or past it lie outside the problem
    int64_t row0, col0;  // coordinates of this thread's first element in its problem (group)
    ElementOutput* base;  // the problem's (group's) output
    int64_t ld;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v,
                              int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const& input) {
      static_assert(FragmentSize % 2 == 0, "a gated epilogue needs whole (gate, up) pairs");
      cutlass::NumericConverter<ElementOutput, ElementInput, RoundStyle> convert;
      auto coords_mn = coords(cute::_, cute::_, cute::_, epi_m, epi_n);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; i += 2) {
        auto c = coords_mn(epi_v * FragmentSize + i);
        if (!cute::elem_less(c, residue)) continue;
        const int64_t m = row0 + int64_t(cute::get<0>(c));
        const int64_t n = col0 + int64_t(cute::get<1>(c));
        base[m * ld + n / 2] = convert(input[i]);
      }
      return input;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    // residue = (M, N) - (the thread's first element), so the first element is (M, N) - residue.
    const int64_t m = int64_t(cute::get<0>(args.problem_shape_mnkl));
    const int64_t n = int64_t(cute::get<1>(args.problem_shape_mnkl));
    const int64_t row0 = m - int64_t(cute::get<0>(args.residue_tCcD));
    const int64_t col0 = n - int64_t(cute::get<1>(args.residue_tCcD));
    ElementOutput* base = params.ptr;
    if (params.group_ptr) base = params.group_ptr[cute::get<3>(args.tile_coord_mnkl)];
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD)>(
        args.tCcD, args.residue_tCcD, row0, col0, base, params.ld);
  }
};

}  // namespace evtc::device
