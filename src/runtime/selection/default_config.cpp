// The configuration a problem runs with when none is given and none is tuned: the shipped
// table of the GPU it runs on (selection/shipped_table.hpp) where it has one and the epilogue is
// of the kind the table was measured with, else the rules below, each with its measurement.
#include "runtime/selection/default_config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "evtc/arch.hpp"
#include "runtime/selection/candidates.hpp"
#include "runtime/selection/tuning_store.hpp"
#include "target/device_info.hpp"
#include "runtime/shared_memory_model.hpp"

namespace evtc {

namespace selection {
namespace {

// What tells the tables' epilogue classes apart (light_epilogue, operand_epilogue): the outputs,
// the [m,n] operands (aux or C) and how many nodes read the accumulator (gate/up halves not
// counted).
struct EpilogueTraits {
  int stores = 0, operands = 0, acc_reads = 0;
  bool wide_store = false;     // an output of more than 2 bytes an element
  bool partial_store = false;  // an output not of [m,n]
  bool wide_operand = false;   // an [m,n] operand of more than 2 bytes an element
  bool reduces = false, gated = false;
};

EpilogueTraits traits_of(const Graph& g) {
  EpilogueTraits t;
  for (const Node& n : g.nodes()) {
    t.reduces |= n.kind == NodeKind::reduce;
    t.gated |= n.kind == NodeKind::pair;
    if (n.kind == NodeKind::aux || n.kind == NodeKind::source) {
      ++t.operands;
      t.wide_operand |= dtype_bytes(n.dtype) > 2;
    }
    if (n.kind == NodeKind::store) {
      ++t.stores;
      t.wide_store |= dtype_bytes(n.dtype) > 2;
      t.partial_store |= n.shape != Shape::full;
    }
    if (n.kind != NodeKind::pair)
      for (NodeId in : n.inputs) t.acc_reads += g.node(in).kind == NodeKind::accum;
  }
  return t;
}

}  // namespace

// One 16-bit output ([m,n], or [m,n/2] gated), no [m,n] operand (aux or C), no reduction, and
// the accumulator read once (or by the gate/up halves only): the epilogues the 192-column
// tiles were measured with, and ones like them that keep beside 192 accumulators a thread
// what fits in registers (ptxas -v, no spills: silu(acc + bias), swiglu7,
// tanh(gelu(acc·sa[m]·sb[n] + bias[n])·0.5 + 1); spills: three outputs and an [m,n] operand,
// or acc read at three places, at 256×192 and ping-pong 128×192).
bool light_epilogue(const Graph& g) {
  const EpilogueTraits t = traits_of(g);
  return !t.reduces && t.operands == 0 && t.stores == 1 && !t.wide_store && t.acc_reads <= 1;
}

bool moves_matrices_besides_d(const Graph& g) {
  const EpilogueTraits t = traits_of(g);
  return !t.reduces && !t.gated && !t.wide_store && !t.wide_operand && !t.partial_store &&
         t.operands + t.stores - 1 >= kMatricesBesidesD;
}

bool few_accumulators(const KernelConfig& c) { return accumulators_per_thread(c) <= kFewAccumulators; }

bool other_layout_entries(const GemmDesc& gemm) {
  return !is_fp8(gemm.a_dtype) && gemm.a_layout == Layout::row_major &&
         (gemm.m <= kOtherLayoutSmallRows || gemm.m >= kOtherLayoutRows);
}

bool operand_epilogue(const Graph& g) {
  const EpilogueTraits t = traits_of(g);
  return !t.reduces && !t.gated && t.operands == 1 && !t.wide_operand && t.stores == 1 && !t.wide_store &&
         !t.partial_store && t.acc_reads <= 1;
}

bool decode_table_epilogue(const Graph& g, const GemmDesc& gemm) {
  if (gemm.m <= 0 || gemm.m > kDecodeRows) return false;
  for (const Node& n : g.nodes())
    if (n.kind == NodeKind::reduce) return false;
  return true;
}

bool reduces_over_m(const Graph& g) {
  for (const Node& n : g.nodes())
    if (n.kind == NodeKind::reduce && n.axis != ReduceAxis::row) return true;
  return false;
}

tuning::DeviceLimits limits_of(const std::optional<DeviceInfo>& dev) {
  tuning::DeviceLimits limits;
  if (dev && dev->sm_count > 0) limits.sm_count = dev->sm_count;
  return limits;
}

tuning::DeviceLimits current_device_limits() { return limits_of(current_device()); }

std::optional<KernelConfig> one_token_tile(const KernelConfig& c, const GemmDesc& gemm,
                                           const tuning::DeviceLimits& device, int64_t measured_m) {
  // Measured on the H200 at 80×5120×3072: the M = 64 entry's 64×64 transposed tile runs 160
  // tiles at 1.855× cuBLAS, 64×80 runs 80 at 1.039×
  // (bench/results/20261128-1742-h200-gemm-sweep-mid-m-transposed.json; the old and new picks
  // at six shapes: 20261128-1759-h200-gemm-sweep-widened-transposed.json).
  // Where the two tiles across M fit one wave they run side by side and share B in L2:
  // 40×3072×3072 keeps the M = 32 entry's 64×32 tile (96 tiles, 0.921×).
  // An untransposed entry's 64-row tiles split such an M the same way (two row tiles, B read
  // once by each): at 80x5120x3072 the M = 64 entry's untransposed 64x48 tile, 214 tiles, took
  // 2.01x cuBLAS (bench/results/20261129-2140-h200-gemm-shapes-off-grid.json), the transposed
  // 64x80 tile 1.04-1.05x (-2123/-2132/-2142 there).
  const int64_t rows = c.swap_ab ? c.tile_n : c.tile_m;
  if (gemm.m <= rows) return std::nullopt;
  const auto width = tuning::transposed_width_holding(gemm.m);
  if (!width || tuning::tile_count(c, gemm) <= device.sm_count) return std::nullopt;
  if (!c.swap_ab) {
    // Only a tile that held its own shape's M in one row tile: an entry measured at a larger M
    // split its own rows too, and was the fastest there.
    if (measured_m <= 0 || measured_m > c.tile_m) return std::nullopt;
    KernelConfig t = KernelConfig::of(MainloopSchedule::pingpong, 64, *width, 1);
    t.tile_k = c.tile_k == 64 && !is_fp8(gemm.a_dtype) ? 128 : c.tile_k;
    t.swap_ab = true;
    return t;
  }
  KernelConfig wide = c;
  wide.tile_n = *width;
  return wide;
}

std::optional<KernelConfig> mid_m_transposed_tile(const GemmDesc& gemm, const tuning::DeviceLimits& device) {
  // Measured on the H200 against the picks before, each pair in one run (bench/results/20261128-
  // 2123-h200-gemm-sweep-mid-m-transposed-coop.json, -2132-...-mid-m-validation.json and
  // -2142-...-mid-m-one-tile-more.json): 96x16384x3072 1.231 -> 1.010x cuBLAS (one tile of 96),
  // 88x11008x4096 1.302 -> 1.041x (one of 96), 200x7168x5120 1.218 -> 1.051x (two of 112),
  // 216x6144x4096 1.099 -> 1.018x (two of 112), 176x28672x4096 1.281 -> 1.166x (two of 96),
  // 280x22016x4096 2.136 -> 1.038x (three of 96; two of 144 leave a part wave: 1.100x),
  // 240x11008x4096 1.147 -> 1.048x (three of 80), 136x18432x2304 1.418 -> 1.199x (two of 80),
  // 300x35840x5120 1.274 -> 1.171x (three of 112; four of 80 took 1.112x). 112x14336x4096 took
  // 1.040x against 1.038x. Where N is short (100x3072x8192: 24 such tiles) every cooperative
  // transposed tile was slower than the entry's: the rule stands aside below half a wave.
  // Whole 64-row tiles pad nothing (the tables' own M = 128 and 256 entries reach 0.86-1.08x
  // with them), so a multiple of 64 keeps the entry's.
  if (gemm.m <= 64 || gemm.m > 320 || gemm.m % 64 == 0 || gemm.n <= 0) return std::nullopt;
  auto tile = [&](int tiles) -> std::optional<KernelConfig> {
    const auto width = tuning::transposed_width_splitting(gemm.m, tiles);
    if (!width) return std::nullopt;
    KernelConfig c = KernelConfig::of(MainloopSchedule::cooperative, 128, *width, 1);
    c.swap_ab = true;
    return c;
  };
  const int first = int((gemm.m + 159) / 160);  // at most 160 columns a tile
  auto best = tile(first);
  if (!best || 2 * tuning::tile_count(*best, gemm) < device.sm_count) return std::nullopt;
  // One tile more across M where its grid fills the waves better (240x11008: two tiles of 128
  // make 172 tiles, 1.3 waves; three of 80 make 258, 1.95).
  if (const auto more = tile(first + 1);
      more && tuning::grid_efficiency(*more, gemm, device) > tuning::grid_efficiency(*best, gemm, device) + 1e-9)
    best = more;
  return best;
}

std::optional<KernelConfig> entry_tile_count_width(const KernelConfig& c, const GemmDesc& gemm,
                                                   const TableEntry& entry, const tuning::DeviceLimits& device) {
  // Measured on the H200 (bench/results/20261202-0242-h200-gemm-sweep-decode-off-grid.json:
  // M = 16 and 48 beside real layers' N and K outside the table; -0252-h200-gemm-sweep-decode-
  // picks.json: the old and new picks in one run at M = 1-64): the M = 64 entries' 64x48 tile
  // took 1.08-1.18x cuBLAS at N = 9216, 11008 and 12288 (192-256 tiles) where 64x96 (96-128
  // tiles, as many as the entries' 64x4608x3584 and 64x6144x4096 ran) took 0.95-1.02x. Within
  // one wave (N = 4672-5120, 98-107 tiles, 64x64 in 73-80) the gain is smaller: 2-4 % at M = 48
  // in both sweeps, -4 to +2 % at M = 56 and 64 (the twelve shapes' geo-mean 1.042 -> 1.034x).
  if (c.swap_ab || c.schedule != MainloopSchedule::pingpong || c.tile_m != 64 || c.cluster_m != 1 ||
      c.cluster_n != 1 || c.splits > 1 || c.k_parts > 1 || c.scheduler != TileSchedulerKind::persistent)
    return std::nullopt;
  if (gemm.m <= 0 || gemm.m > kDecodeRows || gemm.m > c.tile_m || entry.m > c.tile_m || entry.n <= 0 ||
      gemm.n <= entry.n)
    return std::nullopt;
  GemmDesc there = gemm;
  there.m = entry.m;
  there.n = entry.n;
  const int64_t own = tuning::tile_count(c, there);  // its M in one row tile: N's tiles alone
  if (own > device.sm_count) return std::nullopt;
  const auto width = tuning::transposed_width_splitting(gemm.n, int(own));
  if (!width || *width <= c.tile_n) return std::nullopt;
  KernelConfig wide = c;
  wide.tile_n = *width;
  return wide;
}

std::optional<KernelConfig> transposed_tile_below_the_entrys_rows(const KernelConfig& c, const GemmDesc& gemm,
                                                                 const TableEntry& entry,
                                                                 const tuning::DeviceLimits& device) {
  // Measured on the H200 (bench/results/20261202-0527-h200-gemm-sweep-decode-wide-n.json and
  // -0544-...-decode-clusters.json, 15 shapes of N = 4544-5120 and K = 3072-5120 at M = 40-56):
  // at M = 48 the M = 64 entries' untransposed 64x48 and 64x64 tiles (rule 8 widens the first)
  // took 1.05-1.14x torch.mm, the transposed 64x48 tile (71-80 tiles) 1.01-1.04x, as at M = 40,
  // which borrows the M = 32 entries' transposed tiles and widens them (rule 7). At M = 56 the
  // transposed tile of 64 columns was no faster than the entries' (1.02-1.08x against
  // 1.02-1.06x). Nsight Compute (-0527-h200-ncu-decode-wide-n.csv): cuBLAS runs 48x4544x4544
  // transposed as well, 64 rows of N by 48 of M in 4x1 clusters, 72 CTAs.
  // Entries in clusters (1x2 at K = 18432-28672) were not compared and are kept.
  if (c.swap_ab || c.schedule != MainloopSchedule::pingpong || c.tile_m != 64 || c.cluster_m != 1 ||
      c.cluster_n != 1 || c.k_parts > 1 || c.splits > 1)
    return std::nullopt;
  if (gemm.m <= 32 || gemm.m > 48 || entry.m <= gemm.m) return std::nullopt;
  const auto width = tuning::transposed_width_holding(gemm.m);
  if (!width) return std::nullopt;
  KernelConfig t = KernelConfig::of(MainloopSchedule::pingpong, 64, *width, 1);
  t.tile_k = 128;
  t.swap_ab = true;
  if (tuning::tile_count(t, gemm) > device.sm_count) return std::nullopt;
  return t;
}

std::optional<KernelConfig> narrow_decode_transposed_tile(const KernelConfig& c, const GemmDesc& gemm,
                                                         const tuning::DeviceLimits& device) {
  // Measured on the H200 (bench/results/20261202-0318-h200-gemm-sweep-decode-k-parts.json, seven
  // transposed tiles at 27 decode shapes; -0242-...-decode-off-grid.json): at M = 24-64 and N =
  // 2048 (K = 5632 and 8192) the transposed 64x16 tile in one part, 64-128 tiles, took 0.89-0.96x
  // torch.mm where the borrowed picks (64x32 in 4 parts or in 4x1 clusters, 32-64 tiles of 4
  // parts or none) took 0.95-1.10x; at 48x2048x11008 and 48x2304x9216 (96 and 108 tiles)
  // 0.99x and 0.95x, the fastest timed. The grid's own M = 32 entries at N = 3072-4096 (96-128
  // such tiles) have it within 1-2 % of their fastest. With fewer row tiles of N it loses: at N =
  // 1536 (24 row tiles, K = 8960) it took 1.10-1.13x where 2 parts of 64x32 took 1.01-1.10x.
  if (!c.swap_ab || gemm.m <= 16 || gemm.m > kDecodeRows || gemm.n <= 0) return std::nullopt;
  if (c.tile_m == 64 && c.tile_n == 16 && c.cluster_m == 1 && c.cluster_n == 1 && c.splits <= 1 &&
      c.k_parts <= 1 && c.scheduler == TileSchedulerKind::persistent)
    return std::nullopt;
  KernelConfig t = KernelConfig::of(MainloopSchedule::pingpong, 64, 16, 1);
  t.tile_k = c.tile_k == 64 ? 128 : c.tile_k;
  t.swap_ab = true;
  const int64_t row_tiles = (gemm.n + t.tile_m - 1) / t.tile_m;
  if (row_tiles < kNarrowTileRowTiles || tuning::tile_count(t, gemm) > device.sm_count) return std::nullopt;
  return t;
}

namespace {
// `c` with K in the most parts, up to `most`, that fit one wave of its tiles and split this K
// evenly (config_refusal: 16-byte slices; tuning::k_split_refusal: kMinKPerPart each); K in one
// part where none does.
KernelConfig most_parts_in_one_wave(KernelConfig c, const GemmDesc& gemm, int most, const tuning::DeviceLimits& device) {
  const int64_t tiles = tuning::tile_count(c, gemm);
  for (c.k_parts = int(std::min<int64_t>(most, device.sm_count / std::max<int64_t>(1, tiles))); c.k_parts > 1;
       --c.k_parts)
    if (config_refusal(c, gemm).empty() && tuning::k_split_refusal(c, gemm).empty()) return c;
  c.k_parts = 1;
  return c;
}
}  // namespace

std::optional<KernelConfig> parts_within_one_wave(const KernelConfig& c, const GemmDesc& gemm,
                                                 const tuning::DeviceLimits& device) {
  // Measured on the H200 (bench/results/20261202-0318-h200-gemm-sweep-decode-k-parts.json): at
  // M = 40-64 and N = 1536, K = 8960 the M = 32 and 64 entries' transposed 64x32 tile in 4 parts
  // ran 192-256 tiles x parts (two waves) at 1.11-1.12x torch.mm, in 2 parts (96-128, one wave)
  // at 1.01-1.10x; where 4 parts fit one wave (M = 16-32 there, and at N = 2048) they were kept.
  if (c.k_parts <= 1) return std::nullopt;
  if (tuning::tile_count(c, gemm) * c.k_parts <= device.sm_count) return std::nullopt;
  return most_parts_in_one_wave(c, gemm, c.k_parts - 1, device);
}

std::optional<KernelConfig> transposed_tiles_across_m(const KernelConfig& c, const GemmDesc& gemm,
                                                      const tuning::DeviceLimits& device) {
  // Measured on the H200 (bench/results/20261202-0850-h200-gemm-sweep-mid-m-k-parts.json, 18
  // configurations at 12 shapes of 72 <= M <= 128): where the table's M = 64 and 128 entries lend
  // an untransposed 64-row tile, two row tiles across M at 96x4096x11008, 96x3584x18944,
  // 100x3072x8192 and 112x2048x8192 took 1.24-1.41x torch.mm; the transposed tile holding M with
  // K in 2 to 4 parts (96-128 tiles x parts) 0.92-1.07x. At K = 3072-4096 the parts lost
  // (72x4096x4096: 1.14x in 2 parts, 1.01x whole), and at M = 120-128 the entries' tiles were the
  // fastest (0.92-1.07x): two row tiles pad little or nothing there. On ten shapes chosen before
  // (-0855-...-held-out.json) the four it changed went 1.132 -> 1.023x geo-mean (92x4096x14336
  // 1.468 -> 1.002x), but 116x3072x8192 1.035 -> 1.067x: hence one tile up to M = 112; the M = 64
  // entries' 64x64 tile in 1x2 clusters took 1.84x at 68x3584x18944, the transposed tile in 2
  // parts 1.11x: hence clusters too. Seven more fresh shapes (-0903-...-second-set.json): 1.496 ->
  // 1.001x. Between 129 and 256 rows, where rule 6's cooperative tiles stand aside (short N), the
  // entries' three or four 64-row tiles took 1.15-2.71x at eight shapes (-0954-...-m-128-256-
  // transposed.json, 16 configurations), the transposed 64-row tiles of M / 2 columns 0.94-1.28x
  // (0.84x and 1.07x with K in 2 parts at 192x2048x8192 and 160x1536x8960); wider tiles, 4x1
  // clusters and cooperative tiles were slower, and K in parts beyond one wave lost everywhere.
  if (c.swap_ab || c.schedule != MainloopSchedule::pingpong || c.tile_m != 64 || c.k_parts > 1 || c.splits > 1 ||
      c.scheduler != TileSchedulerKind::persistent)
    return std::nullopt;
  int tiles_across_m = 0;
  if (gemm.m > 64 && gemm.m <= kMostRowsInOneTransposedTile) tiles_across_m = 1;
  if (gemm.m >= kLeastRowsInTwoTransposedTiles && gemm.m <= kMostRowsInTwoTransposedTiles) tiles_across_m = 2;
  if (tiles_across_m == 0 || gemm.n <= 0 || gemm.k <= 0) return std::nullopt;
  const auto width = tuning::transposed_width_splitting(gemm.m, tiles_across_m);
  if (!width) return std::nullopt;
  KernelConfig t = KernelConfig::of(MainloopSchedule::pingpong, 64, *width, 1);
  t.tile_k = 128;
  t.swap_ab = true;
  if (tuning::tile_count(t, gemm) > device.sm_count) return std::nullopt;
  if (gemm.k < kLongKForTransposedParts) return t;
  return most_parts_in_one_wave(t, gemm, 4, device);
}

std::optional<TableChoice> table_choice(const Graph& g, const GemmDesc& gemm) {
  return table_choice_on(g, gemm, current_device());
}

std::optional<TableChoice> table_choice_on(const Graph& g, const GemmDesc& gemm, const std::optional<DeviceInfo>& dev) {
  // Tables are measured on GPUs whose kernels are verified there, and apply on such a GPU only.
  if (!backend_features(gemm.sm, gemm.a_dtype).verified || gemm.m <= 0 || gemm.n <= 0 || gemm.k <= 0)
    return std::nullopt;
  if (gemm.a_dtype != gemm.b_dtype) return std::nullopt;
  // fp8 tables are measured with row-wise scales in the epilogue and the default two-level
  // accumulation: not for fast accumulation or block scales, whose main loops differ.
  const bool fp8 = is_fp8(gemm.a_dtype);
  if (fp8 && (gemm.fp8_fast_accum || gemm.fp8_blockwise)) return std::nullopt;
  // The tables are measured with nn.Linear's operands: A row-major, B column-major (W of N×K).
  // 16-bit GEMMs of B row-major (GPT-2's Conv1D weights, a backward pass's data gradients) take
  // their entries up to kOtherLayoutSmallRows rows and from kOtherLayoutRows on
  // (other_layout_entries).
  if ((gemm.a_layout != Layout::row_major || gemm.b_layout != Layout::col_major) &&
      !other_layout_entries(gemm))
    return std::nullopt;
  const bool light = light_epilogue(g);
  const bool one_operand = !light && !fp8 && operand_epilogue(g);
  if (!dev || dev->arch != gemm.sm) return std::nullopt;
  // Entries measured with B column-major whose tiles would stage a row-major B (or column-major
  // A) with a narrow swizzle, and entries whose K in parts would be too short here
  // (tuning::k_split_refusal: measured at K = 4096, borrowed at 2048), are passed over: the
  // nearest usable entry stands in.
  const EntryFilter entry_ok = [&](const KernelConfig& c) {
    return tuning::operand_layout_refusal(c, gemm).empty() && tuning::k_split_refusal(c, gemm).empty();
  };
  const tuning::DeviceLimits device = limits_of(dev);
  // An epilogue with one [m,n] operand: the residual table's entry from its smallest M on (it
  // was measured with such an epilogue, on tiles whose registers hold the operand's fragment).
  if (one_operand)
    if (const SelectionTable* residual =
            table_for(gpu_class_of(dev->name), gemm.a_dtype, dev->sm_count, TableKind::residual);
        residual && gemm.m >= residual->smallest_m())
      if (const auto found = match(*residual, gemm.m, gemm.n, gemm.k, dev->sm_count, entry_ok);
          found && tuning::prune_reason(found->entry->config, g, gemm, device).empty()) {
        TableChoice choice{found->entry->config, *found->entry, found->exact, residual->file};
        if (!found->exact) choice.entry.order = VisitOrder{};  // measured on its own tile grid
        return choice;
      }
  if (!light && !decode_table_epilogue(g, gemm)) return std::nullopt;
  const SelectionTable* table = table_for(gpu_class_of(dev->name), gemm.a_dtype, dev->sm_count);
  if (!table) return std::nullopt;
  const auto found = match(*table, gemm.m, gemm.n, gemm.k, dev->sm_count, entry_ok);
  if (!found) return std::nullopt;
  auto usable = [&](const KernelConfig& c) {
    // At least 3 main-loop stages included; a heavier epilogue only on a tile of few accumulators.
    return tuning::prune_reason(c, g, gemm, device).empty() && (light || few_accumulators(c));
  };
  if (usable(found->entry->config)) {
    TableChoice choice{found->entry->config, *found->entry, found->exact, table->file};
    // fp8 entries carry over to other shapes as they are: the adaptations below were measured
    // with 16-bit tiles only.
    if (found->exact || fp8) return choice;
    // A shape between the table's: M split into transposed cooperative tiles, else a borrowed
    // transposed tile widened to one tile across M, else borrowed untransposed 64-row tiles
    // across 65-224 rows turned into transposed tiles splitting M in one or two (K in the parts
    // of one wave where K is long), else the transposed tile holding M below an
    // untransposed entry of more rows, else a borrowed decode tile widened to the entry's count
    // of tiles, else a borrowed transposed decode tile narrowed to 16 columns of M, else a
    // borrowed K in parts cut to the parts that fit one wave.
    auto adapted = mid_m_transposed_tile(gemm, device);
    if (!adapted || !usable(*adapted)) adapted = one_token_tile(choice.config, gemm, device, found->entry->m);
    if (!adapted || !usable(*adapted)) adapted = transposed_tiles_across_m(choice.config, gemm, device);
    if (!adapted || !usable(*adapted))
      adapted = transposed_tile_below_the_entrys_rows(choice.config, gemm, *found->entry, device);
    if (!adapted || !usable(*adapted)) adapted = entry_tile_count_width(choice.config, gemm, *found->entry, device);
    if (!adapted || !usable(*adapted)) adapted = narrow_decode_transposed_tile(choice.config, gemm, device);
    if (!adapted || !usable(*adapted)) adapted = parts_within_one_wave(choice.config, gemm, device);
    if (adapted && usable(*adapted)) {
      choice.config = *adapted;
      choice.entry.order = VisitOrder{};  // the entry's order was measured on its own tile grid
    }
    return choice;
  }
  // A transposed entry for an epilogue without a transposed kernel (a gated one): the fastest
  // untransposed configuration measured at that shape.
  if (const auto& other = found->entry->unswapped; other && usable(*other)) {
    TableEntry entry = *found->entry;
    entry.config = *other;
    entry.order = VisitOrder{};  // measured with CUTLASS's order
    entry.ms = entry.unswapped_ms;
    return TableChoice{*other, entry, found->exact, table->file};
  }
  return std::nullopt;
}

}  // namespace selection

using selection::light_epilogue;
using selection::moves_matrices_besides_d;
using selection::reduces_over_m;

// Blackwell (compile-checked, never timed): one 128-row MMA per SM with the widest tile its
// tensor memory holds for 16-bit operands (128×256), 128 of K for fp8; sm_120a's fp8 kernels
// with CUTLASS's cooperative 128×128×128 tile and no cluster. sm_100a's epilogue stages wider
// tiles of [m,n] operands and outputs than Hopper's (4 stages of loads): with any besides D, a
// 128×256 tile leaves no main-loop stage (nvcc: "Stages set to value 1 or more"), so 128×128.
static KernelConfig blackwell_default_config(const Graph& g, const GemmDesc& gemm) {
  size_t staged = 0;  // [m,n] operands and outputs
  for (const Node& n : g.nodes())
    staged += n.kind == NodeKind::aux || (n.kind == NodeKind::store && n.shape == Shape::full &&
                                          g.node(n.inputs[0]).kind != NodeKind::reduce);
  const bool only_d = staged <= 1;
  // 99 KiB of shared memory (sm_120a) holds no 128×256 tile's stages beside the epilogue's.
  const bool small_smem = max_shared_memory_per_block(gemm.sm) < 128 * 1024;
  KernelConfig c = KernelConfig::of(MainloopSchedule::cooperative, 128, small_smem || !only_d ? 128 : 256, 1);
  if (is_fp8(gemm.a_dtype) || is_fp8(gemm.b_dtype)) c.tile_k = 128;
  return c;
}

// The sm_80 backend: CUTLASS 2.x's usual large tile, 128×256 with three stages, in the
// K depth that the architecture's shared memory holds (64 on A100 and Hopper, 32 in the 99 KiB
// of sm_86/89/120); decode-sized M (at most 64 rows) a 64-row tile with four stages.
static KernelConfig multistage_default_config(const GemmDesc& gemm) {
  const bool big_smem = max_shared_memory_per_block(gemm.sm) >= 144 * 1024;
  if (gemm.m > 0 && gemm.m <= 64) return KernelConfig::multistage_of(64, 128, big_smem ? 64 : 32, 4);
  return KernelConfig::multistage_of(128, 256, big_smem ? 64 : 32, 3);
}

KernelConfig default_config(const Graph& g, const GemmDesc& gemm) {
  return selection::default_config_on(g, gemm, current_device());
}

KernelConfig selection::with_kernel_options(KernelConfig c, const CompileOptions& options) {
  c.precise_math = c.precise_math || options.precise_math;
  if (is_fp8(options.gemm.a_dtype) || is_fp8(options.gemm.b_dtype))
    c.fp8_fast_accum = c.fp8_fast_accum || options.gemm.fp8_fast_accum;
  return c;
}

KernelConfig selection::default_config_on(const Graph& g, const GemmDesc& gemm, const std::optional<DeviceInfo>& dev) {
  const ArchFeatures& f = backend_features(gemm.sm, gemm.a_dtype);
  if (f.backend == 80) return multistage_default_config(gemm);
  if (auto t = selection::table_choice_on(g, gemm, dev)) return t->config;
  // The compile-checked backends (Blackwell) take their own rule; the verified one the rules below.
  KernelConfig c = f.fused && !f.verified ? blackwell_default_config(g, gemm)
                                          : default_config_for_shape_on(g, gemm, selection::limits_of(dev));
  // An epilogue with many staged [m,n] tensors leaves a 128×256 tile too few main-loop
  // stages (fewer than 2 does not compile; fewer than 3 stalls on memory): use 128×128.
  if (c.tile_n == 256 && mainloop_stages(c, gemm, epilogue_smem_bytes(g, c)) < 3) c.tile_n = 128;
  // Wider still (eight outputs, f32 ones, [m,n] operands: `evtc fuzz` found them failing
  // CUTLASS's stage assertion): 64-row ping-pong tiles stage half as much per tile. Column and
  // whole-matrix reductions need the cooperative schedule: those are refused instead
  // (shared_memory_refusal).
  if (mainloop_stages(c, gemm, epilogue_smem_bytes(g, c)) < kMinMainloopStages && !reduces_over_m(g) &&
      f.pingpong) {
    KernelConfig p = KernelConfig::of(MainloopSchedule::pingpong, 64, 128);
    p.tile_k = c.tile_k;
    p.fp8_fast_accum = c.fp8_fast_accum;
    p.precise_math = c.precise_math;
    c = p;
  }
  return c;
}


namespace {

// Problems whose tile grid fits in one wave on the GPU (decode-sized M, or small N): the
// finest tile among these that still fits one wave, so every multiprocessor that can get
// work gets it, in this order of preference where two tile the problem alike. A 2×1 cluster
// (B's tiles shared by two row tiles) pays for the 128×256 tile only: with the smaller tiles
// it cost up to 11 % at 128×4096×11008 (bench/results/20261124-0334-h200-default-configs.json).
// At M=128 these picks are 1.00-1.02× the best tuned candidate where the previous default was
// 1.3-3.2× (bench/results/20261124-0320-h200-default-configs.json).
// Decode-sized M (at most 64 rows) without a table: the main loop streams B, and what counts is
// how many multiprocessors pull it. 64-row ping-pong tiles with a K tile of 128, the narrowest
// of 32, 64 and 128 columns whose grid stays within two tiles per multiprocessor (the tables'
// choices at M = 16-64 on the H100: 0.92-1.04x cuBLAS, where cooperative 128x128 tiles took
// 1.4-1.5x; bench/results/20261127-0945-h100-gemm-sweep.json).
KernelConfig decode_config(const GemmDesc& g, int sms) {  // for g.m <= selection::kDecodeRows
  KernelConfig c = KernelConfig::of(MainloopSchedule::pingpong, 64, 32);
  c.tile_k = 128;
  while (c.tile_n < 128 && tuning::tile_count(c, g) > 2 * int64_t(sms)) c.tile_n *= 2;
  return c;
}

std::optional<KernelConfig> one_wave_config(const GemmDesc& g, int sms) {
  if (g.m <= selection::kDecodeRows) return decode_config(g, sms);
  std::optional<KernelConfig> best;
  int64_t best_tiles = 0;
  for (const auto& [s, tm, tn] : {std::tuple{MainloopSchedule::cooperative, 128, 256},
                                  std::tuple{MainloopSchedule::cooperative, 128, 128},
                                  std::tuple{MainloopSchedule::pingpong, 64, 256},
                                  std::tuple{MainloopSchedule::pingpong, 64, 128}}) {
    KernelConfig c = KernelConfig::of(s, tm, tn);
    const int64_t tiles = tuning::tile_count(c, g);
    if (tiles > sms || tiles <= best_tiles) continue;
    if (tn == 256 && g.m > tm) c.cluster_m = 2;  // two or more row tiles
    best = c;
    best_tiles = tiles;
  }
  return best;
}

// Epilogues moving kMatricesBesidesD or more 16-bit [m,n] tensors besides D: ping-pong 128×160
// where that tile keeps kHeavyEpilogueStages main-loop stages beside the epilogue's staged
// tensors, else ping-pong 128×128. Measured on the H200, each epilogue in both configurations in
// one run (bench/results/20261130-1414-h200-epilogue-sizes-training-epilogues.json, interleaved
// with torch.mm; and 20261130-0925 and -1132/-1150 with `evtc run --bench`, one configuration per
// process):
//   - SwiGLU's forward half (the gate GEMM reading u, writing g and silu(g)·u; B column-major:
//     one operand and two outputs, four stages on 128×160) at 4096 and 8192 × 11008 and 14336 ×
//     4096:
//     128×160 took 0.544, 0.733, 1.174 and 1.538 ms against 0.589, 0.781, 1.205 and 1.663 on
//     cooperative 128×256 (the rule before) and 0.522, 0.785, 1.250 and 1.583 on ping-pong
//     128×128; with `--bench` 0.498-0.513 and 1.508-1.554 against 0.530 and 1.587-1.633 on
//     cooperative 128×256 at the first and last size;
//   - SwiGLU's derivative after the down projection's data gradient (B row-major: two operands
//     and two outputs, three stages on 128×160, four on 128×128) at the same sizes: 128×160
//     0.581, 0.769, 1.280 and 1.748 ms against 0.581, 0.778, 1.298 and 1.719 on 128×128, and
//     0.553 against 0.542-0.545 with `--bench`: even, so 128×128 stays.
KernelConfig heavy_epilogue_tile(const Graph& g, const GemmDesc& gemm) {
  const KernelConfig wide = KernelConfig::of(MainloopSchedule::pingpong, 128, 160, 2);
  if (mainloop_stages(wide, gemm, epilogue_smem_bytes(g, wide)) >= selection::kHeavyEpilogueStages) return wide;
  return KernelConfig::of(MainloopSchedule::pingpong, 128, 128, 2);
}

}  // namespace

KernelConfig default_config_for_shape(const Graph& g, const GemmDesc& gemm) {
  return default_config_for_shape_on(g, gemm, selection::current_device_limits());
}

KernelConfig default_config_for_shape_on(const Graph& g, const GemmDesc& gemm, const tuning::DeviceLimits& device) {
  KernelConfig c;  // cooperative 128×256×64, cluster 2×1
  bool reduces = false;  // any reduction (reduces_over_m: a column or whole-matrix one)
  for (const Node& n : g.nodes()) reduces |= n.kind == NodeKind::reduce;
  if (is_fp8(gemm.a_dtype) || is_fp8(gemm.b_dtype)) {
    c.tile_k = 128;
    c.fp8_fast_accum = gemm.fp8_fast_accum;
    if (gemm.fp8_fast_accum) {
      // Measured (bench/results/*-fp8.json): ping-pong 128×128 at 4096³, cooperative 128×256
      // from 8192³ on.
      if (gemm.m > 0 && gemm.n > 0 && gemm.m * gemm.n <= 4096 * 4096) {
        c.schedule = MainloopSchedule::pingpong;
        c.tile_n = 128;
      }
    } else {
      // The two-level accumulation keeps a second accumulator in registers: a warp group
      // holding 64×256 of them twice would spill (3× slower), so it gets 128×128 tiles.
      c.tile_n = 128;
      c.cluster_m = 1;
    }
    return c;
  }
  if (gemm.m <= 0 || gemm.n <= 0) return c;  // size unknown: the large-problem default
  // Reductions keep the tiles they were measured with (the one-wave tiles were measured on
  // elementwise and gated epilogues); column and whole-matrix ones the cooperative schedule.
  if (!reduces)
    if (auto one = one_wave_config(gemm, device.sm_count)) return *one;
  if (reduces_over_m(g)) {
    // Column and whole-matrix reductions over several waves of a short main loop (K ≤ 2048):
    // ping-pong 64×256, whose two consumer warp groups overlap one tile's epilogue (the
    // reduction's partial sums, C's loads) with the other's main loop; the cooperative kernel
    // runs them one after the other (Nsight Compute: SM throughput 62 % against 79 % for its
    // plain GEMM). Measured on the H200 at 8192×8192×1024 (bench/results/20261124-1705-h200-tune-*.json):
    // W7's loss 1.277 → 1.148× cuBLAS, the bias gradient col_sum(acc) with D 1.127 → 1.077×.
    if (gemm.k > 0 && gemm.k <= 2048 && tuning::tile_count(c, gemm) > device.sm_count)
      return KernelConfig::of(MainloopSchedule::pingpong, 64, 256, 2);
    return c;
  }
  // Several waves: the cooperative 128×256 tile, or ping-pong 128×128 (two tiles in flight per
  // multiprocessor, each half the work) where the main loop is short (K ≤ 2048: the
  // ping-pong schedule hides the epilogue behind the other tile's main loop) or where its
  // finer tiles fill the last wave clearly better (1024×14336×4096: 0.97 against 0.85).
  //
  // An epilogue that moves several [m,n] tensors besides D (operands read, more outputs written:
  // a training step's activations and their derivatives) takes ping-pong at any K: each warp
  // group's loads and stores of those tensors overlap the other's main loop, where the
  // cooperative kernel stalls both warp groups on them (heavy_epilogue_tile). With one such
  // tensor the cooperative tile stays: at 8192×4096×4096, `acc + r[m,n]` took 365 µs on
  // cooperative 128×256 and 390 µs on ping-pong 128×128 (docs/backend.md, "The residual
  // epilogue: where its time goes").
  if (moves_matrices_besides_d(g)) return heavy_epilogue_tile(g, gemm);
  const KernelConfig pingpong = KernelConfig::of(MainloopSchedule::pingpong, 128, 128, 2);
  if ((gemm.k > 0 && gemm.k <= 2048) ||
      tuning::grid_efficiency(pingpong, gemm, device) > tuning::grid_efficiency(c, gemm, device) + 0.05)
    c = pingpong;
  // A light epilogue (light_epilogue: one 16-bit output, no [m,n] operand or C, no reduction,
  // acc read once or by the gate/up halves only) takes ping-pong
  // 128×192, cluster 2×1, unless that tile grid wastes clearly more than the pick above. Each
  // warp group holds a 128×192 tile (192 accumulators a thread, no spills) and the other's
  // epilogue overlaps its main loop. Timed in each kernel's steady state on the H200
  // (bench/results/20261124-2334 and -2336-h200-visit-order.json) it was the fastest or within
  // 1.7 % of the fastest of four candidates on nine shapes (gated swiglu at 8192×11264×2048,
  // 8192×22016×4096, 8192×28672×4096 and 2048×22016×4096, swiglu7 at 7697×27304×5120,
  // silu(acc + bias) at 8192×11008×4096, 8192×5632×2048 and 8192³). Where this rule picks it,
  // it was 1.2-5.5 % faster than the pick above on six shapes (1.032× cuBLAS against 1.045×
  // for LLaMA's merged gate/up GEMM, 0.995× against 1.020× at 8192³) and 0.5 % slower on one
  // (8192×5632×2048, whose grid fills its waves 2.2 % worse). Its advantage is 2-4 %, so a
  // grid that fills its waves 2.5 % worse or more keeps the pick above (8192×11008: 0.959
  // against 0.993, measured 1.057× against 1.069×: about even).
  //
  // With a long main loop (K ≥ 4096) the cooperative 256×192 tile (two warp groups of 128×192)
  // ran 0.6-2.9 % faster than ping-pong 128×192 where its grid wastes at most 1.4 % more
  // (8192×22016×4096: 1.017-1.029× cuBLAS against 1.046-1.047×; 8192×28672×4096: 1.023×
  // against 1.029×; 0.7 % slower at 2048×22016×4096), and slower where its coarser grid
  // wastes 2 % more or worse (8192³: 0.940 against 0.985 filled, 1.014× against 0.995×; W4
  // at K = 5120: 0.925 against 0.953, 1.098× against 1.062×). At K = 2048 it is slower.
  const KernelConfig wide = KernelConfig::of(MainloopSchedule::pingpong, 128, 192, 2);
  if (!light_epilogue(g) ||
      tuning::grid_efficiency(c, gemm, device) >= tuning::grid_efficiency(wide, gemm, device) + 0.025)
    return c;
  const KernelConfig big = KernelConfig::of(MainloopSchedule::cooperative, 256, 192, 2);
  if (gemm.k >= 4096 &&
      tuning::grid_efficiency(big, gemm, device) + 0.02 >= tuning::grid_efficiency(wide, gemm, device))
    return big;
  return wide;
}


}  // namespace evtc
