// Row logsumexp in CUTLASS 3.x epilogues (sm_90a, and sm_100a's sm90-style visitor tree): an
// EVT node that folds each row of a CTA tile into a pair (m, s) standing for m + log(s), and
// writes one pair per row and tile to evtc's scratch; finish_reductions folds a row's pairs
// in tile order and writes m + log(s) (reduce_lse_pair_rows in reduce.cuh).
//
// Per element x, a thread's register pair for x's row takes s += e^(x - m): one exp, and the
// exps of a fragment independent of each other. m moves (and s is rescaled) only when an
// element exceeds it by more than kRescaleAbove, in a separate pass that the warp takes
// together and rarely; no branch per element. (CUTLASS's column-reduction visitor folds each
// element through its reduction op: a chain of an exp and a log per element for this
// reduction, which made the GEMM 1.25-1.35x cuBLAS's time at 8192 x 32000 x 4096 on an H100;
// this node: 1.03x.)
//  - s stays below e^kRescaleAbove per element folded: far from f32's range;
//  - -inf adds 0 (or 1 to a pair whose m is -inf, whose value stays -inf); +inf sets m to
//    +inf and the value to +inf; a NaN makes s NaN, and NaN stays through every fold.
#pragma once

#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

#include "evtc/device/reduce.cuh"
#include "evtc/device/sm90_register_node.cuh"

namespace evtc::device {

template <class CtaTileShapeMNK>
struct Sm90RowLsePartials : Sm90RegisterNode {
  static constexpr float kRescaleAbove = 32.0f;

  struct Arguments {
    // (m, s) pairs: tiles_n rows of the padded M (tiles_m * TileM), in evtc's own scratch
    float* partials = nullptr;
  };
  struct Params {
    LsePair* partials = nullptr;
    int tiles_m = 0, tiles_n = 0;
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void*) {
    auto mnkl = cute::append<4>(problem_shape, 1);
    constexpr int kTileM = cute::size<0>(CtaTileShapeMNK{});
    constexpr int kTileN = cute::size<1>(CtaTileShapeMNK{});
    const int m = int(cute::get<0>(mnkl)), n = int(cute::get<1>(mnkl));
    return {reinterpret_cast<LsePair*>(args.partials), (m + kTileM - 1) / kTileM, (n + kTileN - 1) / kTileN};
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }

  CUTLASS_HOST_DEVICE Sm90RowLsePartials() {}
  CUTLASS_HOST_DEVICE Sm90RowLsePartials(Params const& params, SharedStorage const&) : params(params) {}

  Params const params;

  template <class RegTensor, class CTensor, class ThrResidue, class LaneLayout, class LaneCoord>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(RegTensor m, RegTensor s, CTensor coords, ThrResidue residue,
                                          LaneLayout lane_layout, LaneCoord lane_mn, LsePair* out, int rows)
        : m(m), s(s), coords(coords), residue(residue), lane_layout(lane_layout), lane_mn(lane_mn), out(out),
          rows(rows) {}

    RegTensor m, s;       // (CPY,CPY_M,CPY_N,EPI_M,EPI_N), stride 0 along N: one pair per row
    CTensor coords;       // coordinates of this thread's elements relative to its first one
    ThrResidue residue;   // elements at or past it lie outside the problem: (M, N) minus the
                          // thread's first element's coordinates
    LaneLayout lane_layout;
    LaneCoord lane_mn;
    LsePair* out;         // this tile's row of partials; null for a tile outside the problem
    int rows;             // rows of the problem

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m,
                              int epi_n, cutlass::Array<ElementInput, FragmentSize> const& input) {
      auto m_mn = m(cute::_, cute::_, cute::_, epi_m, epi_n);
      auto s_mn = s(cute::_, cute::_, cute::_, epi_m, epi_n);
      auto c_mn = coords(cute::_, cute::_, cute::_, epi_m, epi_n);
      // Elements outside the problem enter as -inf (they add nothing): no branch per element.
      float x[FragmentSize];
      bool moves = false;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        const int idx = epi_v * FragmentSize + i;
        x[i] = cute::elem_less(c_mn(idx), residue) ? float(input[i]) : -__builtin_inff();
        moves |= x[i] > m_mn(idx) + kRescaleAbove;
      }
      // Rarely (a row's first elements, or a much larger one), some row's m moves first, the
      // warp together; then every element adds e^(x - m) with its row's m fixed: the exps are
      // independent of each other.
      if (__any_sync(0xffffffffu, moves)) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) {
          const int idx = epi_v * FragmentSize + i;
          float& row_m = m_mn(idx);
          const float moved = x[i] > row_m + kRescaleAbove ? x[i] : row_m;
          s_mn(idx) *= fast_exp(moved == row_m ? 0.0f : row_m - moved);
          row_m = moved;
        }
      }
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        const int idx = epi_v * FragmentSize + i;
        const float row_m = m_mn(idx);
        s_mn(idx) += fast_exp(x[i] == row_m ? 0.0f : x[i] - row_m);  // x == m: also +inf == +inf
      }
      return input;
    }

    CUTLASS_DEVICE void end() {
      // The lanes that hold parts of the same rows fold their pairs (as CUTLASS's column
      // reduction shuffles): one lane per row ends with the tile's pair.
      auto m_frg = cute::filter(m);
      auto s_frg = cute::filter(s);
      CUTLASS_PRAGMA_UNROLL
      for (int cols = cute::size<1>(lane_layout) / 2; cols > 0; cols /= 2) {
        const int offset = lane_layout(cute::_0{}, cols);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < cute::size(m_frg); ++i) {
          const LsePair other{__shfl_down_sync(0xffffffffu, m_frg(i), offset),
                              __shfl_down_sync(0xffffffffu, s_frg(i), offset)};
          const LsePair folded = lse_pair_fold({m_frg(i), s_frg(i)}, other);
          m_frg(i) = folded.m;
          s_frg(i) = folded.s;
        }
      }
      if (out == nullptr || cute::get<1>(lane_mn) != 0) return;
      // One store per row: the register tensor without its stride-0 modes, and the
      // coordinates of the first element of each.
      auto m_rows = cute::filter_zeros(m);
      auto s_rows = cute::filter_zeros(s);
      auto c_rows = cute::make_tensor(coords.data(), cute::make_layout(m_rows.shape(), coords.stride()));
      const int first_row = rows - int(cute::get<0>(residue));
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < cute::size(m_rows); ++i) {
        const int row = first_row + int(cute::get<0>(c_rows(i)));
        if (row < rows) out[row] = LsePair{m_rows(i), s_rows(i)};
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    // Which lanes share a row (CUTLASS's column reduction's construction).
    Layout ref_layout_MN = [&]() {
      auto mn_shape = shape(typename decltype(args.tiled_copy)::Tiler_MN{});
      if constexpr (ReferenceSrc) return right_inverse(args.tiled_copy.get_layoutS_TV()).with_shape(mn_shape);
      else return right_inverse(args.tiled_copy.get_layoutD_TV()).with_shape(mn_shape);
    }();
    using W = Int<decltype(args.tiled_copy)::TiledNumThr::value / 32>;
    Layout tv2lane = Layout<Shape<_32, W, _1>, Stride<_1, _0, _0>>{};
    Layout ref2lane = composition(tv2lane, ref_layout_MN);
    Layout lane_layout_MN = make_layout(filter(get<0>(ref2lane)), filter(get<1>(ref2lane)));
    Layout inv_lane_layout_MN = right_inverse(lane_layout_MN);
    auto lane_mn = idx2crd(inv_lane_layout_MN(cutlass::canonical_lane_idx()), shape(lane_layout_MN));
    // The rows' warps: evtc's row partials assume each row lies within one warp (Hopper's
    // warpgroup MMAs stack their warps along M).
    Layout tv2warp = Layout<Shape<_32, W, _1>, Stride<_0, _1, _0>>{};
    Layout ref2warp = composition(tv2warp, ref_layout_MN);
    static_assert(decltype(size(filter(get<1>(ref2warp))))::value == 1,
                  "row logsumexp partials need every row of a tile within one warp");

    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [tile_m, tile_n, k, l] = args.tile_coord_mnkl;
    // A register per row: a row-broadcast layout (stride 0 along N) partitioned like the tile.
    Tensor mRow = make_tensor(make_gmem_ptr<float>(nullptr), make_shape(M, N, L), Stride<_1, _0, _0>{});
    Tensor gRow = local_tile(mRow, take<0, 2>(args.tile_shape_mnk), make_coord(tile_m, tile_n, _));
    Tensor tCgRow = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        gRow(_, _, 0), args.epi_tile, args.tiled_copy, args.thread_idx);
    Tensor tCrM = make_tensor_like<float>(tCgRow);
    Tensor tCrS = make_tensor_like<float>(tCgRow);
    fill(tCrM, -cutlass::platform::numeric_limits<float>::infinity());
    fill(tCrS, 0.0f);

    constexpr int kTileM = size<0>(CtaTileShapeMNK{});
    const bool inside = int(tile_m) < params.tiles_m && int(tile_n) < params.tiles_n;
    LsePair* out = inside && params.partials != nullptr
                       ? params.partials + int64_t(tile_n) * params.tiles_m * kTileM : nullptr;
    return ConsumerStoreCallbacks<decltype(tCrM), decltype(args.tCcD), decltype(args.residue_tCcD),
                                  decltype(lane_layout_MN), decltype(lane_mn)>(
        tCrM, tCrS, args.tCcD, args.residue_tCcD, lane_layout_MN, lane_mn, out, int(M));
  }
};

}  // namespace evtc::device
