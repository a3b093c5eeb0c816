// Kernel configuration and the operand signature of a compiled epilogue kernel.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "evtc/gemm.hpp"
#include "evtc/graph.hpp"

namespace evtc {

// cooperative / pingpong: the sm90-style warp-specialized kernels (sm_90a, sm_100a, sm_120a);
// multistage: the sm_80 backend's cp.async + mma.sync main loop (CUTLASS 2.x).
enum class MainloopSchedule : uint8_t { cooperative, pingpong, multistage };
enum class TileSchedulerKind : uint8_t { persistent, stream_k };

// How the CUTLASS kernel around an epilogue is built (the autotuner's search space).
struct KernelConfig {
  int tile_m = 128, tile_n = 256, tile_k = 64;
  int cluster_m = 2, cluster_n = 1;
  MainloopSchedule schedule = MainloopSchedule::cooperative;
  TileSchedulerKind scheduler = TileSchedulerKind::persistent;
  // Full-precision transcendental math instead of the fast hardware forms.
  bool precise_math = false;
  // fp8 A/B only: CUTLASS's fast-accumulation main loop (the tensor cores' own fp8
  // accumulation throughout) instead of the default two-level accumulation, which promotes
  // the tensor-core partial sums into fp32 registers every few K blocks (more accurate for
  // long K, somewhat slower). Ignored for 16-bit A/B.
  bool fp8_fast_accum = false;
  // fp8 A/B with the two-level accumulation only: the K elements between two promotions of the
  // tensor cores' partial sums into the fp32 accumulators, a multiple of tile_k; 0 = CUTLASS's
  // default, every 128 (4 WGMMAs). Longer intervals run faster and add error (docs/backend.md,
  // "fp8 GEMMs"); the tuner never picks one by itself.
  int fp8_promotion_k = 0;
  // The multistage schedule only: main-loop stages in shared memory (2 to 6).
  int stages = 0;
  // The stream-K tile scheduler only: 1 lets CUTLASS's stream-K decomposition balance the
  // waves; 2 to 16 split every output tile's K loop into that many equal parts instead
  // (split-K), whose partial sums the scheduler adds in a fixed order (deterministic).
  int splits = 1;
  // Compute the GEMM transposed, Dᵀ = Bᵀ·Aᵀ, with the epilogue rewritten for it (evtc::swap_ab in
  // evtc/passes.hpp): for small M, whose rows then fill the tile's columns (as few as 16) while
  // N fills its rows. The tile and cluster are the transposed problem's: tile_m runs along N,
  // tile_n along M. Hopper only; not for gated epilogues (swap_ab_refusal).
  bool swap_ab = false;
  // K in `k_parts` equal slices (2 to 16), computed as a batch of fp32 partial products into
  // evtc's workspace; a second, small kernel adds them in a fixed order and runs the whole
  // epilogue on the sum (the plain CUDA epilogue of evtc/backends/cuda, launched right after
  // the GEMM). For grids of few tiles (decode-sized M), where CUTLASS's ping-pong kernel has no
  // split-K of its own: each tile's K loop becomes k_parts tiles. Persistent scheduler only;
  // not for epilogues with reductions (epilogue_config_refusal); K must split into slices of
  // whole 16-byte rows (config_refusal).
  int k_parts = 1;

  // A short stable name, e.g. "coop_128x256x64_c2x1_persistent" (part of cache keys); the
  // tile scheduler is "persistent", "streamk" or "splitk<splits>"; suffixes "_kparts<k_parts>",
  // "_swap", "_fastacc" (fp8_fast_accum), "_pk<K>" (fp8_promotion_k) and "_precise"
  // (precise_math) follow, e.g. "pingpong_64x16x128_c1x1_persistent_kparts4_swap". The sm_80 backend's: "ms_128x256x64_s3" (tile, stages).
  std::string name() const;
  // Parses name(); nullopt if it is not one.
  static std::optional<KernelConfig> parse(const std::string& name);
  // A 16-bit configuration from its schedule, CTA tile (K tile 64), cluster rows (one
  // column) and tile scheduler.
  static KernelConfig of(MainloopSchedule schedule, int tile_m, int tile_n, int cluster_m = 1,
                         TileSchedulerKind scheduler = TileSchedulerKind::persistent);
  // An sm_80 backend configuration: CTA tile and main-loop stages (no cluster).
  static KernelConfig multistage_of(int tile_m, int tile_n, int tile_k, int stages);
  bool operator==(const KernelConfig&) const = default;
};

// The order in which a persistent tile scheduler visits output tiles: a run-time argument of a
// compiled kernel (evtc_gemm_args.raster and .swizzle in evtc/device/abi.h), so choosing one
// needs no recompile. Tiles are visited in strips `swizzle` tiles wide (1, 2, 4 or 8) that run
// along M or along N; CUTLASS's heuristic picks the direction from the tile grid. Kernels that
// run the GEMM transposed (KernelConfig::swap_ab) visit the transposed problem's tiles. The
// order changes which tiles run at once and so how much of A and B the L2 cache serves.
struct VisitOrder {
  enum class Raster : uint8_t { heuristic, along_m, along_n };
  Raster raster = Raster::heuristic;
  int swizzle = 1;

  // "heuristic", "along_m", "along_n", with "_s<swizzle>" for strips wider than one tile:
  // e.g. "along_n_s8".
  std::string name() const;
  // Parses name(); nullopt if it is not one.
  static std::optional<VisitOrder> parse(const std::string& name);
  // Every order the tuner tries: CUTLASS's choice, then both directions with each strip width.
  static std::vector<VisitOrder> all();
  // What names parse() takes, for messages.
  static const char* forms();
  // How much faster than CUTLASS's own order (the fraction of its time) another order must run to
  // be kept, by the tuner and by the table's sweep (bench/gemm_shapes.py): noise must not pick one.
  static constexpr double keep_margin = 0.01;
  bool operator==(const VisitOrder&) const = default;
};

// One operand or output of a kernel, in the order the kernel's C ABI tables use.
struct OperandSlot {
  std::string name;
  NodeKind kind{};  // scalar, row_vec, col_vec, aux (inputs); store (outputs)
  DType dtype{};
  Shape shape{};    // of the buffer: scalar, row [n], col [m] or full [m,n]
  ScalarKind scalar_kind = ScalarKind::value;
  Layout layout = Layout::row_major;
  bool is_output = false;
  // For reduction outputs: what they reduce with (their buffer is set to its identity
  // before the kernel runs).
  bool is_reduction = false;
  ReduceOp reduce_op{};
};

// What a kernel reads and writes, derived from its graph.
struct KernelSignature {
  std::vector<OperandSlot> pointers;  // device pointers, inputs then outputs
  std::vector<OperandSlot> scalars;   // runtime scalar parameters passed by value
  bool reads_c = false;
  DType c_dtype = DType::bf16;
  // The main output, written by the GEMM's own D store: the [m,n] output named "D" if
  // there is one, else the first [m,n] output in canonical order; empty if none.
  std::string d_name;
  DType d_dtype = DType::bf16;
  // The epilogue reads the row index m / the column index n (an index node): f32 values, exact
  // below 2^24, so the runtime refuses an M (N) at or above it.
  bool reads_row_index = false;
  bool reads_col_index = false;

  std::string to_json() const;
  // The C definition every generated library exports:
  //   const char* evtc_kernel_signature(void) { return "<to_json(), escaped>"; }
  std::string c_export() const;
};

KernelSignature make_signature(const Graph& g);

// The configuration evtc uses for a problem when none is given (sizes of 0: unknown).
// Measured on an H100 (bench/sweep_configs.sh, bench/results/*-config-sweep.txt):
//  - fp8 A/B: a K tile of 128 (the bytes per stage of a 16-bit K tile of 64); with the
//    default two-level accumulation cooperative 128×128, cluster 1×1 (its second
//    accumulator would spill from 128×256 tiles: 3× slower); with fast accumulation
//    (GemmDesc::fp8_fast_accum) ping-pong 128×128 up to 4096×4096 outputs, else cooperative
//    128×256;
//  - K ≤ 2048 and no reduction over M: ping-pong 128×128×64, cluster 2×1 (a short main loop;
//    one warp group's epilogue overlaps the other's main loop);
//  - otherwise (column and whole-matrix reductions included): cooperative 128×256×64,
//    cluster 2×1.
//  - an epilogue that stages so many [m,n] tensors in shared memory that a 128×256 tile
//    keeps fewer than 3 main-loop stages: 128×128; and where even that keeps fewer than 2
//    (CUTLASS's minimum), ping-pong 64×128, whose tiles stage half as much (not with column or
//    whole-matrix reductions, which need the cooperative schedule: shared_memory_refusal).
KernelConfig default_config(const Graph& g, const GemmDesc& gemm);
// The choice above before the shared-memory check (by shape, dtypes and reductions only).
KernelConfig default_config_for_shape(const Graph& g, const GemmDesc& gemm);
// Why configuration `c` cannot build this GEMM's main loop (empty when it can): a block-scaled
// fp8 GEMM (GemmDesc::fp8_blockwise) needs tiles whose N and K are multiples of the 128-wide
// scale blocks and no fast accumulation; a promotion interval (fp8_promotion_k) needs fp8's
// two-level accumulation.
std::string config_refusal(const KernelConfig& c, const GemmDesc& gemm);
// fp32 accumulators each thread of the warp groups sharing a tile holds, for one copy of the
// tile's accumulators (ping-pong: one warp group of 128 threads per tile; cooperative: two).
int64_t accumulators_per_thread(const KernelConfig& c);
// The most accumulators a thread holds, all copies together, that fit in registers: a consumer
// warp group has 232 registers a thread, and 192 accumulators compile without spills (ptxas -v:
// ping-pong 128×192 and cooperative 256×192 with a gated epilogue, fp8 two-level cooperative
// 128×192); 256 do not.
constexpr int64_t kMaxAccumulatorsPerThread = 192;
// Whether fp8's two-level main loop runs as evtc's overlapped promotion
// (evtc/device/sm90_fp8_mainloop.cuh): the architecture has it (ArchFeatures::overlapped_fp8_promotion),
// A and B are fp8 with the default two-level accumulation (no fast accumulation, no block scales,
// no promotion interval given, K tiles of 128), and the third set of accumulators it keeps fits in
// registers (at most 192 a thread: cooperative 128×128, ping-pong 64×128 and narrower). Otherwise
// CUTLASS's own loop, which waits for the tensor cores before each promotion.
bool overlapped_fp8_promotion(const KernelConfig& c, const GemmDesc& gemm);

// Why the epilogue `g` cannot run with configuration `c` ("" if it can), beside config_refusal:
//  - reductions need a persistent tile scheduler (evtc combines one partial per output tile and
//    warp; stream-K and split-K finish a tile in whichever CTA adds its last K part);
//  - a reduction over the kernel's M (a column reduction; a row one in a transposed kernel)
//    needs epilogue subtiles of at least 32 columns where a tile has 128 or more rows: CUTLASS's
//    epilogue takes 16-column subtiles for widths that are odd multiples of 16 (80, 112, 144, ...),
//    and its row reduction then fails nvcc's static assertions (ping-pong 128×112, cooperative
//    256×144; ping-pong 64×48 and 64×16 compile).
std::string epilogue_config_refusal(const Graph& g, const KernelConfig& c);
// Whether a reduction along `axis` runs over the M of configuration `c`'s kernel: a column
// reduction (over M), or a row reduction (over N) of a transposed (swap-AB) kernel, whose M is N.
bool reduces_over_kernel_m(ReduceAxis axis, const KernelConfig& c);
// Why `c` cannot hold this epilogue: the [m,n] tensors it stages in shared memory leave fewer
// than two main-loop stages (CUTLASS's kernels do not compile then). Empty when it can.
std::string shared_memory_refusal(const Graph& g, const GemmDesc& gemm, const KernelConfig& c);

}  // namespace evtc
