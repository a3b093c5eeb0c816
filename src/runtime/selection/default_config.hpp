// Which configuration a problem runs with by default (evtc::default_config, declared in
// evtc/kernel.hpp), and where that choice came from.
#pragma once
#include <optional>
#include <string>

#include "evtc/gemm.hpp"
#include "evtc/graph.hpp"
#include "evtc/kernel_config.hpp"
#include "evtc/runtime.hpp"
#include "runtime/selection/candidates.hpp"
#include "runtime/selection/shipped_table.hpp"
#include "target/device_info.hpp"

namespace evtc::selection {

// One 16-bit output ([m,n], or [m,n/2] gated), no [m,n] operand (aux or C), no reduction, and
// the accumulator read once (or by the gate/up halves only).
bool light_epilogue(const Graph& g);
// A column or whole-matrix reduction.
bool reduces_over_m(const Graph& g);
// At least kMatricesBesidesD [m,n] tensors moved besides D ([m,n] operands read, outputs beyond
// the first written), all 16-bit, with no reduction and no gated pair: the epilogues whose
// traffic the ping-pong schedule overlaps with the main loop (default_config_for_shape).
constexpr int kMatricesBesidesD = 2;
// Main-loop stages the wider ping-pong tile (128×160) of such an epilogue must keep beside the
// tensors the epilogue stages; with fewer it takes 128×128 (default_config.cpp, heavy_epilogue_tile).
constexpr int kHeavyEpilogueStages = 4;
bool moves_matrices_besides_d(const Graph& g);

// Decode-sized problems: at most this many rows of M. Their main loop streams B, and the tiles
// that pull it through the most multiprocessors are 64-row ping-pong or transposed ones.
constexpr int64_t kDecodeRows = 64;
// fp32 accumulators a thread of a tile's warp groups holds, at most, for a tile to be called
// small: the decode tables' tiles (64 rows by at most 128 columns, transposed 64 by 16-128),
// whose registers leave room for an epilogue's [m,n] operands and extra outputs beside them.
constexpr int64_t kFewAccumulators = 64;
bool few_accumulators(const KernelConfig& c);
// 16-bit GEMMs of A row-major and B row-major (K×N: GPT-2's Conv1D weights, dY·W in a backward
// pass) take the tables' entries, measured with B column-major, up to kOtherLayoutSmallRows rows
// and from kOtherLayoutRows on; between them, the rules. Timed on the H200 with B row-major
// against torch.mm of the same operands (bench/gemm_shapes.py --layout rr):
//   - from 4096 rows on (bench/results/20261130-0333-h200-gemm-sweep-layout-rr.json) the
//     entries' configurations took 0.978x (geo-mean of 7 shapes; 0.84-0.99x at GPT-2 XL's),
//     within 1.5 % of the fastest of ten configurations at five and 2.2-2.7 % behind at two;
//   - at 16-256 rows, 40 shapes of 8 (N, K) (GPT-2 XL's four, LLaMA's, BERT's), two runs
//     (20261201-0113-h200-gemm-shapes-rr-rules.json, -0121-...-rr-entries.json): the entries
//     took 0.987, 0.978, 0.985 and 1.037x at M = 16, 32, 64 and 128 where the rules took 1.416,
//     1.323, 1.092 and 1.154x, but 1.128x at M = 256 against the rules' 1.093x (1.682x against
//     1.317x at 256x1600x6400, which borrows the 64x32 tile of its nearest entry, 256x1024x4096).
// With A column-major (a weight gradient, dY^T·X: M and N the layer's sizes, K the tokens) the
// entries borrowed by shapes the grid does not have took 1.07-1.17x against 0.99-1.10x for the
// fastest (-0334-h200-gemm-sweep-layout-cr.json): such GEMMs keep the rules.
constexpr int64_t kOtherLayoutSmallRows = 128;
constexpr int64_t kOtherLayoutRows = 1024;
bool other_layout_entries(const GemmDesc& gemm);
// One 16-bit [m,n] output and one 16-bit [m,n] operand (an aux or C: a residual), the
// accumulator read once, no reduction or gated halves: the o and down projections'
// `acc + residual`, which take the residual table (TableKind::residual) where it has entries.
bool operand_epilogue(const Graph& g);
// An epilogue heavier than a light one that still takes a decode-sized table entry (on a tile
// of few accumulators): M at most kDecodeRows and no reduction. The table measured the entry
// with D = acc; at such M the kernel's time is B's streaming, which an [m,n] operand of M rows
// or a second output barely adds to, while the rules' tile (decode_config) was chosen without
// the table's transposed and narrow tiles.
bool decode_table_epilogue(const Graph& g, const GemmDesc& gemm);

// The shipped table's configuration for this problem on the current GPU, with the entry it came
// from: for sm_90a kernels of 16-bit A (row-major) and B (column-major) with a light epilogue (the tables are measured with
// D = acc; light epilogues keep their main loop's speed, measured in bench/gemm_shapes.py's
// silu and swiglu sets), an epilogue with one [m,n] operand from the residual table's
// smallest M on (operand_epilogue; that table measured `acc + r[m,n]`) or, at decode-sized M,
// a heavier one without reductions on an entry of
// few accumulators (decode_table_epilogue), and of fp8 A and B with the default two-level accumulation (the fp8
// tables are measured with D = acc * sa[m] * sb[n], and their entries are taken at other shapes
// unadapted), where the configuration also suits this problem (its pruning rules, and at least 3
// main-loop stages beside the epilogue). nullopt otherwise.
struct TableChoice {
  KernelConfig config;
  TableEntry entry;  // entry.order: the visiting order `config` is to run with
  bool exact = false;
  std::string table;  // its file name, e.g. "h100-bf16.json"
};
std::optional<TableChoice> table_choice(const Graph& g, const GemmDesc& gemm);
// The same on the device `dev` (current_device() for table_choice): what a GPU of that name and
// multiprocessor count would choose.
std::optional<TableChoice> table_choice_on(const Graph& g, const GemmDesc& gemm, const std::optional<DeviceInfo>& dev);

// evtc::default_config as a process on the device `dev` would choose it (current_device() for
// default_config): its table's choice, else the rules with its multiprocessors. `evtc aot build
// --gpu` builds for a GPU that is not here with it.
KernelConfig default_config_on(const Graph& g, const GemmDesc& gemm, const std::optional<DeviceInfo>& dev);

// A chosen configuration with what a Kernel's options add to it whatever the choice: precise
// math, and fp8's fast accumulation. Kernel::config_for and `evtc aot build --gpu` both apply it.
KernelConfig with_kernel_options(KernelConfig c, const CompileOptions& options);

// A transposed configuration borrowed from a smaller M, whose tiles (tile_n of M's rows each)
// take two or more across this problem's M in more tiles than one wave holds: the same
// configuration with tile_n widened to M rounded up to 16 (at most 128), so that each slice of
// N is one tile and B streams once. At such M the kernel is bound by reading B, and a second
// wave of tiles reads it again. nullopt where the configuration needs no widening (or M is
// wider than any transposed tile). An untransposed configuration measured at `measured_m`
// rows that its tile held in one row tile, and whose row tiles split this M the same way,
// becomes the transposed ping-pong tile holding M (64 rows of N, K tile 128, no cluster).
// table_choice applies it to entries of other shapes.
std::optional<KernelConfig> one_token_tile(const KernelConfig& c, const GemmDesc& gemm,
                                           const tuning::DeviceLimits& device = {}, int64_t measured_m = 0);

// A shape without an entry of its own whose M lies between 64 and 320 rows and is not a
// multiple of 64: the transposed problem in cooperative 128-row tiles (128 of N each, two warp
// groups of 64), M split into t = ceil(M / 160) tiles of M / t rows rounded up to 16 columns
// (tuning::transposed_width_splitting), or into t + 1 where that grid fills its waves better
// (grid_efficiency), no cluster, where the t tiles (ceil(N / 128) * t) fill at least half of
// the multiprocessors. The tables' entries at M = 64, 128 and 256 pad such an
// M to whole 64- or 128-row tiles (or, transposed, take two 64-row tiles across N per
// multiprocessor) and stream B once per row tile. nullopt elsewhere. table_choice applies it
// before one_token_tile.
std::optional<KernelConfig> mid_m_transposed_tile(const GemmDesc& gemm, const tuning::DeviceLimits& device = {});

// A borrowed untransposed 64-row ping-pong tile (no cluster, K in one part) at a decode-sized M
// that it holds in one row tile, from an entry of a narrower N whose tiles (M in one row tile
// there too) filled at most one wave: the same tile with tile_n widened, to a multiple of 16 and
// at most 256, so that this N splits into no more tiles than the entry's N did. At such M the
// kernel streams B, and the entry's grid is what was measured fastest; at a wider N the same
// tile runs more tiles, in more than one wave or in a grid the entry never timed. nullopt where
// no widening applies. table_choice applies it to entries of other shapes.
std::optional<KernelConfig> entry_tile_count_width(const KernelConfig& c, const GemmDesc& gemm,
                                                   const TableEntry& entry,
                                                   const tuning::DeviceLimits& device = {});

// A borrowed untransposed 64-row ping-pong configuration (no cluster, K in one part) from an
// entry of more rows, at 32 < M <= 48: the transposed 64-row ping-pong tile holding M in one
// tile (M rounded up to 16 columns, K tile 128), where its tiles fit one wave. Each tile then
// reads a 64-row slice of B against all of A, where the entry's tile read a narrower slice of B
// against A, and the shapes the M = 32 entries serve (M up to 44) take the same tile (rule 7).
// nullopt elsewhere. table_choice applies it to entries of other shapes before rule 8.
std::optional<KernelConfig> transposed_tile_below_the_entrys_rows(const KernelConfig& c, const GemmDesc& gemm,
                                                                 const TableEntry& entry,
                                                                 const tuning::DeviceLimits& device = {});

// Row tiles of N (64 each) a problem needs at least for narrow_decode_transposed_tile.
constexpr int64_t kNarrowTileRowTiles = 32;
// A borrowed transposed configuration at 16 < M <= kDecodeRows that is not already the
// transposed 64x16 ping-pong tile in one part without a cluster: that tile (the entry's K tile,
// 128 for a K tile of 64), where N makes at least kNarrowTileRowTiles row tiles and the tiles
// (row tiles times M's 16-column tiles) fit one wave. At such M the kernel streams B; 16 columns
// put up to four tiles on each slice of N, which share it in L2, and fill the wave with tiles
// that pull B through more multiprocessors than wider tiles, K in parts or clusters do. nullopt
// elsewhere. table_choice applies it to entries of other shapes after the rules above.
std::optional<KernelConfig> narrow_decode_transposed_tile(const KernelConfig& c, const GemmDesc& gemm,
                                                         const tuning::DeviceLimits& device = {});

// A borrowed configuration of K in parts whose tiles times parts exceed one wave: the same
// configuration in as many parts as fit one wave (at least one, i.e. K whole). The parts of a
// tile run at once only within one wave; a second wave of parts streams B through half the
// multiprocessors again and adds a combine of more parts. nullopt where the parts fit one wave
// or K is in one part. table_choice applies it to entries of other shapes after the rules above.
std::optional<KernelConfig> parts_within_one_wave(const KernelConfig& c, const GemmDesc& gemm,
                                                  const tuning::DeviceLimits& device = {});

// The rows transposed_tiles_across_m takes: 64 < M <= kMostRowsInOneTransposedTile (one tile
// across M) and kLeastRowsInTwoTransposedTiles <= M <= kMostRowsInTwoTransposedTiles (two); and
// K of at least kLongKForTransposedParts for K in parts.
constexpr int64_t kMostRowsInOneTransposedTile = 112;
constexpr int64_t kLeastRowsInTwoTransposedTiles = 129;
constexpr int64_t kMostRowsInTwoTransposedTiles = 224;
constexpr int64_t kLongKForTransposedParts = 8192;
// A borrowed untransposed 64-row ping-pong configuration in one part (in clusters or not), at
// such an M (two to four row tiles across M, each streaming all of B): the transposed 64-row
// ping-pong tiles splitting M in one or two tiles of M / tiles rounded up to 16 columns (K tiles
// of 128, no cluster; tuning::transposed_width_splitting), B streamed once per tile across M; at
// K >= kLongKForTransposedParts with K in as many parts (up to 4, so 2048 of K or more each) as
// fit one wave and split K evenly (config_refusal and tuning::k_split_refusal passing), else K
// whole. nullopt elsewhere, or where the transposed tiles alone exceed one wave. table_choice
// applies it to entries of other shapes after the rules above.
std::optional<KernelConfig> transposed_tiles_across_m(const KernelConfig& c, const GemmDesc& gemm,
                                                      const tuning::DeviceLimits& device = {});

// A device's limits for candidate generation and pruning (its multiprocessors; the defaults
// where it is unknown), and the current GPU's.
tuning::DeviceLimits limits_of(const std::optional<DeviceInfo>& dev);
tuning::DeviceLimits current_device_limits();

}  // namespace evtc::selection

namespace evtc {
// default_config_for_shape (evtc/kernel_config.hpp) on a GPU of `device`'s multiprocessors.
KernelConfig default_config_for_shape_on(const Graph& g, const GemmDesc& gemm, const tuning::DeviceLimits& device);
}  // namespace evtc
