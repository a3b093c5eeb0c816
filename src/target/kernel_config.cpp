// Kernel configurations: their names, and which ones a target's kernels can be built with.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <regex>
#include <tuple>

#include "evtc/arch.hpp"
#include "evtc/kernel_config.hpp"

namespace evtc {

std::string KernelConfig::name() const {
  if (schedule == MainloopSchedule::multistage)
    return fmt::format("ms_{}x{}x{}_s{}{}", tile_m, tile_n, tile_k, stages, precise_math ? "_precise" : "");
  return fmt::format("{}_{}x{}x{}_c{}x{}_{}{}{}{}{}{}",
                     schedule == MainloopSchedule::cooperative ? "coop" : "pingpong", tile_m,
                     tile_n, tile_k, cluster_m, cluster_n,
                     scheduler == TileSchedulerKind::persistent ? std::string("persistent")
                     : splits > 1                               ? fmt::format("splitk{}", splits)
                                                                : std::string("streamk"),
                     k_parts > 1 ? fmt::format("_kparts{}", k_parts) : "", swap_ab ? "_swap" : "", fp8_fast_accum ? "_fastacc" : "",
                     fp8_promotion_k > 0 ? fmt::format("_pk{}", fp8_promotion_k) : "",
                     precise_math ? "_precise" : "");
}

std::string VisitOrder::name() const {
  const char* direction = raster == Raster::along_m   ? "along_m"
                          : raster == Raster::along_n ? "along_n"
                                                      : "heuristic";
  return swizzle > 1 ? fmt::format("{}_s{}", direction, swizzle) : std::string(direction);
}

std::optional<VisitOrder> VisitOrder::parse(const std::string& name) {
  static const std::regex form(R"((heuristic|along_m|along_n)(?:_s([248]))?)");
  std::smatch m;
  if (!std::regex_match(name, m, form)) return std::nullopt;
  VisitOrder o;
  o.raster = m[1] == "along_m" ? Raster::along_m : m[1] == "along_n" ? Raster::along_n : Raster::heuristic;
  o.swizzle = m[2].matched ? std::stoi(m[2]) : 1;
  return o;
}

const char* VisitOrder::forms() {
  return "heuristic, along_m or along_n, optionally with a strip width _s2, _s4 or _s8: e.g. along_n_s8";
}

std::vector<VisitOrder> VisitOrder::all() {
  std::vector<VisitOrder> out{VisitOrder{}};
  for (Raster r : {Raster::along_m, Raster::along_n})
    for (int s : {1, 2, 4, 8}) out.push_back({r, s});
  return out;
}

KernelConfig KernelConfig::of(MainloopSchedule schedule, int tile_m, int tile_n, int cluster_m,
                              TileSchedulerKind scheduler) {
  KernelConfig c;
  c.schedule = schedule;
  c.tile_m = tile_m;
  c.tile_n = tile_n;
  c.cluster_m = cluster_m;
  c.cluster_n = 1;
  c.scheduler = scheduler;
  return c;
}

KernelConfig KernelConfig::multistage_of(int tile_m, int tile_n, int tile_k, int stages) {
  KernelConfig c;
  c.schedule = MainloopSchedule::multistage;
  c.tile_m = tile_m;
  c.tile_n = tile_n;
  c.tile_k = tile_k;
  c.stages = stages;
  c.cluster_m = c.cluster_n = 1;
  return c;
}

std::optional<KernelConfig> KernelConfig::parse(const std::string& name) {
  // The sm_80 backend's tiles: CUTLASS 2.x's tensor-op shapes, whose warp tiles
  // (sm80::warp_shape) divide them into 4 or 8 warps.
  static const std::regex ms(R"(ms_(\d{2,3})x(\d{2,3})x(\d{2})_s([2-6])(_precise)?)");
  if (std::smatch m; std::regex_match(name, m, ms)) {
    const int tm = std::stoi(m[1]), tn = std::stoi(m[2]), tk = std::stoi(m[3]);
    static const int kTiles[][3] = {{128, 256, 64}, {256, 128, 64}, {128, 128, 64}, {128, 256, 32},
                                    {256, 128, 32}, {128, 128, 32}, {64, 128, 64},  {64, 128, 32},
                                    {128, 64, 64},  {64, 64, 64}};
    bool known = false;
    for (const auto& t : kTiles) known = known || (t[0] == tm && t[1] == tn && t[2] == tk);
    if (!known) return std::nullopt;
    KernelConfig c = multistage_of(tm, tn, tk, std::stoi(m[4]));
    c.precise_math = m[5].matched;
    return c;
  }
  static const std::regex re(
      R"((coop|pingpong)_(\d+)x(\d+)x(\d+)_c(\d+)x(\d+)_(persistent|streamk|splitk(\d{1,2}))(?:_kparts(\d{1,2}))?(_swap)?(_fastacc)?(?:_pk(\d{3,5}))?(_precise)?)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return std::nullopt;
  // Sizes CUTLASS's sm90 builders take: tiles of 64, 128 or 256 rows and any multiple of 16
  // columns up to 256 (a wgmma's N is a multiple of 8 up to 256, and the epilogue's subtiles
  // are 16 or 32 columns wide; M is split in 64-row steps), K tiles of 32 to 256, clusters of
  // 1, 2 or 4; stream-K and split-K (2 to 16 parts) with the cooperative schedule only.
  auto one_of = [](const std::string& v, std::initializer_list<int> allowed) -> std::optional<int> {
    if (v.size() > 4) return std::nullopt;
    const int x = std::stoi(v);
    for (int a : allowed)
      if (a == x) return x;
    return std::nullopt;
  };
  KernelConfig c;
  c.schedule = m[1] == "coop" ? MainloopSchedule::cooperative : MainloopSchedule::pingpong;
  auto multiple_of_16 = [](const std::string& v) -> std::optional<int> {
    if (v.size() > 3) return std::nullopt;
    const int x = std::stoi(v);
    return x >= 16 && x <= 256 && x % 16 == 0 ? std::optional<int>(x) : std::nullopt;
  };
  const auto tm = one_of(m[2], {64, 128, 256}), tn = multiple_of_16(m[3]),
             tk = one_of(m[4], {32, 64, 128, 256}), cm = one_of(m[5], {1, 2, 4}),
             cn = one_of(m[6], {1, 2, 4});
  if (!tm || !tn || !tk || !cm || !cn) return std::nullopt;
  c.tile_m = *tm;
  c.tile_n = *tn;
  c.tile_k = *tk;
  c.cluster_m = *cm;
  c.cluster_n = *cn;
  c.scheduler = m[7] == "persistent" ? TileSchedulerKind::persistent : TileSchedulerKind::stream_k;
  if (m[8].matched) {
    c.splits = std::stoi(m[8]);
    if (c.splits < 2 || c.splits > 16 || m[8].str()[0] == '0') return std::nullopt;
  }
  if (m[9].matched) {
    // K in parts summed by a second kernel: 2 to 16 of them, with the persistent scheduler.
    c.k_parts = std::stoi(m[9]);
    if (c.k_parts < 2 || c.k_parts > 16 || m[9].str()[0] == '0' || c.scheduler != TileSchedulerKind::persistent)
      return std::nullopt;
  }
  c.swap_ab = m[10].matched;
  c.fp8_fast_accum = m[11].matched;
  if (m[12].matched) {
    c.fp8_promotion_k = std::stoi(m[12]);
    // Whole K tiles, and not combined with fast accumulation (which never promotes).
    if (c.fp8_promotion_k % c.tile_k != 0 || c.fp8_fast_accum) return std::nullopt;
  }
  c.precise_math = m[13].matched;
  if (c.schedule == MainloopSchedule::pingpong && c.scheduler == TileSchedulerKind::stream_k)
    return std::nullopt;  // CUTLASS's ping-pong kernel has no stream-K (nor split-K)
  if (c.schedule == MainloopSchedule::cooperative && c.tile_m < 128) return std::nullopt;
  return c;
}


bool reduces_over_kernel_m(ReduceAxis axis, const KernelConfig& c) {
  return c.swap_ab ? axis == ReduceAxis::row : axis == ReduceAxis::col;
}

std::string epilogue_config_refusal(const Graph& g, const KernelConfig& c) {
  // Every reduction feeds an output (a store) that names it.
  for (const Node& store : g.nodes()) {
    if (store.kind != NodeKind::store || store.inputs.empty()) continue;
    const Node& r = g.node(store.inputs[0]);
    if (r.kind != NodeKind::reduce) continue;
    if (c.scheduler == TileSchedulerKind::stream_k)
      return fmt::format("configuration {} splits the K loop of output tiles (stream-K or split-K), which an "
                         "epilogue with reductions ('{}') cannot take; use a persistent configuration",
                         c.name(), store.name);
    if (c.k_parts > 1)
      return fmt::format("configuration {} adds its K parts in a second kernel, whose reductions ('{}') would "
                         "combine with atomics in no fixed order; use a configuration without _kparts",
                         c.name(), store.name);
    const bool over_kernel_m = reduces_over_kernel_m(r.axis, c);
    // nvcc: CUTLASS's reduction over M fails its layout divisibility assertions on 16-column
    // subtiles with tiles of 128 rows or more (ping-pong 128x112, cooperative 256x144), and in
    // transposed 64-row kernels wider than 80 columns (64x96 and 64x112 with a row_sum; 64x16
    // and 64x80 compile, as do untransposed 64x256 tiles with column sums). Untransposed 64-row
    // tiles with a column sum (nvcc, 2026-11-29): 80 and 192 columns compile, 96, 112, 144, 160 and
    // 176 fail CUTLASS's divisibility or reduction-buffer assertions (evtc fuzz found 176: seed
    // 20261128, kernel 263); 48, 128 and 256 compiled before. So wider than 80, multiples of 64.
    if (!over_kernel_m) continue;
    const bool sixteen_column_subtiles = c.tile_m >= 128 && c.tile_n % 32 != 0;
    if (c.swap_ab) {
      if (sixteen_column_subtiles || c.tile_n > 80)
        return fmt::format("configuration {} is a transposed kernel {} columns wide; its reduction over N "
                           "('{}', over the transposed kernel's M) does not compile in CUTLASS's epilogue "
                           "wider than 80 columns (use a narrower transposed tile or an untransposed one)",
                           c.name(), c.tile_n, store.name);
      continue;
    }
    if (c.tile_m == 64 && c.tile_n > 80 && c.tile_n % 64 != 0)
      return fmt::format("configuration {} has 64-row tiles {} columns wide; its reduction over M ('{}') "
                         "does not compile in CUTLASS's epilogue at such widths (use at most 80 "
                         "columns, or a multiple of 64)",
                         c.name(), c.tile_n, store.name);
    if (sixteen_column_subtiles)
      return fmt::format("configuration {} has {}-column tiles, which CUTLASS's epilogue works through in "
                         "16-column subtiles; its reduction over M ('{}') needs subtiles of at least 32 "
                         "columns with tiles of {} rows (use a width that is a multiple of 32, or 64-row "
                         "tiles)",
                         c.name(), c.tile_n, store.name, c.tile_m);
  }
  return "";
}

std::string config_refusal(const KernelConfig& c, const GemmDesc& gemm) {
  // What the target architecture's kernels have (evtc/arch.hpp).
  const ArchFeatures& f = backend_features(gemm.sm, gemm.a_dtype);
  if (f.backend == 80 && c.schedule != MainloopSchedule::multistage)
    return fmt::format("configuration {} is a warp-specialized (sm_90a-style) one; {} kernels take multistage "
                       "configurations (e.g. {})",
                       c.name(), arch_name(gemm.sm, true), KernelConfig::multistage_of(128, 128, 32, 4).name());
  if (f.fused && f.backend != 80 && c.schedule == MainloopSchedule::multistage)
    return fmt::format("configuration {} is a multistage (sm_80 backend) one; {} kernels take cooperative or "
                       "ping-pong configurations",
                       c.name(), arch_name(gemm.sm, true));
  if (c.schedule == MainloopSchedule::multistage) {
    // The main loop's stages of A and B tiles must fit in the architecture's shared memory.
    const int64_t bytes = int64_t(c.stages) * (c.tile_m + c.tile_n) * c.tile_k * dtype_bytes(gemm.a_dtype);
    const int64_t limit = max_shared_memory_per_block(gemm.sm);
    if (bytes > limit)
      return fmt::format("configuration {} stages {} KiB of A and B tiles; {} has {} KiB of shared memory per "
                         "block",
                         c.name(), bytes / 1024, arch_name(gemm.sm), limit / 1024);
    return "";
  }
  if (f.fused && !f.pingpong && c.schedule == MainloopSchedule::pingpong)
    return fmt::format("configuration {} is ping-pong, which {} kernels do not have", c.name(),
                       arch_name(gemm.sm, true));
  if (f.fused && !f.clusters && c.cluster_m * c.cluster_n > 1)
    return fmt::format("configuration {} has a {}×{} cluster; {} kernels run without clusters (1×1)", c.name(),
                       c.cluster_m, c.cluster_n, arch_name(gemm.sm, true));
  if (f.fused && !f.any_tile_n && c.splits > 1)
    return fmt::format("configuration {} asks for split-K, which evtc's {} kernels do not use", c.name(),
                       arch_name(gemm.sm, true));
  if (c.k_parts > 1 && (!f.fused || !f.k_parts))
    return fmt::format("configuration {} computes K in parts added by a second kernel (_kparts), which evtc's {} "
                       "kernels do not do",
                       c.name(), arch_name(gemm.sm, true));
  if (c.k_parts > 1 && gemm.fp8_blockwise)
    return fmt::format("configuration {} computes K in parts (_kparts), but a block-scaled fp8 GEMM's scales are laid "
                       "out for one K loop",
                       c.name());
  if (c.k_parts > 1 && gemm.k > 0) {
    // Each part is a batch entry of the GEMM, its operands' K slices 16-byte aligned for TMA.
    const int64_t per_16_bytes = 16 / std::min(dtype_bytes(gemm.a_dtype), dtype_bytes(gemm.b_dtype));
    if (gemm.k % c.k_parts != 0 || (gemm.k / c.k_parts) % per_16_bytes != 0)
      return fmt::format("configuration {} splits K = {} into {} parts, which must each be a multiple of {} "
                         "elements (16 bytes)",
                         c.name(), gemm.k, c.k_parts, per_16_bytes);
  }
  if (f.fused && !f.stream_k && c.scheduler == TileSchedulerKind::stream_k)
    return fmt::format("configuration {} asks for stream-K, which evtc's {} kernels do not use", c.name(),
                       arch_name(gemm.sm, true));
  if (f.fused && !f.any_tile_n && c.tile_n != 64 && c.tile_n != 128 && c.tile_n != 192 && c.tile_n != 256)
    return fmt::format("configuration {} has {}-column tiles; {} kernels take 64, 128, 192 or 256 columns", c.name(),
                       c.tile_n, arch_name(gemm.sm, true));
  if (c.swap_ab && (!f.fused || !f.swap_ab))
    return fmt::format("configuration {} computes the GEMM transposed (swap-AB), which evtc's {} kernels do not do",
                       c.name(), arch_name(gemm.sm, true));
  if (c.swap_ab && gemm.fp8_blockwise)
    return fmt::format("configuration {} computes the GEMM transposed (swap-AB), but a block-scaled fp8 GEMM's "
                       "scales are laid out for the untransposed operands",
                       c.name());
  if (f.fused && !f.two_level_fp8 && (c.fp8_fast_accum || c.fp8_promotion_k > 0))
    return fmt::format("configuration {} sets fp8's accumulation ({}), which only Hopper's two-level fp8 main "
                       "loop has",
                       c.name(), c.fp8_fast_accum ? "_fastacc" : "_pk");
  if (f.two_sm_mma && c.tile_m != 64 && c.tile_m != 128 && c.tile_m != 256)
    return fmt::format("configuration {} has {}-row tiles; {}'s MMA takes 64 or 128 rows on one SM, 256 on two",
                       c.name(), c.tile_m, arch_name(gemm.sm, true));
  if (f.two_sm_mma && c.tile_m == 256 && c.cluster_m % 2 != 0)
    return fmt::format("configuration {} has 256-row tiles, which {} computes on two SMs of a cluster: the "
                       "cluster's M must be even (e.g. c2x1)",
                       c.name(), arch_name(gemm.sm, true));
  if (c.fp8_promotion_k > 0 &&
      (!is_fp8(gemm.a_dtype) || gemm.fp8_blockwise || gemm.fp8_fast_accum || c.fp8_fast_accum))
    return fmt::format("configuration {} sets fp8's promotion interval (_pk{}), which only the two-level "
                       "accumulation of fp8 A/B without block scales has",
                       c.name(), c.fp8_promotion_k);
  // CUTLASS's two-level fp8 main loop promotes every fp8_promotion_k (default 128) of K, counted
  // in whole K tiles: a K tile longer than the interval, or one that does not divide it, never
  // meets it (can_implement refuses the problem).
  if (is_fp8(gemm.a_dtype) && !gemm.fp8_blockwise && !gemm.fp8_fast_accum && !c.fp8_fast_accum &&
      backend_features(gemm.sm, gemm.a_dtype).two_level_fp8) {
    const int interval = c.fp8_promotion_k > 0 ? c.fp8_promotion_k : 128;
    if (interval % c.tile_k != 0)
      return fmt::format("configuration {} has K tiles of {}, but fp8's two-level accumulation promotes every {} "
                         "of K, which must be a whole number of K tiles (K tiles of 128, or fast accumulation: "
                         "_fastacc)",
                         c.name(), c.tile_k, interval);
  }
  if (!gemm.fp8_blockwise) return "";
  if (c.tile_n % kFp8ScaleBlock != 0 || c.tile_k % kFp8ScaleBlock != 0)
    return fmt::format("configuration {} has {}×{} (N×K) tiles, but a block-scaled fp8 GEMM needs tiles "
                       "whose N and K are multiples of its {}-wide scale blocks (e.g. coop_128x128x128_c1x1_persistent)",
                       c.name(), c.tile_n, c.tile_k, kFp8ScaleBlock);
  if (c.fp8_fast_accum)
    return fmt::format("configuration {} asks for fast accumulation, which a block-scaled fp8 GEMM does not have",
                       c.name());
  return "";
}

bool overlapped_fp8_promotion(const KernelConfig& c, const GemmDesc& gemm) {
  if (!is_fp8(gemm.a_dtype) || !is_fp8(gemm.b_dtype) || gemm.fp8_blockwise || gemm.fp8_fast_accum ||
      c.fp8_fast_accum || c.fp8_promotion_k > 0 || c.tile_k != 128)
    return false;
  if (c.schedule != MainloopSchedule::cooperative && c.schedule != MainloopSchedule::pingpong) return false;
  if (!backend_features(gemm.sm, gemm.a_dtype).overlapped_fp8_promotion) return false;
  // The accumulators and two temporary sets.
  return 3 * accumulators_per_thread(c) <= kMaxAccumulatorsPerThread;
}

int64_t accumulators_per_thread(const KernelConfig& c) {
  const int threads = c.schedule == MainloopSchedule::pingpong ? 128 : 256;
  return int64_t(c.tile_m) * c.tile_n / threads;
}

}  // namespace evtc
