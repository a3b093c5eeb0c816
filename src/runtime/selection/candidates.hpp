// The tuner's candidates, which need no GPU: the configurations of a problem worth timing
// (pruned by rules before anything is compiled), their heuristic score, and the tile-grid
// efficiencies the cost model and the shipped tables' lookup share.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "evtc/gemm.hpp"
#include "evtc/graph.hpp"
#include "evtc/kernel_config.hpp"

namespace evtc::tuning {

// What candidate generation knows about the GPU.
struct DeviceLimits {
  int sm_count = 132;  // H100 SXM
};

// The candidate configurations for a problem, best-first by the heuristic score, at most
// `max_candidates` of them (0: no limit). The space: CTA tiles 128×128×64, 128×256×64,
// 256×128×64, 64×128×64, 64×256×64 (and the K tile of 128 for fp8); clusters 1×1, 2×1,
// 1×2; cooperative and ping-pong schedules; persistent and stream-K tile schedulers.
// Pruned before compiling: configurations CUTLASS cannot build (see KernelConfig::parse),
// ping-pong tiles whose accumulators do not fit one warp group's registers, clusters wider
// than the problem's tile grid, main-loop stages that do not fit shared memory, tiles mostly
// outside the problem (M or N far below the tile), tiles staging a row-major B or column-major
// A with a 32-byte swizzle (operand_layout_refusal), stream-K where the persistent grid
// already fills its waves, and — for epilogues with reductions — stream-K (the reductions
// combine one partial per tile and warp; a K-split tile would be counted twice). fp8's
// two-level accumulation counts its accumulators twice.
std::vector<KernelConfig> candidate_configs(const Graph& g, const GemmDesc& gemm,
                                            const DeviceLimits& device = {},
                                            size_t max_candidates = 0);

// Why a configuration is pruned for this problem; empty if it is kept.
std::string prune_reason(const KernelConfig& c, const Graph& g, const GemmDesc& gemm,
                         const DeviceLimits& device = {});

// K in parts (KernelConfig::k_parts) pays only where every part keeps more than 512 of K: the
// parts' fixed costs (each part's prologue and fp32 partial tile, the second kernel that adds
// them) outweigh a shorter main loop. Measured on the H200 at decode sizes (bench/results/
// 20261202-0252-h200-gemm-sweep-decode-picks.json): 4 parts of 512 at N = K = 2048 took
// 1.05-1.17x cuBLAS where the same shapes' tiles in one part took 0.94-0.98x; 4 parts of 384 and
// 256 (N = K = 1536 and 1024, 64x160 tiles) 0.83-1.24x against 0.65-0.99x; 4 parts of 704 and
// 768 (N = 1024, K = 2816; N = 768, K = 3072) 0.87-1.01x against 0.91-0.98x in one part; and 4
// of 1024 won the table's 16-64 x 1024 x 4096.
constexpr int64_t kMinKPerPart = 640;
// Why K is too short for this configuration's split (in-kernel split-K: at least four K tiles a
// split; K in parts: also kMinKPerPart a part); empty for a configuration that does not split K.
// prune_reason includes it; the shipped tables' lookup skips entries it refuses.
std::string k_split_refusal(const KernelConfig& c, const GemmDesc& gemm);

// Why a configuration's tiles of an operand read along M or N (B row-major, A column-major, as
// the kernel reads them after any swap-AB) are slow: a tile extent along that contiguous axis
// whose bytes are no multiple of 64 makes CUTLASS stage it with its 32-byte swizzle, whose loads
// and wgmma reads run far below the wider swizzles'. Empty where the layout costs nothing.
// prune_reason includes it; the shipped tables' lookup skips entries it refuses.
std::string operand_layout_refusal(const KernelConfig& c, const GemmDesc& gemm);

// The heuristic score of a configuration (higher is better): the fraction of the
// multiprocessors' tile slots doing useful work over all waves, times the tile's
// arithmetic intensity relative to the largest tile.
double heuristic_score(const KernelConfig& c, const GemmDesc& gemm, const DeviceLimits& device = {});

// The fraction of the tile grid's work slots that do useful work: the padding of partial
// tiles times, for persistent kernels, the last wave's occupancy (stream-K balances its
// waves, less its fix-up). The cost model and the candidate score share it.
double grid_efficiency(const KernelConfig& c, const GemmDesc& gemm, const DeviceLimits& device = {});
// A problem size, or for 0 (unknown) that of one large square problem (4096).
int64_t size_or(int64_t v);
// The problem as the configuration's tiles cover it: M and N exchanged for a transposed
// configuration (KernelConfig::swap_ab).
GemmDesc tiled_problem(const KernelConfig& c, const GemmDesc& gemm);
// Output tiles (CTAs' worth of work) of a problem.
int64_t tile_count(const KernelConfig& c, const GemmDesc& gemm);
// The problem with M rounded up to whole row tiles of the configuration (of tile_n columns where
// it is transposed): the same tile grid, without the last row tile's padding.
GemmDesc whole_row_tiles(const KernelConfig& c, GemmDesc gemm);
// The columns of a transposed (swap-AB) tile that holds all of M's rows in one tile: M rounded
// up to a multiple of 16; nullopt above the widest such tile the candidates offer (128).
std::optional<int> transposed_width_holding(int64_t m);
// The columns of each of `tiles` transposed tiles that split M's rows between them: M / tiles
// rounded up, then up to a multiple of 16; nullopt above 256 (the widest wgmma). The same split
// of N serves an untransposed 64-row tile (selection::entry_tile_count_width).
std::optional<int> transposed_width_splitting(int64_t m, int tiles);

}  // namespace evtc::tuning
