// evtc's own nodes for CUTLASS 2.x's epilogue visitor tree (the sm_80 backend):
//  - Sm80Compute: an elementwise op, like CUTLASS's VisitorCompute, that also passes an op's
//    Arguments (leaky_relu's slope, clamp's bounds), as Sm90Compute does;
//  - Sm80HalfStore: a gated [m, n/2] output (see sm90_half_store.cuh for the (gate, up) pair
//    layout and PairGate / PairUp);
//  - Sm80RowPartials, Sm80ColPartials, Sm80ScalarPartials: row (over N), column (over M) and
//    whole-matrix reductions that write per-tile partial results, each slot by one thread, to
//    evtc's scratch (reduction_scratch.h), folded in a fixed order after the kernel
//    (reduce.cuh): no atomics, the same bits on every run.
//
// The 2.x epilogue hands each thread fragments of ThreadMap::kElementsPerAccess consecutive
// columns of one row (OutputTileThreadLayout, cutlass/epilogue/threadblock/fusion/visitor_2x.hpp):
// step `iter_idx` of the tile, fragment row `row_idx` and fragment column `column_idx`. A row
// of a step lies in one warp, spread over kAccessWidth consecutive lanes (the thread index is
// lane_col + kAccessWidth * (lane_row + kAccessRows * warp_row ...)); every warp holds every
// column of the tile. The nodes find a fragment's place in the matrix from an identity tensor
// partitioned by the same thread map.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cutlass/array.h>
#include <cutlass/epilogue/threadblock/fusion/visitor_2x.hpp>
#include <cutlass/numeric_conversion.h>

#include "evtc/device/reduce.cuh"

namespace evtc::device {

namespace sm80_detail {

struct NoArguments {};

template <class Fn, class = void>
struct ArgumentsOf {
  using type = NoArguments;
};
template <class Fn>
struct ArgumentsOf<Fn, cutlass::platform::void_t<typename Fn::Arguments>> {
  using type = typename Fn::Arguments;
};

// What every 2.x visitor node declares for the host: no workspace, nothing to check.
template <class Arguments>
struct HostSide {
  using Params = Arguments;
  struct SharedStorage {};
  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
};

// (VECTOR, FRAGMENT_COLUMN, FRAGMENT_ROW, STEP) -> (m, n, l) of this thread's elements.
template <class ThreadMap, class ProblemShape>
CUTLASS_DEVICE auto fragment_coordinates(ProblemShape problem_shape, int thread_idx,
                                         cutlass::gemm::GemmCoord tile) {
  using namespace cute;
  Tensor c = make_identity_tensor(problem_shape);
  return group_modes<3, 6>(ThreadMap::partition(c, thread_idx, tile));
}

}  // namespace sm80_detail

// --- Sm80Compute -------------------------------------------------------------------------

template <template <class> class ComputeFn, class ElementOutput, class ElementCompute,
          cutlass::FloatRoundStyle RoundStyle>
struct Sm80Compute
    : sm80_detail::HostSide<typename sm80_detail::ArgumentsOf<ComputeFn<ElementCompute>>::type> {
  using Arguments = typename sm80_detail::ArgumentsOf<ComputeFn<ElementCompute>>::type;
  using Params = Arguments;
  using SharedStorage = typename sm80_detail::HostSide<Arguments>::SharedStorage;
  static constexpr bool kHasArguments = !std::is_same_v<Arguments, sm80_detail::NoArguments>;

  CUTLASS_HOST_DEVICE Sm80Compute() {}
  CUTLASS_HOST_DEVICE Sm80Compute(Params const& params, SharedStorage const&) : params(params) {}
  Params params;

  struct Callbacks : cutlass::epilogue::threadblock::EmptyCallbacks {
    Params const* params;
    CUTLASS_DEVICE explicit Callbacks(Params const* p) : params(p) {}

    template <class ElementAccumulator, class... ElementInputs, int FragmentSize>
    CUTLASS_DEVICE auto visit(int, int, int, int, cutlass::Array<ElementAccumulator, FragmentSize> const&,
                              cutlass::Array<ElementInputs, FragmentSize> const&... inputs) {
      using Frag = cutlass::Array<ElementCompute, FragmentSize>;
      ComputeFn<Frag> fn{};
      auto result = [&] {
        if constexpr (kHasArguments)
          return fn(cutlass::NumericArrayConverter<ElementCompute, ElementInputs, FragmentSize, RoundStyle>{}(
                        inputs)...,
                    *params);
        else
          return fn(cutlass::NumericArrayConverter<ElementCompute, ElementInputs, FragmentSize, RoundStyle>{}(
              inputs)...);
      }();
      using ResultElement = typename decltype(result)::Element;
      return cutlass::NumericArrayConverter<ElementOutput, ResultElement, FragmentSize, RoundStyle>{}(result);
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord, int, ProblemShape) {
    return Callbacks(&params);
  }
};

// --- Sm80HalfStore ------------------------------------------------------------------------

// Writes element 2j of each fragment (the pair's value after PairGate / PairUp and the
// gated activation) to column (n + 2j) / 2 of a row-major [m, n/2] output, `ld` elements
// between rows. A fragment starts at a multiple of kElementsPerAccess (even) columns, so its
// pairs are whole; where the fragment lies inside the problem and the address allows, its
// FragmentSize / 2 values go out in one store, else one by one.
template <class Element>
struct HalfStoreArguments {
  Element* ptr = nullptr;
  int64_t ld = 0;
};

template <class ThreadMap, class Element, cutlass::FloatRoundStyle RoundStyle>
struct Sm80HalfStore : sm80_detail::HostSide<HalfStoreArguments<Element>> {
  using Arguments = HalfStoreArguments<Element>;
  using Params = Arguments;
  using SharedStorage = typename sm80_detail::HostSide<Arguments>::SharedStorage;

  CUTLASS_HOST_DEVICE Sm80HalfStore() {}
  CUTLASS_HOST_DEVICE Sm80HalfStore(Params const& params, SharedStorage const&) : params_ptr(&params) {}
  Params const* params_ptr = nullptr;

  template <class CTensor, class ProblemShape>
  struct Callbacks : cutlass::epilogue::threadblock::EmptyCallbacks {
    CUTLASS_DEVICE Callbacks(CTensor&& c, ProblemShape shape, Params const* params)
        : tC_c(cute::forward<CTensor>(c)), problem_shape(shape), params(params) {}
    CTensor tC_c;
    ProblemShape problem_shape;
    Params const* params;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(int iter_idx, int row_idx, int column_idx, int,
                              cutlass::Array<ElementAccumulator, FragmentSize> const&,
                              cutlass::Array<ElementInput, FragmentSize> const& input) {
      static_assert(FragmentSize % 2 == 0, "a gated epilogue needs fragments of whole (gate, up) pairs");
      constexpr int kHalf = FragmentSize / 2;
      const auto coord = tC_c(cute::_0{}, column_idx, row_idx, iter_idx);
      const int m = cute::get<0>(coord), n = cute::get<1>(coord);
      const int rows = cute::get<0>(problem_shape), cols = cute::get<1>(problem_shape);
      if (m < rows && n < cols) {
        cutlass::Array<Element, kHalf> out;
        cutlass::NumericConverter<Element, ElementInput, RoundStyle> convert;
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kHalf; ++j) out[j] = convert(input[2 * j]);
        Element* dst = params->ptr + int64_t(m) * params->ld + n / 2;
        if (n + FragmentSize <= cols && reinterpret_cast<uintptr_t>(dst) % sizeof(out) == 0) {
          *reinterpret_cast<cutlass::Array<Element, kHalf>*>(dst) = out;
        } else {
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < kHalf; ++j)
            if (n + 2 * j < cols) dst[j] = out[j];
        }
      }
      return input;
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord tile, int thread_idx, ProblemShape problem_shape) {
    auto c = sm80_detail::fragment_coordinates<ThreadMap>(problem_shape, thread_idx, tile);
    return Callbacks<decltype(c), ProblemShape>(cute::move(c), problem_shape, params_ptr);
  }
};

// --- reductions ---------------------------------------------------------------------------

// Arguments of every partials node: where this reduction's partials go, and the identity of
// its operation (what out-of-problem elements contribute).
struct PartialsArguments {
  float* partials = nullptr;
  float identity = 0.0f;
};

// A reduction over N (one value per row): each tile writes, for each of its rows, the
// reduction over its columns, at partials[tile_n * padded_m + row] (padded_m = the tiles' rows,
// tiles_m * TileM). The kAccessWidth lanes holding a row fold it by shuffles; the first writes.
template <class ThreadMap, class ReduceOp, int TileM>
struct Sm80RowPartials : sm80_detail::HostSide<PartialsArguments> {
  using Arguments = PartialsArguments;
  using Params = Arguments;
  using SharedStorage = typename sm80_detail::HostSide<Arguments>::SharedStorage;
  static constexpr int kAccessWidth = ThreadMap::Detail::kAccessWidth;
  static_assert((kAccessWidth & (kAccessWidth - 1)) == 0, "a row's lanes must be a power of two");
  static constexpr int kRows = ThreadMap::Iterations::kRow;  // fragment rows per step

  CUTLASS_HOST_DEVICE Sm80RowPartials() {}
  CUTLASS_HOST_DEVICE Sm80RowPartials(Params const& params, SharedStorage const&) : params_ptr(&params) {}
  Params const* params_ptr = nullptr;

  template <class CTensor, class ProblemShape>
  struct Callbacks : cutlass::epilogue::threadblock::EmptyCallbacks {
    CUTLASS_DEVICE Callbacks(CTensor&& c, ProblemShape shape, Params const* params, int tiles_m, int tile_n)
        : tC_c(cute::forward<CTensor>(c)), problem_shape(shape), params(params),
          padded_m(int64_t(tiles_m) * TileM), tile_n(tile_n) {}
    CTensor tC_c;
    ProblemShape problem_shape;
    Params const* params;
    int64_t padded_m;
    int tile_n;
    float row_value[kRows];
    int step = 0;  // the step being visited (with two epilogue stages, one behind begin_step's)

    CUTLASS_DEVICE void begin_row(int row_idx) { row_value[row_idx] = params->identity; }

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(int iter_idx, int row_idx, int column_idx, int,
                              cutlass::Array<ElementAccumulator, FragmentSize> const&,
                              cutlass::Array<ElementInput, FragmentSize> const& input) {
      step = iter_idx;
      const int n = cute::get<1>(tC_c(cute::_0{}, column_idx, row_idx, iter_idx));
      const int cols = cute::get<1>(problem_shape);
      float v = row_value[row_idx];
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i)
        if (n + i < cols) v = ReduceOp{}(v, float(input[i]));
      row_value[row_idx] = v;
      return input;
    }

    CUTLASS_DEVICE void end_row(int row_idx) {
      float v = row_value[row_idx];
      CUTLASS_PRAGMA_UNROLL
      for (int o = kAccessWidth / 2; o > 0; o /= 2) v = ReduceOp{}(v, __shfl_xor_sync(0xffffffffu, v, o));
      const auto coord = tC_c(cute::_0{}, 0, row_idx, step);
      const int m = cute::get<0>(coord);
      if ((threadIdx.x % kAccessWidth) == 0 && m < cute::get<0>(problem_shape) && params->partials)
        params->partials[int64_t(tile_n) * padded_m + m] = v;
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord tile, int thread_idx, ProblemShape problem_shape) {
    auto c = sm80_detail::fragment_coordinates<ThreadMap>(problem_shape, thread_idx, tile);
    const int tiles_m = (cute::get<0>(problem_shape) + TileM - 1) / TileM;
    return Callbacks<decltype(c), ProblemShape>(cute::move(c), problem_shape, params_ptr, tiles_m, tile.n());
  }
};

// A reduction over M (one value per column): each tile writes, for each of its columns, the
// reduction over its rows, at partials[tile_m * padded_n + column] (padded_n = tiles_n * TileN).
// Each thread folds its columns over the rows it visits; the lanes sharing a column fold them
// by shuffles; each warp's result goes to shared memory, and the CTA folds the warps in order.
template <class ThreadMap, class ReduceOp, int TileN, int Warps>
struct Sm80ColPartials : sm80_detail::HostSide<PartialsArguments> {
  using Arguments = PartialsArguments;
  using Params = Arguments;
  struct SharedStorage {
    float warp_columns[Warps][TileN];
  };
  static constexpr int kAccessWidth = ThreadMap::Detail::kAccessWidth;
  static constexpr int kVector = ThreadMap::kElementsPerAccess;
  static constexpr int kColumns = ThreadMap::Iterations::kColumn;  // fragment columns per row

  CUTLASS_HOST_DEVICE Sm80ColPartials() {}
  CUTLASS_HOST_DEVICE Sm80ColPartials(Params const& params, SharedStorage const& shared)
      : params_ptr(&params), smem(const_cast<SharedStorage*>(&shared)) {}
  Params const* params_ptr = nullptr;
  SharedStorage* smem = nullptr;

  template <class CTensor, class ProblemShape>
  struct Callbacks : cutlass::epilogue::threadblock::EmptyCallbacks {
    CUTLASS_DEVICE Callbacks(CTensor&& c, ProblemShape shape, Params const* params, SharedStorage* smem,
                             int thread_idx, cutlass::gemm::GemmCoord tile)
        : tC_c(cute::forward<CTensor>(c)), problem_shape(shape), params(params), smem(smem),
          thread_idx(thread_idx), tile(tile) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kColumns * kVector; ++i) column_value[i] = params->identity;
    }
    CTensor tC_c;
    ProblemShape problem_shape;
    Params const* params;
    SharedStorage* smem;
    int thread_idx;
    cutlass::gemm::GemmCoord tile;
    float column_value[kColumns * kVector];

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(int iter_idx, int row_idx, int column_idx, int,
                              cutlass::Array<ElementAccumulator, FragmentSize> const&,
                              cutlass::Array<ElementInput, FragmentSize> const& input) {
      static_assert(FragmentSize == kVector, "fragments are the thread map's accesses");
      const auto coord = tC_c(cute::_0{}, column_idx, row_idx, iter_idx);
      const int m = cute::get<0>(coord), n = cute::get<1>(coord);
      if (m < cute::get<0>(problem_shape)) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i)
          if (n + i < cute::get<1>(problem_shape))
            column_value[column_idx * kVector + i] = ReduceOp{}(column_value[column_idx * kVector + i], float(input[i]));
      }
      return input;
    }

    CUTLASS_DEVICE void end_epilogue() {
      const int lane = thread_idx % 32, warp = thread_idx / 32;
      // Fold the lanes that hold the same columns (those kAccessWidth apart).
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kColumns * kVector; ++i) {
        float v = column_value[i];
        CUTLASS_PRAGMA_UNROLL
        for (int o = 16; o >= kAccessWidth; o /= 2) v = ReduceOp{}(v, __shfl_xor_sync(0xffffffffu, v, o));
        column_value[i] = v;
      }
      if (lane < kAccessWidth) {
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kColumns; ++c) {
          // The tile column of this thread's fragment column c (row 0 of step 0: any row would do).
          const int n0 = cute::get<1>(tC_c(cute::_0{}, c, 0, 0)) - tile.n() * TileN;
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < kVector; ++i) smem->warp_columns[warp][n0 + i] = column_value[c * kVector + i];
        }
      }
      __syncthreads();
      const int tiles_n = (cute::get<1>(problem_shape) + TileN - 1) / TileN;
      for (int col = thread_idx; col < TileN; col += Warps * 32) {
        float v = params->identity;
        for (int w = 0; w < Warps; ++w) v = ReduceOp{}(v, smem->warp_columns[w][col]);
        if (params->partials) params->partials[int64_t(tile.m()) * tiles_n * TileN + int64_t(tile.n()) * TileN + col] = v;
      }
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord tile, int thread_idx, ProblemShape problem_shape) {
    auto c = sm80_detail::fragment_coordinates<ThreadMap>(problem_shape, thread_idx, tile);
    return Callbacks<decltype(c), ProblemShape>(cute::move(c), problem_shape, params_ptr, smem, thread_idx, tile);
  }
};

// A whole-matrix reduction: each warp of each tile writes its fold at
// partials[(tile_m * tiles_n + tile_n) * Warps + warp].
template <class ThreadMap, class ReduceOp, int TileN, int Warps>
struct Sm80ScalarPartials : sm80_detail::HostSide<PartialsArguments> {
  using Arguments = PartialsArguments;
  using Params = Arguments;
  using SharedStorage = typename sm80_detail::HostSide<Arguments>::SharedStorage;

  CUTLASS_HOST_DEVICE Sm80ScalarPartials() {}
  CUTLASS_HOST_DEVICE Sm80ScalarPartials(Params const& params, SharedStorage const&) : params_ptr(&params) {}
  Params const* params_ptr = nullptr;

  template <class CTensor, class ProblemShape>
  struct Callbacks : cutlass::epilogue::threadblock::EmptyCallbacks {
    CUTLASS_DEVICE Callbacks(CTensor&& c, ProblemShape shape, Params const* params, int thread_idx,
                             cutlass::gemm::GemmCoord tile)
        : tC_c(cute::forward<CTensor>(c)), problem_shape(shape), params(params), thread_idx(thread_idx),
          tile(tile), value(params->identity) {}
    CTensor tC_c;
    ProblemShape problem_shape;
    Params const* params;
    int thread_idx;
    cutlass::gemm::GemmCoord tile;
    float value;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(int iter_idx, int row_idx, int column_idx, int,
                              cutlass::Array<ElementAccumulator, FragmentSize> const&,
                              cutlass::Array<ElementInput, FragmentSize> const& input) {
      const auto coord = tC_c(cute::_0{}, column_idx, row_idx, iter_idx);
      const int m = cute::get<0>(coord), n = cute::get<1>(coord);
      if (m < cute::get<0>(problem_shape)) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i)
          if (n + i < cute::get<1>(problem_shape)) value = ReduceOp{}(value, float(input[i]));
      }
      return input;
    }

    CUTLASS_DEVICE void end_epilogue() {
      float v = value;
      CUTLASS_PRAGMA_UNROLL
      for (int o = 16; o > 0; o /= 2) v = ReduceOp{}(v, __shfl_xor_sync(0xffffffffu, v, o));
      const int tiles_n = (cute::get<1>(problem_shape) + TileN - 1) / TileN;
      if (thread_idx % 32 == 0 && params->partials)
        params->partials[(int64_t(tile.m()) * tiles_n + tile.n()) * Warps + thread_idx / 32] = v;
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord tile, int thread_idx, ProblemShape problem_shape) {
    auto c = sm80_detail::fragment_coordinates<ThreadMap>(problem_shape, thread_idx, tile);
    return Callbacks<decltype(c), ProblemShape>(cute::move(c), problem_shape, params_ptr, thread_idx, tile);
  }
};

}  // namespace evtc::device
