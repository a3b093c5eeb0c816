// Gated epilogues on Sm90: the (gate, up) column pairs of the accumulator tile become one
// output column each, so the kernel writes an M×N/2 result from an M×N product.
//
// The weights are laid out so that gate and up columns alternate (gate in column 2j, up in
// column 2j+1; evtc::interleave_gate_up builds that layout from stacked [W_gate; W_up]).
// In the Hopper wgmma accumulator layout every thread holds adjacent column pairs in
// adjacent registers, and the epilogue visits them in fragments of an even number of
// elements starting at a pair's first column, so both halves of a pair meet in one fragment
// of one thread and the gating moves no data between threads. The same holds on sm_100a, whose
// epilogue loads each thread one row of the tile from tensor memory, consecutive columns in
// consecutive registers.
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
//    Halving leaves each thread one value per 8-column block, so the store first regroups
//    values among the four lanes of each quad into runs of consecutive output columns and
//    writes each run with wide stores (see "Quad runs" below). On sm_100a a fragment's pair
//    values already are consecutive output columns of one row and go out as they are.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

#include <cutlass/arch/memory.h>
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

// Quad runs. The fragments the collective hands to the consumer store callbacks are slices of
// the accumulator as partitioned by a tiled copy that make_tiled_copy_C_atom (CUTLASS,
// cute/atom/copy_atom.hpp) derives from the MMA's own (thread, value) -> (m, n) map; in
// sm90_epilogue_tma_warpspecialized.hpp (and its ptr-array twin) args.tCcD is that
// partition of the tile's coordinates, a static layout giving each element's position
// relative to the thread's first one, the same for every thread. The wgmma map
// (CLayout_64xN, cute/atom/mma_traits_sm90_gmma.hpp) gives lane l of a warp rows l/4 and
// l/4 + 8 and, in every 8-column block, columns 2(l%4) and 2(l%4) + 1. With the 128×32 and
// 64×32 epilogue subtiles a thread's 16-element fragment is 2 rows × 4 blocks × one pair,
// and the quad of lanes 4i..4i+3 holds output columns 4b..4b+3 of block b for both rows:
// 2 rows × 16 consecutive output columns, spread one value per lane and block.
//
// The store makes each lane of the quad the owner of one run of those (one row, 8
// consecutive output columns: 16 bytes in bf16) by a 4×4 transpose among the quad's lanes,
// then writes the run with one or more stores of up to 16 bytes. The parts of that rely
// on the fragment's shape (pairs adjacent, a rows × blocks grid repeated identically by
// every fragment) are checked at compile time from tCcD; the part that relates lanes (the
// quad shares a row, lane l starting 2(l%4) columns after lane 4(l/4)) is checked at run
// time, once per tile and for the whole warp, so that a warp either transposes as a whole
// (shuffles need all 32 lanes) or falls back to one store per element. Runs cut by the
// problem's edge, or not aligned for the wide store, are written element by element.
namespace detail {

// The coordinates of the elements a thread visits in one epilogue subtile, relative to its
// first element, read at compile time from a static coordinate tensor.
template <int Elems>
struct SubtileCoords {
  int m[Elems] = {};
  int n[Elems] = {};
};

template <class Coords, int... I>
CUTLASS_HOST_DEVICE constexpr SubtileCoords<sizeof...(I)> subtile_coords(
    std::integer_sequence<int, I...>) {
  return {{int(cute::remove_cvref_t<decltype(cute::get<0>(
                   std::declval<Coords const&>()(cute::Int<I>{})))>::value)...},
          {int(cute::remove_cvref_t<decltype(cute::get<1>(
                   std::declval<Coords const&>()(cute::Int<I>{})))>::value)...}};
}

// Where the (gate, up) pairs of a visited fragment lie, relative to its first element.
template <int Pairs>
struct FragmentPairs {
  bool adjacent = true;  // every pair is (row, column), (row, column + 1)
  // Every fragment holds one row's consecutive columns, pair k at column 2k: its pair values
  // are consecutive output columns of one thread (sm_100a's tensor-memory loads give each
  // thread a row of the tile).
  bool row_run = false;
  // The pairs form a grid of `rows` rows × `blocks` 8-column blocks (column offsets 0, 8,
  // 16, ...), one pair per cell, every fragment repeating the pattern of the first, and the
  // quad's rows × 4·blocks output values split into four equal runs, 4/rows per row: the
  // quad-run store applies.
  bool runs = false;
  int rows = 0;
  int blocks = 0;
  int row_offset[4] = {};
  int pair_at[4][Pairs] = {};  // the pair in (row index, block)
};

template <int Pairs, int Elems>
CUTLASS_HOST_DEVICE constexpr FragmentPairs<Pairs> fragment_pairs(SubtileCoords<Elems> const& c) {
  constexpr int F = 2 * Pairs;
  FragmentPairs<Pairs> f;
  bool repeats = Elems % F == 0;
  for (int v = 0; v < Elems / F; ++v) {
    const int e0 = v * F;
    for (int i = 0; i < F; ++i) {
      if (c.m[e0 + i] - c.m[e0] != c.m[i] - c.m[0] || c.n[e0 + i] - c.n[e0] != c.n[i] - c.n[0])
        repeats = false;
      if (i % 2 == 1 && (c.m[e0 + i] != c.m[e0 + i - 1] || c.n[e0 + i] != c.n[e0 + i - 1] + 1))
        f.adjacent = false;
    }
  }
  if (!repeats || !f.adjacent) return f;
  f.row_run = true;
  for (int k = 0; k < Pairs; ++k)
    if (c.m[2 * k] != c.m[0] || c.n[2 * k] - c.n[0] != 2 * k) f.row_run = false;
  for (int r = 0; r < 4; ++r)
    for (int b = 0; b < Pairs; ++b) f.pair_at[r][b] = -1;
  for (int k = 0; k < Pairs; ++k) {
    const int dm = c.m[2 * k] - c.m[0];
    const int dn = c.n[2 * k] - c.n[0];
    if (dn < 0 || dn % 8 != 0 || dn / 8 >= Pairs) return f;
    int r = 0;
    while (r < f.rows && f.row_offset[r] != dm) ++r;
    if (r == f.rows) {
      if (f.rows == 4) return f;
      f.row_offset[f.rows++] = dm;
    }
    if (f.pair_at[r][dn / 8] != -1) return f;
    f.pair_at[r][dn / 8] = k;
    if (dn / 8 + 1 > f.blocks) f.blocks = dn / 8 + 1;
  }
  // Pairs distinct cells in a rows × blocks grid of Pairs cells: the grid is full.
  f.runs = f.rows * f.blocks == Pairs && 4 % f.rows == 0 && Pairs % 4 == 0;
  return f;
}

}  // namespace detail

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
                                          int64_t col0, int64_t rows, int64_t half_cols,
                                          ElementOutput* base, int64_t ld, bool quads)
        : coords(coords),
          residue(residue),
          row0(row0),
          col0(col0),
          rows(rows),
          half_cols(half_cols),
          base(base),
          ld(ld),
          quads(quads) {}

    CTensor coords;      // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) coordinates relative to this thread's
                         // first element
    ThrResidue residue;  // elements at or past it lie outside the problem
    int64_t row0, col0;  // coordinates of this thread's first element in its problem (group)
    // The problem's (group's) M and N/2.
    int64_t rows, half_cols;
    // The problem's (group's) output.
    ElementOutput* base;
    int64_t ld;
    // Warp-uniform: every quad of this warp is laid out as the quad-run store needs.
    bool quads;

    // One subtile's coordinates, (CPY,CPY_M,CPY_N), relative to the thread's first element.
    using SubtileCoordTensor = decltype(std::declval<CTensor const&>()(
        cute::_, cute::_, cute::_, cute::Int<0>{}, cute::Int<0>{}));
    static constexpr int kSubtileElems =
        decltype(cute::size(std::declval<SubtileCoordTensor const&>()))::value;

    template <int Pairs>
    CUTLASS_HOST_DEVICE static constexpr detail::FragmentPairs<Pairs> pairs() {
      return detail::fragment_pairs<Pairs>(detail::subtile_coords<SubtileCoordTensor>(
          std::make_integer_sequence<int, kSubtileElems>{}));
    }

    // Bytes of the run each lane of a quad writes (one value per pair of its fragment), 0
    // where the quad-run store does not apply: the fragment's shape, or a run size that
    // cutlass::arch::global_store does not write (a power of two up to 64 bytes).
    template <int Pairs>
    CUTLASS_HOST_DEVICE static constexpr int run_bytes() {
      constexpr int bytes = Pairs * int(sizeof(ElementOutput));
      const bool stored = cutlass::sizeof_bits<ElementOutput>::value % 8 == 0 && bytes <= 64 &&
                          (bytes & (bytes - 1)) == 0;
      return pairs<Pairs>().runs && stored ? bytes : 0;
    }

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v,
                              int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const& input) {
      static_assert(FragmentSize % 2 == 0, "a gated epilogue needs whole (gate, up) pairs");
      constexpr int kPairs = FragmentSize / 2;
      static_assert(pairs<kPairs>().adjacent,
                    "a gated epilogue needs each (gate, up) column pair in adjacent elements of "
                    "a fragment");
      cutlass::NumericConverter<ElementOutput, ElementInput, RoundStyle> convert;
      cutlass::Array<ElementOutput, kPairs> y;  // the value of each pair
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kPairs; ++k) y[k] = convert(input[2 * k]);

      auto coords_mn = coords(cute::_, cute::_, cute::_, epi_m, epi_n);
      if constexpr (pairs<kPairs>().row_run) {
        store_row_run(y, coords_mn(epi_v * FragmentSize));
      } else {
        if constexpr (run_bytes<kPairs>() != 0) {
          if (quads) {
            store_runs(y, coords_mn(epi_v * FragmentSize));
            return input;
          }
        }
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < kPairs; ++k) {
          auto c = coords_mn(epi_v * FragmentSize + 2 * k);
          if (!cute::elem_less(c, residue)) continue;
          const int64_t m = row0 + int64_t(cute::get<0>(c));
          const int64_t n = col0 + int64_t(cute::get<1>(c));
          base[m * ld + n / 2] = y[k];
        }
      }
      return input;
    }

    // Writes one fragment's pair values y through quad runs (see above); c0 is the position
    // of the fragment's first element relative to the thread's first element. Called by
    // every lane of the warp.
    template <int Pairs, class Coord>
    CUTLASS_DEVICE void store_runs(cutlass::Array<ElementOutput, Pairs> const& y,
                                   Coord const& c0) const {
      // Only compile-time constants are read from the analysis (through constexpr names and
      // compile-time loops): an array of it indexed at run time would live in local memory.
      constexpr int kRows = pairs<Pairs>().rows;
      constexpr int kRunsPerRow = 4 / kRows;
      // A run spans kRunBlocks blocks; its kRun output values are one per pair.
      constexpr int kRunBlocks = pairs<Pairs>().blocks / kRunsPerRow;
      constexpr int kRun = 4 * kRunBlocks;
      constexpr int kRunBytes = run_bytes<Pairs>();
      static_assert(kRun == Pairs && kRunBytes == kRun * int(sizeof(ElementOutput)));
      // What one lane gives to one run: its value in each of the run's blocks, moved as
      // 32-bit words.
      using Part = cutlass::Array<ElementOutput, kRunBlocks>;
      constexpr int kWords = (int(sizeof(Part)) + 3) / 4;
      const int q = cutlass::canonical_lane_idx() % 4;  // lane in the quad
      const int run = q % kRunsPerRow;                  // this lane's run within its row

      // slot[g]: this lane's part of lane g's run (row g / kRunsPerRow, blocks
      // [kRunBlocks·(g % kRunsPerRow), +kRunBlocks)).
      uint32_t slot[4][kWords];
      cute::for_each(cute::make_int_sequence<4>{}, [&](auto g_) {
        constexpr int g = decltype(g_)::value;
        Part part;
        cute::for_each(cute::make_int_sequence<kRunBlocks>{}, [&](auto j_) {
          constexpr int j = decltype(j_)::value;
          constexpr int block = g % kRunsPerRow * kRunBlocks + j;
          part[j] = y[pairs<Pairs>().pair_at[g / kRunsPerRow][block]];
        });
        CUTLASS_PRAGMA_UNROLL
        for (int w = 0; w < kWords; ++w) slot[g][w] = 0;
        memcpy(slot[g], &part, sizeof(Part));
      });
      // Transpose the quad's 4×4 (lane, slot) matrix of parts in two butterfly steps, for
      // bit = 1 then 2 of the lane index: lanes l and l^bit swap the slots whose index
      // differs from l in that bit. A part at (lane a, slot b) ends at (lane b, slot a): slot
      // p then holds lane p's part of this lane's run.
      CUTLASS_PRAGMA_UNROLL
      for (int bit = 1; bit <= 2; bit *= 2) {
        const bool upper = (q & bit) != 0;
        CUTLASS_PRAGMA_UNROLL
        for (int g = 0; g < 4; ++g) {
          if (g & bit) continue;
          CUTLASS_PRAGMA_UNROLL
          for (int w = 0; w < kWords; ++w) {
            const uint32_t sent = upper ? slot[g][w] : slot[g | bit][w];
            const uint32_t got = __shfl_xor_sync(0xffffffff, sent, bit);
            if (upper)
              slot[g][w] = got;
            else
              slot[g | bit][w] = got;
          }
        }
      }
      // Lane p's value in the run's block j sits at output column 4j + p of the run.
      cutlass::Array<ElementOutput, kRun> values;
      CUTLASS_PRAGMA_UNROLL
      for (int p = 0; p < 4; ++p) {
        Part part;
        memcpy(&part, slot[p], sizeof(Part));
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kRunBlocks; ++j) values[4 * j + p] = part[j];
      }

      // Where the run goes: row q / kRunsPerRow of the grid, its offset selected from the
      // compile-time ones.
      int row_offset = 0;
      cute::for_each(cute::make_int_sequence<kRows>{}, [&](auto r_) {
        constexpr int r = decltype(r_)::value;
        constexpr int offset = pairs<Pairs>().row_offset[r];
        if (r == q / kRunsPerRow) row_offset = offset;
      });
      const int64_t m = row0 + int64_t(cute::get<0>(c0)) + row_offset;
      // col0 - 2q is the quad's first column (lane 4i's; checked with `quads`); like every
      // pair's first column it is even (gate columns are the even ones).
      const int64_t n = (col0 - 2 * q + int64_t(cute::get<1>(c0))) / 2 + run * kRun;
      if (m >= rows) return;
      ElementOutput* out = base + m * ld + n;
      // global_store writes the run with stores of up to 16 bytes (two 16-byte ones for 32),
      // each needing its own size's alignment. A row pitch that is not a multiple of 16 bytes
      // (N/2 = 13652 bf16 columns: every other row starts 8 bytes off) takes 8- or 4-byte
      // pieces rather than one store per element.
      constexpr int kAlign = kRunBytes < 16 ? kRunBytes : 16;
      const uintptr_t address = reinterpret_cast<uintptr_t>(out);
      if (n + kRun <= half_cols && address % kAlign == 0) {
        cutlass::arch::global_store<decltype(values), kRunBytes>(values, out, true);
      } else if (n + kRun <= half_cols && kAlign > 8 && address % 8 == 0) {
        store_pieces<8>(values, out);
      } else if (n + kRun <= half_cols && kAlign > 4 && address % 4 == 0) {
        store_pieces<4>(values, out);
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < kRun; ++k)
          if (n + k < half_cols) out[k] = values[k];
      }
    }

    // Writes one fragment's pair values y, consecutive output columns of one row (row_run), with
    // the widest stores their address allows; elements past the problem's edge are not written.
    template <int Pairs, class Coord>
    CUTLASS_DEVICE void store_row_run(cutlass::Array<ElementOutput, Pairs> const& y,
                                      Coord const& c0) const {
      const int64_t m = row0 + int64_t(cute::get<0>(c0));
      const int64_t n = (col0 + int64_t(cute::get<1>(c0))) / 2;  // the first pair's column is even
      if (m >= rows) return;
      ElementOutput* out = base + m * ld + n;
      constexpr int kBytes = Pairs * int(sizeof(ElementOutput));
      const uintptr_t address = reinterpret_cast<uintptr_t>(out);
      if constexpr (cutlass::sizeof_bits<ElementOutput>::value % 8 == 0 && kBytes % 16 == 0) {
        if (n + Pairs <= half_cols && address % 16 == 0) return store_pieces<16>(y, out);
      }
      if constexpr (cutlass::sizeof_bits<ElementOutput>::value % 8 == 0 && kBytes % 8 == 0) {
        if (n + Pairs <= half_cols && address % 8 == 0) return store_pieces<8>(y, out);
      }
      if constexpr (cutlass::sizeof_bits<ElementOutput>::value % 8 == 0 && kBytes % 4 == 0) {
        if (n + Pairs <= half_cols && address % 4 == 0) return store_pieces<4>(y, out);
      }
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < Pairs; ++k)
        if (n + k < half_cols) out[k] = y[k];
    }

    // Writes `values` (a whole run, in bounds) as consecutive stores of Bytes each; `out` is
    // aligned to Bytes.
    template <int Bytes, class Values>
    CUTLASS_DEVICE static void store_pieces(Values const& values, ElementOutput* out) {
      constexpr int kPer = Bytes / int(sizeof(ElementOutput));
      if constexpr (kPer >= 1 && int(sizeof(Values)) % Bytes == 0) {
        using Piece = cutlass::Array<ElementOutput, kPer>;
        CUTLASS_PRAGMA_UNROLL
        for (int p = 0; p < int(sizeof(Values)) / Bytes; ++p)
          cutlass::arch::global_store<Piece, Bytes>(reinterpret_cast<Piece const*>(&values)[p],
                                                    out + p * kPer, true);
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < int(Values::kElements); ++k) out[k] = values[k];
      }
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
    // The quad-run store needs each quad's lanes on one row, lane 4i+j starting 2j columns
    // after lane 4i (the wgmma layout). Every lane of the warp calls this, so the warp can
    // agree on it here, once per tile.
    const int lane = cutlass::canonical_lane_idx();
    const int64_t quad_row = __shfl_sync(0xffffffff, row0, lane & ~3);
    const int64_t quad_col = __shfl_sync(0xffffffff, col0, lane & ~3);
    const bool quads =
        __all_sync(0xffffffff, row0 == quad_row && col0 == quad_col + 2 * (lane & 3));
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD)>(
        args.tCcD, args.residue_tCcD, row0, col0, m, n / 2, base, params.ld, quads);
  }
};

}  // namespace evtc::device
