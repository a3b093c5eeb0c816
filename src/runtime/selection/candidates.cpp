#include "runtime/selection/candidates.hpp"

#include "runtime/shared_memory_model.hpp"
#include "target/device_info.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "evtc/passes.hpp"

namespace evtc::tuning {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t size_or(int64_t v) { return v > 0 ? v : 4096; }

GemmDesc tiled_problem(const KernelConfig& c, const GemmDesc& gemm) {
  GemmDesc t = gemm;
  if (c.swap_ab) std::swap(t.m, t.n);
  return t;
}

int64_t tile_count(const KernelConfig& c, const GemmDesc& given) {
  const GemmDesc gemm = tiled_problem(c, given);
  return ceil_div(size_or(gemm.m), c.tile_m) * ceil_div(size_or(gemm.n), c.tile_n);
}

GemmDesc whole_row_tiles(const KernelConfig& c, GemmDesc gemm) {
  const int64_t rows = c.swap_ab ? c.tile_n : c.tile_m;
  gemm.m = ceil_div(gemm.m, rows) * rows;
  return gemm;
}

std::optional<int> transposed_width_splitting(int64_t m, int tiles) {
  if (m <= 0 || tiles < 1) return std::nullopt;
  const int64_t width = ceil_div(ceil_div(m, tiles), 16) * 16;
  if (width > 256) return std::nullopt;
  return int(width);
}

std::optional<int> transposed_width_holding(int64_t m) {
  constexpr int64_t kWidest = 128;
  if (m > kWidest) return std::nullopt;
  return transposed_width_splitting(m, 1);
}

namespace {

// Fraction of the padded tile grid that lies inside the problem.
double padding_efficiency(const KernelConfig& c, const GemmDesc& given) {
  const GemmDesc g = tiled_problem(c, given);
  const int64_t m = size_or(g.m), n = size_or(g.n);
  return double(m) / double(ceil_div(m, c.tile_m) * c.tile_m) *
         (double(n) / double(ceil_div(n, c.tile_n) * c.tile_n));
}

// Padding efficiency where below 64 rows every tile pads M (no tile has fewer rows): only
// padding beyond that counts. A transposed tile's columns (M's) are at least 16 wide.
double padding_beyond_the_shortest_tile(const KernelConfig& c, const GemmDesc& g) {
  GemmDesc padded = g;
  padded.m = std::max<int64_t>(size_or(g.m), c.swap_ab ? 16 : 64);
  return padding_efficiency(c, padded);
}

// Tiles per wave the persistent grid runs: the clusters resident at once.
int64_t tiles_per_wave(const KernelConfig& c, const DeviceLimits& d) {
  return resident_cluster_ctas(d.sm_count, c.cluster_m * c.cluster_n);
}

// Fraction of the multiprocessors' time over the waves doing work, tiles rounded up to whole
// clusters: a wave of clusters of 4 holds 120 tiles on a 132-multiprocessor GPU, and takes as
// long as a wave of 132 (measured on the H200: at 8x8192x8192, 128 transposed 64x16 tiles took
// 1.19x cuBLAS's time in 4x1 clusters, two waves, against 1.01x alone, one wave;
// bench/results/20261129-2127-h200-gemm-sweep-off-grid-m64-clusters.json).
double wave_efficiency(const KernelConfig& c, const GemmDesc& given, const DeviceLimits& d) {
  const GemmDesc g = tiled_problem(c, given);
  const int64_t tm = ceil_div(ceil_div(size_or(g.m), c.tile_m), c.cluster_m) * c.cluster_m;
  const int64_t tn = ceil_div(ceil_div(size_or(g.n), c.tile_n), c.cluster_n) * c.cluster_n;
  const int64_t waves = ceil_div(tm * tn, tiles_per_wave(c, d));
  return double(tile_count(c, given)) / double(waves * std::max<int64_t>(d.sm_count, tiles_per_wave(c, d)));
}

KernelConfig make_config(MainloopSchedule sched, TileSchedulerKind scheduler, int tm, int tn, int tk, int cm, int cn,
                         int splits, const GemmDesc& gemm) {
  KernelConfig c;
  c.schedule = sched;
  c.scheduler = scheduler;
  c.tile_m = tm;
  c.tile_n = tn;
  c.tile_k = tk;
  c.cluster_m = cm;
  c.cluster_n = cn;
  c.splits = splits;
  c.fp8_fast_accum = is_fp8(gemm.a_dtype) && gemm.fp8_fast_accum;
  return c;
}

// Problems whose 128×128 tile grid leaves multiprocessors idle (decode-sized M, small N):
// their main loop streams B from memory, so what counts is how many multiprocessors pull it.
bool small_grid(const GemmDesc& gemm, const DeviceLimits& d) {
  return ceil_div(size_or(gemm.m), 128) * ceil_div(size_or(gemm.n), 128) < 2 * int64_t(d.sm_count);
}

std::vector<KernelConfig> whole_space(const GemmDesc& gemm, const DeviceLimits& device) {
  static const int kTiles[][2] = {{128, 128}, {128, 256}, {256, 128}, {64, 128}, {64, 256}, {128, 192}, {256, 192}};
  static const int kClusters[][2] = {{1, 1}, {2, 1}, {1, 2}};
  const bool fp8 = is_fp8(gemm.a_dtype);
  const int tile_k = fp8 ? 128 : 64;
  std::vector<KernelConfig> out;
  for (auto sched : {MainloopSchedule::cooperative, MainloopSchedule::pingpong})
    for (auto scheduler : {TileSchedulerKind::persistent, TileSchedulerKind::stream_k})
      for (const auto& t : kTiles)
        for (const auto& cl : kClusters) {
          // Cooperative 128×192 splits into two 64×192 halves: ping-pong's 128×192 tile does the
          // same work per multiprocessor at twice the intensity per warp group. Not for fp8's
          // two-level accumulation, whose ping-pong 128×192 does not fit its two accumulator sets
          // (prune_reason) and whose cooperative 128×192 is the widest tile that does.
          if (sched == MainloopSchedule::cooperative && t[0] == 128 && t[1] == 192 &&
              !(fp8 && !gemm.fp8_fast_accum))
            continue;
          out.push_back(make_config(sched, scheduler, t[0], t[1], tile_k, cl[0], cl[1], 1, gemm));
        }
  // Widths between the usual ones, for grids whose last wave the usual widths fill badly.
  out.push_back(make_config(MainloopSchedule::pingpong, TileSchedulerKind::persistent, 128, 160, tile_k, 2, 1, 1, gemm));
  out.push_back(make_config(MainloopSchedule::cooperative, TileSchedulerKind::persistent, 256, 160, tile_k, 2, 1, 1, gemm));
  // Widths fitted to the grid: for each row tile, the narrowest multiple of 16 columns whose
  // tile grid fills one to four whole waves of multiprocessors. At 1024×4608, 128×256 tiles
  // make 144 tiles on 132 multiprocessors (a second wave of 12) where 256×144 makes 128.
  struct RowTile {
    MainloopSchedule schedule;
    int tile_m;
  };
  for (const RowTile rt : {RowTile{MainloopSchedule::pingpong, 128}, RowTile{MainloopSchedule::cooperative, 256},
                           RowTile{MainloopSchedule::pingpong, 64}}) {
    const int64_t rows = ceil_div(size_or(gemm.m), rt.tile_m);
    for (int waves = 1; waves <= 4; ++waves) {
      const int64_t cols = waves * int64_t(device.sm_count) / rows;
      if (cols < 1) continue;
      const int tn = int(ceil_div(ceil_div(size_or(gemm.n), cols), 16) * 16);
      if (tn < 64 || tn > 256 || tn % 64 == 0) continue;  // multiples of 64 are in the space already
      const int tk = rt.tile_m == 64 && tn <= 128 && !fp8 ? 128 : tile_k;
      for (const auto& cl : {std::pair{1, 1}, std::pair{2, 1}}) {
        const KernelConfig c = make_config(rt.schedule, TileSchedulerKind::persistent, rt.tile_m, tn, tk, cl.first,
                                           cl.second, 1, gemm);
        if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
      }
    }
  }
  // Up to 384 rows: the transposed problem in cooperative 128-row tiles (N in their rows), M
  // split into one to four tiles of M / t columns rounded up to 16, alone or in 4x1 clusters
  // (the activations' tile multicast along N); and 64-row ping-pong transposed tiles holding M
  // in one or two tiles, in 4x1 clusters. cuBLAS runs such tiles there (Nsight Compute on the
  // H200: transposed 128x88 in 4x1 clusters at 88x11008x4096, 128x104 in 4x2 at
  // 200x7168x5120, 64x104 with split-K at 100x3072x8192; at M = 64, 112x64 and 64x64 in 4x1
  // clusters at 64x10240x8192 and 64x4608x3584: bench/results/20261128-2109-h200-ncu-mid-m.csv,
  // 20261129-1500-h200-ncu-decode.csv), and 64- and 128-row tiles pad such an M to whole
  // tiles (bench/results/20261128-2123-h200-gemm-sweep-mid-m-transposed-coop.json: 1.003x
  // cuBLAS at 88x11008x4096, 1.010x at 96x16384x3072, 1.051x at 200x7168x5120).
  if (const int64_t m = size_or(gemm.m); m <= 384 && !fp8) {
    auto add = [&](KernelConfig c) {
      c.swap_ab = true;
      if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    };
    for (int tiles = 1; tiles <= 4; ++tiles)
      if (const auto w = transposed_width_splitting(m, tiles))
        for (int cluster : {1, 4})
          add(make_config(MainloopSchedule::cooperative, TileSchedulerKind::persistent, 128, *w, tile_k, cluster, 1, 1,
                          gemm));
    // At M <= 64 also K tiles of 64 (twice the stages: cuBLAS's 64x64 tiles there run 13).
    for (int tiles = 1; tiles <= 2; ++tiles)
      if (const auto w = transposed_width_splitting(m, tiles); w && *w <= 192)
        for (int tk : m <= 64 ? std::vector<int>{128, 64} : std::vector<int>{128})
          add(make_config(MainloopSchedule::pingpong, TileSchedulerKind::persistent, 64, *w, tk, 4, 1, 1, gemm));
    // Above 128 rows the same two tiles without a cluster, K whole or in 2 to 4 parts: at
    // 144x4096x4096 on the H200 two transposed 64x80 tiles took 0.98x cuBLAS's time, in 4x1
    // clusters 1.40x; at 192x2048x8192 two of 64x96 in 2 parts 0.84x
    // (bench/results/20261202-0954-h200-gemm-sweep-m-128-256-transposed.json).
    if (m > 128)
      if (const auto w = transposed_width_splitting(m, 2); w && *w <= 128)
        for (int parts : {1, 2, 3, 4}) {
          KernelConfig c = make_config(MainloopSchedule::pingpong, TileSchedulerKind::persistent, 64, *w, 128, 1, 1, 1, gemm);
          c.k_parts = parts;
          add(c);
        }
  }
  if (!small_grid(gemm, device)) return out;
  // Small grids: 64-row ping-pong tiles narrow enough that every multiprocessor gets a tile,
  // with deep K tiles (each stage's copy of B is then large enough to keep memory busy), alone
  // or in clusters along N (A's tile multicast); and 128-row cooperative tiles whose K loop
  // is split (split-K) or balanced across the multiprocessors (stream-K).
  // fp8 with two-level accumulation: K tiles of 128, the promotion interval (config_refusal).
  const int fp8_deep_k = gemm.fp8_fast_accum ? 256 : 128;
  for (int tn : {32, 48, 64, 96, 128, 160, 192, 256}) {
    const int tk = fp8 ? fp8_deep_k : tn <= 128 ? 128 : 64;
    out.push_back(make_config(MainloopSchedule::pingpong, TileSchedulerKind::persistent, 64, tn, tk, 1, 1, 1, gemm));
    if (tn == 32 || tn == 64 || tn == 128)
      out.push_back(make_config(MainloopSchedule::pingpong, TileSchedulerKind::persistent, 64, tn, tk, 1, 2, 1, gemm));
  }
  for (int tn : {64, 128})
    for (int splits : {1, 2, 4, 8})
      out.push_back(make_config(MainloopSchedule::cooperative, TileSchedulerKind::stream_k, 128, tn, tile_k, 1, 1,
                                splits, gemm));
  // Decode-sized M: the transposed problem (swap-AB), whose tiles take N in their rows and M in
  // 16 to 64 columns; 64-row ping-pong tiles, and 128-row cooperative ones with split-K or
  // stream-K. B' (the activations) is small, so each stage is mostly weights. fp8 takes K
  // tiles of 128 only: with 256, CUTLASS's two-level fp8 ping-pong kernel refuses the problem
  // (can_implement, measured on an H100 at 16×1008×2048).
  // Between 64 and 128 rows, one transposed tile that holds all of M (the next multiple of 16
  // columns; epilogue_config_refusal prunes widths a reduction cannot take): the weights are
  // streamed once, as at M <= 64, where 64-row tiles or a transposed 64-column one stream them
  // once per row tile (at 80x5120x3072 on the H200 the best of 35 candidates without it took
  // 1.21x cuBLAS's time; bench/results/20261128-1434-h200-gemm-sweep-mid-m.json).
  // That tile with K in 2 to 4 parts added by a second kernel, where its tiles leave most
  // multiprocessors idle (N of 2048-4096): at 96x3584x18944 on the H200, 2 parts took 0.92x
  // cuBLAS's time, K whole 1.09x and two 64-row untransposed row tiles 1.41x
  // (bench/results/20261202-0850-h200-gemm-sweep-mid-m-k-parts.json; the pruning keeps one or
  // two waves of parts and K long enough).
  if (const auto tn = transposed_width_holding(size_or(gemm.m)); tn && size_or(gemm.m) > 64) {
    KernelConfig c = make_config(MainloopSchedule::pingpong, TileSchedulerKind::persistent, 64, *tn, 128, 1, 1, 1, gemm);
    c.swap_ab = true;
    out.push_back(c);
    if (!fp8)
      for (int parts : {2, 3, 4}) {
        c.k_parts = parts;
        out.push_back(c);
      }
  }
  if (size_or(gemm.m) <= 64) {
    for (int tn : {16, 32, 64}) {
      for (int tk : fp8 ? std::vector<int>{128} : std::vector<int>{128, 256}) {
        KernelConfig c = make_config(MainloopSchedule::pingpong, TileSchedulerKind::persistent, 64, tn, tk, 1, 1, 1, gemm);
        c.swap_ab = true;
        out.push_back(c);
      }
      for (int splits : {1, 2, 4}) {
        KernelConfig c = make_config(MainloopSchedule::cooperative, TileSchedulerKind::stream_k, 128, tn, 128, 1, 1,
                                     splits, gemm);
        c.swap_ab = true;
        out.push_back(c);
      }
    }
    // K in parts added by a second kernel, where the transposed tiles alone leave most
    // multiprocessors idle (N = 1024: 16 tiles of 64 rows; cuBLAS splits K there, Nsight
    // Compute on the H200: bench/results/20261129-1500-h200-ncu-decode.csv); and 64-row
    // untransposed tiles of 160 columns over a wide N (16x10240x8192: 64 tiles). Untransposed
    // 64x64 and 64x128 tiles in parts were slower than these at every decode shape of the H200's
    // sweep (bench/results/20261129-1830-h200-gemm-sweep.json).
    for (int parts : {2, 3, 4, 6, 8}) {
      for (int tn : {16, 32}) {
        KernelConfig c = make_config(MainloopSchedule::pingpong, TileSchedulerKind::persistent, 64, tn, 128, 1, 1, 1, gemm);
        c.swap_ab = true;
        c.k_parts = parts;
        out.push_back(c);
      }
      if (parts <= 4 && !fp8) {
        KernelConfig c = make_config(MainloopSchedule::pingpong, TileSchedulerKind::persistent, 64, 160, 64, 1, 1, 1, gemm);
        c.k_parts = parts;
        out.push_back(c);
      }
    }
  }
  return out;
}

}  // namespace

std::string operand_layout_refusal(const KernelConfig& c, const GemmDesc& gemm) {
  // The kernel's A and B after any swap-AB: the transposed kernel reads Bᵀ as its A, Aᵀ as its B.
  const GemmDesc k = c.swap_ab ? swapped_gemm(gemm) : gemm;
  // CUTLASS's shared-memory layout for an operand contiguous along M (A column-major) or N (B
  // row-major) swizzles 128 bytes of that axis where the tile's extent is a multiple of 128
  // bytes, else 64, else 32. Measured on the H200 with B row-major, bias and residual in the
  // epilogue (bench/results/20261130-1707-h200-gemm-sweep-layout-rr-tile-widths.json), ping-pong
  // 128x112 and 128x144 (32-byte swizzle) took 1.5-2.0x the time of 128x128 or 128x160 at five
  // shapes: 240.7 against 131.6 us at 4096x1600x6400 (GPT-2's MLP down projection in a training
  // step, where the residual table's entry, measured with B column-major, is 128x144).
  auto refusal = [&](const char* operand, const char* layout, const char* extent_of, int extent, DType t) {
    const int64_t bytes = int64_t(extent) * dtype_bytes(t);
    if (bytes % 64 == 0) return std::string();
    return fmt::format("the kernel reads {} {}, and {} {} of {} make {}-byte rows of it in shared memory, which "
                       "CUTLASS swizzles 32 bytes wide (slow; a multiple of 64 bytes is not)",
                       operand, layout, extent, extent_of, dtype_name(t), bytes);
  };
  if (k.a_layout == Layout::col_major)
    if (std::string why = refusal("A", "column-major", "tile rows", c.tile_m, k.a_dtype); !why.empty()) return why;
  if (k.b_layout == Layout::row_major)
    if (std::string why = refusal("B", "row-major", "tile columns", c.tile_n, k.b_dtype); !why.empty()) return why;
  return {};
}

std::string prune_reason(const KernelConfig& c, const Graph& g, const GemmDesc& gemm,
                         const DeviceLimits& device) {
  if (!KernelConfig::parse(c.name())) return "not a configuration CUTLASS's sm90 kernels build";
  if (std::string why = config_refusal(c, gemm); !why.empty()) return why;
  // Accumulators per thread, twice over for fp8's two-level accumulation.
  const int copies = is_fp8(gemm.a_dtype) && !c.fp8_fast_accum ? 2 : 1;
  if (const int64_t held = copies * accumulators_per_thread(c); held > kMaxAccumulatorsPerThread)
    return fmt::format("{} accumulators per thread do not fit in registers", held);
  // The shared-memory model every choice asks (runtime/shared_memory_model.hpp): what this
  // epilogue stages per CTA with `c`, and the main-loop stages left beside it.
  if (mainloop_stages(c, gemm, epilogue_smem_bytes(g, c)) < 3)
    return "fewer than 3 main-loop stages fit in shared memory beside the epilogue's";
  if (c.swap_ab)
    if (std::string why = swap_ab_refusal(g, gemm); !why.empty()) return "no transposed kernel: " + why;
  if (std::string why = operand_layout_refusal(c, gemm); !why.empty()) return why;
  const GemmDesc tiled = tiled_problem(c, gemm);
  const int64_t tiles_m = ceil_div(size_or(tiled.m), c.tile_m);
  const int64_t tiles_n = ceil_div(size_or(tiled.n), c.tile_n);
  if (tiles_m < c.cluster_m || tiles_n < c.cluster_n)
    return fmt::format("cluster {}x{} is wider than the {}x{} tile grid", c.cluster_m, c.cluster_n,
                       tiles_m, tiles_n);
  if (padding_beyond_the_shortest_tile(c, gemm) < 0.5) return "more than half of the tile grid is padding";
  // Reductions: persistent kernels only, and 32-column epilogue subtiles for column ones.
  if (std::string why = epilogue_config_refusal(g, c); !why.empty()) return why;
  if (const int parts = c.splits * c.k_parts; parts > 1) {
    // Split-K (in the kernel, or in parts added by a second kernel) pays where the tiles alone
    // leave multiprocessors idle, with K long enough that every part keeps several K tiles.
    if (tile_count(c, gemm) * parts > 2 * int64_t(device.sm_count))
      return fmt::format("{} tiles split {} ways are more than two waves", tile_count(c, gemm), parts);
    if (tile_count(c, gemm) >= int64_t(device.sm_count)) return "the tiles alone fill the multiprocessors";
    return k_split_refusal(c, gemm);
  }
  if (c.scheduler == TileSchedulerKind::stream_k) {
    KernelConfig persistent = c;
    persistent.scheduler = TileSchedulerKind::persistent;
    if (wave_efficiency(persistent, gemm, device) >= 0.85)
      return "the persistent grid already fills its waves (stream-K would only add fix-up)";
    if (size_or(gemm.k) < 8 * c.tile_k) return "K is too short to split";
  }
  return {};
}

std::string k_split_refusal(const KernelConfig& c, const GemmDesc& gemm) {
  const int parts = c.splits * c.k_parts;
  if (parts <= 1) return {};
  const int64_t k = size_or(gemm.k);
  if (k < 4 * parts * c.tile_k) return "K is too short to split that many ways";
  if (c.k_parts > 1 && k < c.k_parts * kMinKPerPart)
    return fmt::format("K is too short for {} parts (each would hold {} of K, under {})", c.k_parts, k / c.k_parts,
                       kMinKPerPart);
  return {};
}

double grid_efficiency(const KernelConfig& c, const GemmDesc& gemm, const DeviceLimits& device) {
  // Split-K (and K in parts) runs tiles × parts units of work in waves; stream-K balances its waves.
  double waves = c.scheduler == TileSchedulerKind::stream_k ? 0.95 : wave_efficiency(c, gemm, device);
  if (c.splits > 1 || c.k_parts > 1) {
    const int64_t units = tile_count(c, gemm) * c.splits * c.k_parts;
    waves = double(units) / double(ceil_div(units, device.sm_count) * device.sm_count);
  }
  return waves * padding_efficiency(c, gemm);
}

double heuristic_score(const KernelConfig& c, const GemmDesc& gemm, const DeviceLimits& device) {
  // Arithmetic intensity of a tile (MN / (M+N)), relative to a 128×256 tile's; larger tiles
  // (256×192) earn no more: they measured within a few per cent of 128×256 and of ping-pong
  // 128×192 (bench/results/20261124-2334-h200-visit-order.json).
  const double intensity =
      std::min(1.0, (double(c.tile_m) * c.tile_n / (c.tile_m + c.tile_n)) / (256.0 * 128.0 / 384.0));
  // Orderings measured on an H100 (bench/results/*-config-sweep.txt): a 2×1 cluster shares
  // B's tiles by multicast; ping-pong pays off when the main loop is short.
  const double cluster = c.cluster_m == 2 && c.cluster_n == 1 ? 1.0 : c.cluster_m * c.cluster_n == 1 ? 0.97 : 0.98;
  const double sched = c.schedule == MainloopSchedule::pingpong && size_or(gemm.k) > 2048 ? 0.97 : 1.0;
  if (small_grid(gemm, device)) {
    // B streams from memory: what counts is the share of multiprocessors pulling it, then the
    // padding; a tile's intensity matters little.
    const int64_t units = c.scheduler == TileSchedulerKind::stream_k && c.splits == 1
                              ? int64_t(device.sm_count)
                              : tile_count(c, gemm) * c.splits * c.k_parts;
    const double busy = std::min(1.0, double(units) / device.sm_count);
    return busy * padding_beyond_the_shortest_tile(c, gemm) * (0.9 + 0.1 * std::sqrt(intensity)) * sched;
  }
  return grid_efficiency(c, gemm, device) * std::sqrt(intensity) * cluster * sched;
}

std::vector<KernelConfig> candidate_configs(const Graph& g, const GemmDesc& gemm,
                                            const DeviceLimits& device, size_t max_candidates) {
  std::vector<std::pair<double, KernelConfig>> scored;
  for (const KernelConfig& c : whole_space(gemm, device))
    if (prune_reason(c, g, gemm, device).empty()) scored.emplace_back(heuristic_score(c, gemm, device), c);
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  // The heuristic default always competes, so tuning never picks something worse than it.
  // Then the best of each (schedule, tile, tile scheduler) family, best family first, so a
  // small budget spans the kinds of kernel rather than one tile's cluster shapes; then the
  // families' next-best, and so on.
  std::vector<KernelConfig> out{default_config(g, gemm)};
  std::vector<std::vector<KernelConfig>> families;
  for (const auto& [score, c] : scored) {
    auto same = [&](const std::vector<KernelConfig>& f) {
      return f[0].schedule == c.schedule && f[0].tile_m == c.tile_m && f[0].tile_n == c.tile_n &&
             f[0].scheduler == c.scheduler && f[0].swap_ab == c.swap_ab && f[0].k_parts == c.k_parts;
    };
    auto it = std::find_if(families.begin(), families.end(), same);
    if (it == families.end()) families.push_back({c});
    else it->push_back(c);
  }
  // The best family of the other schedule goes second, so even a budget of three or four
  // candidates tries both schedules.
  if (!families.empty()) {
    const auto other = std::find_if(families.begin() + 1, families.end(), [&](const auto& f) {
      return f[0].schedule != families[0][0].schedule;
    });
    if (other != families.end()) std::rotate(families.begin() + 1, other, other + 1);
  }
  for (size_t rank = 0;; ++rank) {
    bool any = false;
    for (const auto& f : families) {
      if (rank >= f.size()) continue;
      any = true;
      if (max_candidates && out.size() >= max_candidates) return out;
      if (std::find(out.begin(), out.end(), f[rank]) == out.end()) out.push_back(f[rank]);
    }
    if (!any) return out;
  }
}

}  // namespace evtc::tuning
