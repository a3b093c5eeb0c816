#include <fmt/format.h>

#include <algorithm>

#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <tuple>

#include "evtc/arch.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/kernel.hpp"
#include "evtc/passes.hpp"
#include "runtime/autotuner.hpp"
#include "runtime/device_info.hpp"

namespace evtc {

std::string KernelConfig::name() const {
  if (schedule == MainloopSchedule::multistage)
    return fmt::format("ms_{}x{}x{}_s{}{}", tile_m, tile_n, tile_k, stages, precise_math ? "_precise" : "");
  return fmt::format("{}_{}x{}x{}_c{}x{}_{}{}{}{}",
                     schedule == MainloopSchedule::cooperative ? "coop" : "pingpong", tile_m,
                     tile_n, tile_k, cluster_m, cluster_n,
                     scheduler == TileSchedulerKind::persistent ? std::string("persistent")
                     : splits > 1                               ? fmt::format("splitk{}", splits)
                                                                : std::string("streamk"),
                     fp8_fast_accum ? "_fastacc" : "",
                     fp8_promotion_k > 0 ? fmt::format("_pk{}", fp8_promotion_k) : "",
                     precise_math ? "_precise" : "");
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
      R"((coop|pingpong)_(\d+)x(\d+)x(\d+)_c(\d+)x(\d+)_(persistent|streamk|splitk(\d{1,2}))(_fastacc)?(?:_pk(\d{3,5}))?(_precise)?)");
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
  c.fp8_fast_accum = m[9].matched;
  if (m[10].matched) {
    c.fp8_promotion_k = std::stoi(m[10]);
    // Whole K tiles, and not combined with fast accumulation (which never promotes).
    if (c.fp8_promotion_k % c.tile_k != 0 || c.fp8_fast_accum) return std::nullopt;
  }
  c.precise_math = m[11].matched;
  if (c.schedule == MainloopSchedule::pingpong && c.scheduler == TileSchedulerKind::stream_k)
    return std::nullopt;  // CUTLASS's ping-pong kernel has no stream-K (nor split-K)
  if (c.schedule == MainloopSchedule::cooperative && c.tile_m < 128) return std::nullopt;
  return c;
}

namespace {
OperandSlot slot_of(const Node& n) {
  OperandSlot s;
  s.name = n.name;
  s.kind = n.kind;
  s.dtype = n.dtype;
  s.shape = n.shape;
  s.layout = n.layout;
  return s;
}
}  // namespace

namespace {

// Shared memory of the epilogue per CTA, after CUTLASS's sm90 epilogue: subtiles of (tile
// rows, at most 128)×32; 4 stages for each emitted aux load (an operand read at several places
// is loaded at each place the backend emits it: plan_dag's `reads`); 2 for each [m,n] store
// (D and the extra outputs); a tile row for each emitted row broadcast; about 8 KiB per
// reduction and 1 KiB of pipeline state. Gated [m,n/2] outputs stage nothing. Checked against
// sizeof(CollectiveEpilogue::SharedStorage) of generated kernels: an fp8 epilogue of eight
// outputs reading one f32 [m,n] operand at two places stages 179 KiB at 64×128 (the model:
// 178.75 KiB), which leaves one main-loop stage; a backward-style epilogue with three aux
// operands and three outputs 144.5 KiB at 128×128 (the model: 145 KiB).
size_t epilogue_smem_bytes(const Graph& g, const KernelConfig& c) {
  const size_t kSubtile = size_t(std::min(c.tile_m, 128)) * 32;
  const DagPlan plan = plan_dag(g, make_signature(g).d_name);
  size_t bytes = 1024;
  for (NodeId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    const size_t reads = size_t(plan.reads[id]);
    if (n.kind == NodeKind::aux)
      bytes += reads * 4 * kSubtile * dtype_bytes(n.dtype);
    else if (n.kind == NodeKind::source)
      bytes += (reads > 0 ? 4 : 0) * kSubtile * dtype_bytes(n.dtype);  // the collective's C buffer
    else if (n.kind == NodeKind::row_vec)
      bytes += reads * size_t(c.tile_n) * dtype_bytes(n.dtype);
    else if (n.kind == NodeKind::store && n.shape == Shape::full)
      bytes += 2 * kSubtile * dtype_bytes(n.dtype);
    else if (n.kind == NodeKind::reduce)
      bytes += 8 * 1024;  // partials staged per tile (an estimate: evtc fuzz found a whole-matrix amax
                          // beside eight outputs failing where the terms above left exactly 2 stages)
  }
  return bytes;
}

// Main-loop stages left beside the epilogue's shared memory (227 KiB per CTA on sm90); each
// stage holds an A and a B tile and its pipeline barriers.
int mainloop_stages(const KernelConfig& c, const GemmDesc& gemm, size_t epilogue_bytes) {
  constexpr size_t kSmem = 232448, kReserved = 1024, kBarriers = 32;
  const size_t stage =
      size_t(c.tile_m * dtype_bytes(gemm.a_dtype) + c.tile_n * dtype_bytes(gemm.b_dtype)) * size_t(c.tile_k) +
      kBarriers;
  if (epilogue_bytes + kReserved >= kSmem) return 0;
  return int((kSmem - kReserved - epilogue_bytes) / stage);
}

}  // namespace

namespace {

constexpr int kMinStages = 2;  // CUTLASS's sm90 main loops static_assert this many

// One 16-bit output ([m,n], or [m,n/2] gated), no [m,n] operand (aux or C), no reduction, and
// the accumulator read once (or by the gate/up halves only): the epilogues the 192-column
// tiles were measured with, and ones like them that keep beside 192 accumulators a thread
// what fits in registers (ptxas -v, no spills: silu(acc + bias), swiglu7,
// tanh(gelu(acc·sa[m]·sb[n] + bias[n])·0.5 + 1); spills: three outputs and an [m,n] operand,
// or acc read at three places, at 256×192 and ping-pong 128×192).
bool light_epilogue(const Graph& g) {
  int stores = 0, acc_reads = 0;
  for (const Node& n : g.nodes()) {
    if (n.kind == NodeKind::reduce) return false;
    if (n.kind == NodeKind::aux || n.kind == NodeKind::source) return false;
    if (n.kind == NodeKind::store) {
      if (dtype_bytes(n.dtype) > 2) return false;
      ++stores;
    }
    if (n.kind != NodeKind::pair)
      for (NodeId in : n.inputs) acc_reads += g.node(in).kind == NodeKind::accum;
  }
  return stores == 1 && acc_reads <= 1;
}

bool reduces_over_m(const Graph& g) {
  for (const Node& n : g.nodes())
    if (n.kind == NodeKind::reduce && n.axis != ReduceAxis::row) return true;
  return false;
}

}  // namespace

std::string shared_memory_refusal(const Graph& g, const GemmDesc& gemm, const KernelConfig& c) {
  // CUTLASS 2.x kernels keep the main loop's and the epilogue's shared memory in one union.
  if (c.schedule == MainloopSchedule::multistage) return "";
  const size_t epilogue = epilogue_smem_bytes(g, c);
  if (mainloop_stages(c, gemm, epilogue) >= kMinStages) return "";
  return fmt::format("the epilogue stages about {} KiB of [m,n] tensors in shared memory, which leaves configuration "
                     "{} fewer than {} main-loop stages (fewer outputs or [m,n] operands would fit)",
                     epilogue / 1024, c.name(), kMinStages);
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
  if (f.fused && !f.stream_k && c.scheduler == TileSchedulerKind::stream_k)
    return fmt::format("configuration {} asks for stream-K, which evtc's {} kernels do not use", c.name(),
                       arch_name(gemm.sm, true));
  if (f.fused && !f.any_tile_n && c.tile_n != 64 && c.tile_n != 128 && c.tile_n != 192 && c.tile_n != 256)
    return fmt::format("configuration {} has {}-column tiles; {} kernels take 64, 128, 192 or 256 columns", c.name(),
                       c.tile_n, arch_name(gemm.sm, true));
  if (f.fused && !f.two_level_fp8 && (c.fp8_fast_accum || c.fp8_promotion_k > 0))
    return fmt::format("configuration {} sets fp8's accumulation ({}), which only Hopper's two-level fp8 main "
                       "loop has",
                       c.name(), c.fp8_fast_accum ? "_fastacc" : "_pk");
  if (gemm.sm == 100 && c.tile_m != 64 && c.tile_m != 128 && c.tile_m != 256)
    return fmt::format("configuration {} has {}-row tiles; sm_100a's MMA takes 64 or 128 rows on one SM, 256 on "
                       "two",
                       c.name(), c.tile_m);
  if (gemm.sm == 100 && c.tile_m == 256 && c.cluster_m % 2 != 0)
    return fmt::format("configuration {} has 256-row tiles, which sm_100a computes on two SMs of a cluster: the "
                       "cluster's M must be even (e.g. c2x1)",
                       c.name());
  if (c.fp8_promotion_k > 0 &&
      (!is_fp8(gemm.a_dtype) || gemm.fp8_blockwise || gemm.fp8_fast_accum || c.fp8_fast_accum))
    return fmt::format("configuration {} sets fp8's promotion interval (_pk{}), which only the two-level "
                       "accumulation of fp8 A/B without block scales has",
                       c.name(), c.fp8_promotion_k);
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
  KernelConfig c = KernelConfig::of(MainloopSchedule::cooperative, 128, gemm.sm == 120 || !only_d ? 128 : 256, 1);
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
  if (backend_features(gemm.sm, gemm.a_dtype).backend == 80) return multistage_default_config(gemm);
  KernelConfig c = gemm.sm == 100 || gemm.sm == 120 ? blackwell_default_config(g, gemm) : default_config_for_shape(g, gemm);
  // An epilogue with many staged [m,n] tensors leaves a 128×256 tile too few main-loop
  // stages (fewer than 2 does not compile; fewer than 3 stalls on memory): use 128×128.
  if (c.tile_n == 256 && mainloop_stages(c, gemm, epilogue_smem_bytes(g, c)) < 3) c.tile_n = 128;
  // Wider still (eight outputs, f32 ones, [m,n] operands: `evtc fuzz` found them failing
  // CUTLASS's stage assertion): 64-row ping-pong tiles stage half as much per tile. Column and
  // whole-matrix reductions need the cooperative schedule: those are refused instead
  // (shared_memory_refusal).
  if (mainloop_stages(c, gemm, epilogue_smem_bytes(g, c)) < kMinStages && !reduces_over_m(g) &&
      backend_features(gemm.sm, gemm.a_dtype).pingpong) {
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
std::optional<KernelConfig> one_wave_config(const GemmDesc& g, int sms) {
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

}  // namespace

KernelConfig default_config_for_shape(const Graph& g, const GemmDesc& gemm) {
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
  tuning::DeviceLimits device;
  if (const auto dev = current_device(); dev && dev->sm_count > 0) device.sm_count = dev->sm_count;
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

KernelSignature make_signature(const Graph& g) {
  KernelSignature sig;
  const auto order = canonical_order(g);
  // The main output.
  for (NodeId id : order) {
    const Node& n = g.node(id);
    if (n.kind == NodeKind::store && n.shape == Shape::full && n.name == "D") sig.d_name = n.name;
  }
  if (sig.d_name.empty())
    for (NodeId id : order) {
      const Node& n = g.node(id);
      if (n.kind == NodeKind::store && n.shape == Shape::full) {
        sig.d_name = n.name;
        break;
      }
    }
  for (NodeId id : order) {
    const Node& n = g.node(id);
    OperandSlot s = slot_of(n);
    switch (n.kind) {
      case NodeKind::source:
        sig.reads_c = true;
        sig.c_dtype = n.dtype;
        break;
      case NodeKind::scalar:
        if (n.scalar_kind == ScalarKind::constant) break;
        s.scalar_kind = n.scalar_kind;
        (n.scalar_kind == ScalarKind::value ? sig.scalars : sig.pointers).push_back(s);
        break;
      case NodeKind::row_vec:
      case NodeKind::col_vec:
      case NodeKind::aux: sig.pointers.push_back(s); break;
      default: break;
    }
  }
  for (NodeId id : order) {
    const Node& n = g.node(id);
    if (n.kind != NodeKind::store) continue;
    if (n.name == sig.d_name) {
      sig.d_dtype = n.dtype;
      continue;
    }
    OperandSlot s = slot_of(n);
    s.is_output = true;
    const Node& in = g.node(n.inputs[0]);
    if (in.kind == NodeKind::reduce) {
      s.is_reduction = true;
      s.reduce_op = in.reduce_op;
    }
    sig.pointers.push_back(s);
  }
  return sig;
}

std::string KernelSignature::to_json() const {
  using nlohmann::json;
  auto slot_json = [](const OperandSlot& s) {
    json j{{"name", s.name},
           {"kind", node_kind_name(s.kind)},
           {"dtype", dtype_name(s.dtype)},
           {"shape", s.shape == Shape::scalar ? "scalar" : std::string(shape_name(s.shape))},
           {"output", s.is_output}};
    if (s.is_reduction) j["reduce"] = reduce_op_name(s.reduce_op);
    if (s.kind == NodeKind::scalar) j["by_pointer"] = s.scalar_kind == ScalarKind::pointer;
    return j;
  };
  json j;
  j["pointers"] = json::array();
  for (const auto& s : pointers) j["pointers"].push_back(slot_json(s));
  j["scalars"] = json::array();
  for (const auto& s : scalars) j["scalars"].push_back(slot_json(s));
  j["reads_c"] = reads_c;
  if (reads_c) j["c_dtype"] = dtype_name(c_dtype);
  j["d"] = d_name;
  if (!d_name.empty()) j["d_dtype"] = dtype_name(d_dtype);
  return j.dump();
}

std::string KernelSignature::c_export() const {
  std::string escaped;
  for (char c : to_json()) {
    if (c == '"' || c == '\\') escaped += '\\';
    escaped += c;
  }
  return fmt::format("const char* evtc_kernel_signature(void) {{ return \"{}\"; }}\n", escaped);
}

}  // namespace evtc
