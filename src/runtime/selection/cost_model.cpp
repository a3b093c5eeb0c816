// The fusion cost model (evtc/cost_model.hpp): a roofline of each kernel with efficiencies
// from the tile grid. The rates and efficiency constants were measured on the H200 with
// bench/default_configs.py (docs/backend.md, "Cost model").
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "evtc/runtime.hpp"
#include "runtime/selection/candidates.hpp"
#include "runtime/selection/tuning_store.hpp"
#include "target/device_info.hpp"
#include "runtime/selection/cost_model.hpp"
#include "runtime/kernel_impl.hpp"
#include "runtime/selection/default_config.hpp"
#include "runtime/selection/shipped_table.hpp"

namespace evtc {
namespace {

// Dense bf16/f16 and fp8 tensor-core rates a large cuBLAS GEMM reaches (TFLOP/s), device
// memory bandwidth a large copy reaches (TB/s), and the fixed cost of one kernel in a stream
// of kernels (launch gap, ramp-up and tail), in microseconds.
constexpr double kTflops16 = 780, kTflops8 = 1450;
constexpr double kTbsH200 = 4.3, kTbsH100 = 3.0;
constexpr double kKernelUs = 3.0;
// The fraction of the rate each reaches on a tile grid that wastes nothing: cuBLAS's kernels,
// and evtc's cooperative and ping-pong kernels with a typical epilogue (bias + activation).
// Ping-pong kernels of 128-row tiles (128×128 to 128×256) reach cuBLAS's rate inside a model's
// step. Timed there against torch.mm of the same operands (bench/models.py --kernels, H200), the
// fused kernels the tables do not anchor took 0.95-1.27× torch.mm, and the model at 0.93 had
// priced them at 0.97-1.18 times that ratio (15 timings, geo-mean 1.11): SwiGLU's forward half
// on 128×160, 0.948× against the model's 1.119× at 4096×11008×4096, 1.095× against 1.183× at
// 8192×11008×4096, 1.04-1.07× against 1.217× at 8192×5632×2048; SwiGLU's derivative on
// 128×128, 0.996-1.008× against 1.128× at 4096×11008×4096, 1.119× against 1.213× at
// 8192×11008×4096, 1.15-1.27× against 1.235× at 8192×5632×2048 (bench/results/20261130-1424-
// h200-models-llama_mlp-train-every-fusion-pingpong-128x160.json, -1441-...-batch8-every-fusion-
// debug.log, -1432-...-hf-train-pingpong-128x160.json, -1443-...-llama_mlp-train-default-2.json).
// At 0.97 the model still prices them about 7 % above those timings. 64-row ping-pong tiles
// (decode and small-tile picks) keep 0.93.
constexpr double kCublasBase = 0.97, kCoopBase = 0.95, kPingpongBase = 0.93, kPingpong128Base = 0.97;
// The memory bandwidth a grouped kernel reaches when its tile grid does not fill the
// multiprocessors (grouped_mm_us): cuBLAS splits K for such problems, persistent kernels do not.
constexpr double kSmallGridFloor = 0.25;
// The rate at which one multiprocessor streams its tile's slices of A and B (GB/s), about its
// share of the L2 cache's bandwidth: the bound of evtc's kernel on a decode-sized grid of no more
// tiles than multiprocessors, beside the device's bandwidth and the tensor cores' rate. Such a
// grid runs neither at the device's bandwidth nor at a share of it in proportion to its tiles
// (the model before, down to a quarter). Fitted to the H200 sweeps of M <= 64 of 2026-11-28 to -30
// (3,036 timings of 64-row and cooperative 128-row tiles, in one part, K parts and clusters;
// bench/results/*-h200-gemm-sweep*.json; least squares on the log of predicted over measured
// time, with 3 us a kernel and 4.3 TB/s kept, the grids beyond one wave priced as before): 80 GB/s. Anchored at the table's entries
// (anchor_to_table), evtc's kernel is now priced within 5 % of its measured time at 38 of the
// 78 real decode shapes outside the table in the run of -0551-h200-gemm-shapes-decode-off-grid.json
// (22 before; median error 5.2 % against 11.1 %), 30 of 64 and 30 of 72 in the runs of -0304 and
// -0520 (the rows whose pick is today's; 23 and 22 before), none of them fitted to; the grid's
// shapes take their entries' times either way, and the 28 --off-grid shapes of -0134 and -2142
// stayed at 11 and 10 within 5 % (median error 6.0 to 6.1 %, 5.7 to 6.5 %).
constexpr double kTileStreamGBs = 80;

struct Rates {
  double tflops = kTflops16, tbs = kTbsH200;
  int sms = 132;
};

Rates rates_for(DType ab) {
  Rates r;
  if (is_fp8(ab)) r.tflops = kTflops8;
  if (const auto dev = current_device()) {
    if (dev->sm_count > 0) r.sms = dev->sm_count;
    if (dev->name.find("H200") == std::string::npos) r.tbs = kTbsH100;
  }
  return r;
}

// Time of a kernel doing `flops` at `eff` of the rate and moving `bytes` at `bw` of the
// bandwidth, whichever is longer, plus the per-kernel cost.
double kernel_us(double flops, double bytes, double eff, double bw, const Rates& r, double stream_us = 0) {
  return std::max({flops / (r.tflops * 1e6 * eff), bytes / (r.tbs * 1e6 * bw), stream_us}) + kKernelUs;
}

// cuBLAS picks among many kernels: model it by the best grid efficiency among the usual
// tiles, with split-K / stream-K available for grids that do not fill the GPU.
double cublas_efficiency(const GemmDesc& g, const tuning::DeviceLimits& d) {
  double best = 0;
  for (auto [tm, tn] : {std::pair{128, 256}, {256, 128}, {128, 128}, {64, 128}, {64, 256}})
    for (auto sched : {TileSchedulerKind::persistent, TileSchedulerKind::stream_k})
      best = std::max(best, tuning::grid_efficiency(KernelConfig::of(MainloopSchedule::cooperative, tm, tn, 1, sched), g, d));
  return kCublasBase * best;
}

double occupancy(int64_t tiles, int sms) { return std::clamp(double(tiles) / sms, kSmallGridFloor, 1.0); }

// The time one multiprocessor takes to stream its tile's slices of A and B (K in parts: its part
// of K) at kTileStreamGBs, where the tiles times parts fit one wave. 0 beyond it: there the
// efficiencies above, measured on grids of many waves, already hold what the tiles' streaming
// costs (as a bound on every wave it priced the dSwiGLU data gradient on 128x128 tiles at
// 4096x11008x4096 20 % above the unfused path, which measured 0.996-1.008x torch.mm fused).
double tile_stream_us(const KernelConfig& c, const GemmDesc& g, int sms) {
  // Stream-K spreads each tile's K over the multiprocessors: no one of them streams a whole tile.
  if (c.scheduler == TileSchedulerKind::stream_k && c.splits <= 1) return 0;
  const int parts = c.splits * c.k_parts;
  if (tuning::tile_count(c, g) * parts > sms) return 0;
  const GemmDesc t = tuning::tiled_problem(c, g);
  // The tile's rows come from the tiled problem's first operand (B where transposed), its columns
  // from the second.
  const double row_bytes = dtype_bytes(c.swap_ab ? g.b_dtype : g.a_dtype);
  const double col_bytes = dtype_bytes(c.swap_ab ? g.a_dtype : g.b_dtype);
  const double k = double(g.k) / parts;
  const double bytes = (double(std::min<int64_t>(c.tile_m, t.m)) * row_bytes +
                        double(std::min<int64_t>(c.tile_n, t.n)) * col_bytes) * k;
  return bytes / (kTileStreamGBs * 1e3);
}

// The unfused path's GEMMs for the problem `g`: `gemms` of them side by side over N (a merged
// chain's sources), each reading all of A, its part of B and of `extra_ab_bytes`, and writing its
// 16-bit result; `one(part, flops, bytes)` times one of them.
template <class Time>
double side_by_side_us(const GemmDesc& g, double extra_ab_bytes, int gemms, Time one) {
  const int parts = std::max(1, gemms);
  GemmDesc part = g;
  part.n = g.n / parts;
  const double flops = 2.0 * double(g.m) * double(part.n) * double(g.k);
  const double bytes = double(g.m) * g.k * dtype_bytes(g.a_dtype) +
                       (double(g.n) * g.k * dtype_bytes(g.b_dtype) + extra_ab_bytes) / parts + double(g.m) * part.n * 2;
  return parts * one(part, flops, bytes);
}

}  // namespace

// A tile's arithmetic intensity (MN / (M+N)) against a 128×128 tile's: smaller tiles read
// more of A and B per flop, and their main loop runs below the rate (ping-pong 64×128 with a
// wide f32 epilogue measured 2.0× cuBLAS at 8192×6400×1600, bench/results/
// 20261124-1927-h200-models.json); 128-row and larger tiles reach it.
double tile_factor(const KernelConfig& c) {
  return std::min(1.0, (double(c.tile_m) * c.tile_n / (c.tile_m + c.tile_n)) / 64.0);
}

// Epilogues that move two or more 16-bit [m,n] tensors besides D (selection::moves_matrices_besides_d)
// leave all of that traffic exposed on large problems. Timed on the H200 (`evtc run --bench`,
// ping-pong 128×128, B row-major; bench/results/20261130-1158-h200-dswiglu-by-size.json),
// SwiGLU's derivative after the down projection's data gradient (two bf16 operands, two bf16
// outputs) ran behind the same configuration's plain GEMM by about half its traffic at the
// model's bandwidth at 4096×11008 and 4096×14336 (0.05 ms: 0.545 against 0.495 ms, 0.702 against
// 0.647), and by 0.8 and 1.2 times it at 8192×11008 and 8192×14336 (1.237 against 1.106 ms, 1.627
// against 1.357). There it was slower than cuBLAS's GEMM (0.985 and 1.170 ms) plus the derivative's
// own kernel, which the model had put it ahead of. The threshold lies between the sizes measured.
// Those are `evtc run --bench` times, where cuBLAS came out faster than torch.mm timed by
// bench/models.py --kernels (at 4096×11008 the derivative took 1.13× cuBLAS there and 0.996×
// torch.mm in the llama_mlp training row). The training row at 8192 rows (--train-batch 8)
// measured the derivative at 1.119-1.147× torch.mm, about even with cuBLAS plus Inductor's
// kernel: with the 128-row ping-pong rate below, the model fuses it at 8192×11008 (the row took
// 0.999× plain compile with it and without it) and refuses it at 8192×14336, which no row has
// measured (bench/results/20261130-1434 and -1451-h200-models-llama_mlp-train-batch8-*.json).
double epilogue_exposed_share(const Graph& g, const GemmDesc& gemm) {
  const bool large = double(gemm.m) * double(gemm.n) >= kLargeEpilogueElements;
  return large && selection::moves_matrices_besides_d(g) ? 1.0 : kEpilogueExposed;
}

FusionEstimate estimate_for(const KernelConfig& c, const GemmDesc& g, double epilogue_bytes, double extra_ab_bytes,
                            const UnfusedWork& unfused, double exposed) {
  const Rates r = rates_for(g.a_dtype);
  tuning::DeviceLimits d;
  d.sm_count = r.sms;
  FusionEstimate e;
  e.m = g.m;
  e.n = g.n;
  e.k = g.k;
  e.config = c.name();
  e.basis = "model";
  e.saved_bytes = unfused.saved_bytes;
  const double flops = 2.0 * double(g.m) * double(g.n) * double(g.k);
  const double ab = double(g.m) * g.k * dtype_bytes(g.a_dtype) + double(g.n) * g.k * dtype_bytes(g.b_dtype) +
                    extra_ab_bytes;
  // cuBLAS writes the GEMM's own result (16-bit); the fused kernel its outputs. A merged
  // chain's unfused path runs one GEMM per source, each over its part of N and B.
  e.cublas_us = side_by_side_us(g, extra_ab_bytes, unfused.gemms, [&](const GemmDesc& part, double f, double b) {
    return kernel_us(f, b, cublas_efficiency(part, d), 1.0, r);
  });
  const double base = c.schedule == MainloopSchedule::cooperative ? kCoopBase
                      : c.tile_m >= 128                            ? kPingpong128Base
                                                                   : kPingpongBase;
  if (c.k_parts > 1) {
    // K in parts: the GEMM writes the parts' f32 products; a second kernel reads them and
    // writes the epilogue's outputs.
    const double partials = double(c.k_parts) * double(g.m) * double(g.n) * 4;
    e.fused_us = kernel_us(flops, ab + partials, base * tuning::grid_efficiency(c, g, d) * tile_factor(c), 1.0, r,
                           tile_stream_us(c, g, r.sms)) +
                 kernel_us(0, partials + epilogue_bytes, 1.0, 1.0, r);
  } else {
    e.fused_us = kernel_us(flops, ab + epilogue_bytes, base * tuning::grid_efficiency(c, g, d) * tile_factor(c), 1.0,
                           r, tile_stream_us(c, g, r.sms)) +
                 exposed * epilogue_bytes / (r.tbs * 1e6);
  }
  e.epilogue_us = unfused.saved_bytes / (r.tbs * 1e6) + unfused.kernels * kKernelUs;
  return e;
}

// PyTorch's grouped GEMM is a CUTLASS ptr-array kernel like evtc's grouped kernel, not a
// cuBLAS GEMM: it is modelled as evtc's cooperative 128×256 ptr-array kernel (the tile PyTorch
// uses for groups of this size), at the same base efficiency. On the H200 it measured 0.231 ms
// on W6 (8 × 1024×4096×2048) where evtc's grouped kernels took 0.216-0.246 ms and a dense
// cuBLAS GEMM of the same size 0.223 ms (docs/grouped.md); modelled as cuBLAS, the moe layer's
// fusions were refused though they made it 1.09× faster (docs/backend.md, "Cost model").
double grouped_mm_us(const GemmDesc& g, double extra_ab_bytes, int gemms) {
  const Rates r = rates_for(g.a_dtype);
  tuning::DeviceLimits d;
  d.sm_count = r.sms;
  const KernelConfig c = KernelConfig::of(MainloopSchedule::cooperative, 128, 256, 1, TileSchedulerKind::persistent);
  return side_by_side_us(g, extra_ab_bytes, gemms, [&](const GemmDesc& part, double f, double b) {
    return kernel_us(f, b, kCoopBase * tuning::grid_efficiency(c, part, d) * tile_factor(c),
                     occupancy(tuning::tile_count(c, part), r.sms), r);
  });
}

namespace {

// What the epilogue itself moves: its outputs written and its [m,n] operands (C included)
// read; vectors and scalars are small beside them.
double epilogue_bytes(const KernelSignature& sig, int64_t m, int64_t n) {
  double bytes = sig.d_name.empty() ? 0 : double(m) * n * dtype_bytes(sig.d_dtype);
  if (sig.reads_c) bytes += double(m) * n * dtype_bytes(sig.c_dtype);
  for (const OperandSlot& s : sig.pointers) {
    const double count = s.shape == Shape::full ? double(m) * n : s.shape == Shape::half ? double(m) * n / 2 : 0;
    bytes += count * dtype_bytes(s.dtype);
  }
  return bytes;
}

// What the kernel's reductions add to it: each writes partial results to scratch (one per CTA
// tile and column or row; per warp and tile for a whole-matrix one, a few KB), and after the GEMM
// a small kernel of its own reads them and folds them in a fixed order (evtc/device/reduce.cuh).
// A reduction over the kernel's M (a column sum; a row sum of a transposed kernel) is CUTLASS's
// Sm90RowReduction, which at each tile's end folds the tile's columns across its warps (shuffles,
// then shared memory between barriers) before the next tile starts. Timed on the H200 beside
// GELU's derivative (bench/epilogue_sizes.py --exprs dgelu,dgelu_bias_grad, bench/results/
// 20261130-1940-h200-epilogue-sizes.json), against the same configuration without the sum: 2.7-4.1
// us per wave of tiles on cooperative 128x256 (at 4096x6400x1600, 8192x6400x1600 and
// 4096x4096x1024), 7-8.6 us on ping-pong 128x128, where nvcc keeps the row buffer in local memory
// (ptxas: a 400-1120 byte stack frame). Ping-pong 64x256, the rules' pick for short main loops,
// the model already prices above its times (1.02-1.11x), so it adds nothing there.
constexpr double kOverMReductionUsPerWave = 3.0, kOverMReductionUsPerWavePingpong128 = 7.0;

double reductions_us(const KernelSignature& sig, const Graph& graph, const KernelConfig& c, const GemmDesc& g) {
  const Rates r = rates_for(g.a_dtype);
  const int64_t along_m = c.swap_ab ? c.tile_n : c.tile_m, along_n = c.swap_ab ? c.tile_m : c.tile_n;
  const double tiles_m = double((g.m + along_m - 1) / along_m), tiles_n = double((g.n + along_n - 1) / along_n);
  double us = 0;
  for (const OperandSlot& s : sig.pointers) {
    if (!s.is_reduction) continue;
    const double partials = s.shape == Shape::row ? tiles_m * double(g.n) : s.shape == Shape::col ? tiles_n * double(g.m) : 0;
    us += kKernelUs + 2 * partials * 4 / (r.tbs * 1e6);  // written by the GEMM, read by the fold
  }
  bool over_kernel_m = false;
  for (const Node& n : graph.nodes()) over_kernel_m |= n.kind == NodeKind::reduce && reduces_over_kernel_m(n.axis, c);
  if (over_kernel_m && c.tile_m >= 128) {
    const double waves = std::ceil(double(tuning::tile_count(c, g)) / r.sms);
    us += waves * (c.schedule == MainloopSchedule::cooperative ? kOverMReductionUsPerWave
                                                               : kOverMReductionUsPerWavePingpong128);
  }
  return us;
}

}  // namespace

// The model puts evtc's main loop 2 % behind cuBLAS's; timed in their steady state on the H200
// evtc's kernels took 1.015-1.047x cuBLAS's GEMM of the same shape (docs/backend.md, "Tile
// visiting order"). A fusion must therefore be expected to gain more than that spread.
constexpr double kProfitMargin = 0.03;

bool selection::ahead_by_margin(double fused_us, double unfused_us) {
  return fused_us < unfused_us - std::max(0.5, kProfitMargin * unfused_us);
}

bool FusionEstimate::profitable() const { return selection::ahead_by_margin(fused_us, cublas_us + epilogue_us); }

std::string FusionEstimate::describe() const {
  // Negative where the fused kernel writes values the unfused path never stores (a consumer's
  // kernel computes them): what fusion adds is taken off the unfused side.
  if (epilogue_us < 0)
    return fmt::format("{:.1f} us fused vs {:.1f} - {:.1f} us unfused ({}, {}; the fused kernel writes values the "
                       "unfused path computes inside another kernel)",
                       fused_us, cublas_us, -epilogue_us, basis, config);
  return fmt::format("{:.1f} us fused vs {:.1f} + {:.1f} us unfused ({}, {})", fused_us, cublas_us, epilogue_us,
                     basis, config);
}

// Whether the table's measurement holds here, not only the model's scaling of it. The model
// scales a measured time to another shape by its rates, which do not know where cuBLAS changes
// kernels: anchored at 64x1024x4096 (evtc 10.5 us, cuBLAS 10.1) it put evtc at 6.7 us and
// cuBLAS at 10.1 at 64x2048x2048, where they took 8.6 and 8.9 (H200, bench/results/
// 20261129-0430-h200-gemm-shapes-decode-bare-first-rule.json). So: the table's own shape; or
// the entry's configuration unchanged, covering this M in as many tiles as the entry's M, with
// the entry's weights (N and K: decode batches between the table's M values, 13 rows run as the
// 16-row entry did) or where the three entries nearest in N and K at the entry's M all measured
// evtc ahead by the margin (the fp8 table at M <= 64, where evtc's two-level main loop is ahead
// at every entry).
bool selection::measured_here(const selection::TableChoice& t, const GemmDesc& g) {
  if (t.exact) return true;
  if (!(t.config == t.entry.config)) return false;
  GemmDesc there = g;
  there.m = t.entry.m;
  if (tuning::tile_count(t.config, g) != tuning::tile_count(t.config, there)) return false;
  if (t.entry.n == g.n && t.entry.k == g.k) return true;
  const SelectionTable* table = shipped_table_named(t.table);
  if (!table) return false;
  const auto near = nearest_in_n_and_k(*table, t.entry.m, g.n, g.k, 3);
  return near.size() == 3 && std::all_of(near.begin(), near.end(), [](const TableEntry* e) {
           return ahead_by_margin(e->ms * 1e3, e->cublas_ms * 1e3);
         });
}

namespace {

// Where the shipped table measured this configuration (selection/shipped_table.hpp), the model is
// anchored to the measurement: at the entry's shape, evtc's kernel with the table's epilogue
// (a plain 16-bit D, or D = acc + r[m,n] for a residual table) and cuBLAS's GEMM took the
// table's times; here, each is that time scaled by the model's ratio
// of here to there. On the table's own shapes the plain GEMM's price is then the measured time.
void anchor_to_table(FusionEstimate& e, const selection::TableChoice& t, const GemmDesc& g) {
  if (t.entry.ms <= 0 || t.entry.cublas_ms <= 0) return;
  GemmDesc there = g;
  there.m = t.entry.m;
  there.n = t.entry.n;
  there.k = t.entry.k;
  // The entry's own configuration, which its times measured (the choice may adapt it to here),
  // with the epilogue the table measured (D, and a residual table's [m,n] operand).
  const selection::SelectionTable* table = selection::shipped_table_named(t.table);
  const double measured_bytes = table ? table->epilogue_bytes(there.m, there.n) : double(there.m) * there.n * 2;
  const FusionEstimate plain = estimate_for(t.entry.config, there, measured_bytes, 0, UnfusedWork{});
  e.fused_us *= t.entry.ms * 1e3 / plain.fused_us;
  e.cublas_us *= t.entry.cublas_ms * 1e3 / plain.cublas_us;
  e.basis = fmt::format("table {} at {}x{}x{}", t.table, t.entry.m, t.entry.n, t.entry.k);
  e.measured = selection::measured_here(t, g);
}

}  // namespace

bool selection::runs_table_entry(const KernelConfig& chosen, const KernelConfig& entry) {
  KernelConfig same = entry;
  same.precise_math = chosen.precise_math;
  return same == chosen;
}

FusionEstimate Kernel::estimate(int64_t m, int64_t n, int64_t k, const UnfusedWork& unfused) const {
  GemmDesc g = impl_->options.gemm;
  g.m = m;
  g.n = n;
  g.k = k;
  const ConfigChoice choice = config_choice(m, n, k);
  FusionEstimate e = estimate_for(choice.config, g, epilogue_bytes(impl_->signature, m, n), 0, unfused,
                                  epilogue_exposed_share(impl_->graph, g));
  if (choice.source == ConfigChoice::Source::table)
    if (const auto t = selection::table_choice(impl_->graph, g); t && selection::runs_table_entry(choice.config, t->config))
      anchor_to_table(e, *t, g);
  e.fused_us += reductions_us(impl_->signature, impl_->graph, choice.config, g);
  return e;
}

}  // namespace evtc
