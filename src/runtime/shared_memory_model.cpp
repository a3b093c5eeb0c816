#include "runtime/shared_memory_model.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "evtc/passes.hpp"

namespace evtc {

// Shared memory of the epilogue per CTA, after CUTLASS's sm90 epilogue: subtiles of (tile
// rows, at most 128)×32; 4 stages for each emitted aux load (an operand read at several places
// is loaded at each place the backend emits it: plan_dag's `reads`); 2 for each [m,n] store
// (D and the extra outputs); a tile row for each emitted row broadcast, padded to 1 KiB (the
// next staged tile is aligned to 1 KiB for its swizzle); about 8 KiB per reduction and 1 KiB of
// pipeline state. Gated [m,n/2] outputs stage nothing. Checked against
// sizeof(CollectiveEpilogue::SharedStorage) of generated kernels, at ping-pong 64×128:
//   - an fp8 epilogue of eight outputs reading one f32 [m,n] operand at two places, and f32 row
//     vectors: 179 KiB (the model: 179 KiB; 178.75 before the padding), one main-loop stage left;
//   - eight outputs, two bf16 [m,n] operands read at three places each and a bf16 row vector at
//     two: 179 KiB (183,296 bytes; the model: the same). Without the padding the model said
//     177.5 KiB and two stages, and nvcc refused the configuration (evtc fuzz, seed 20261128).
// And at cooperative 128×128, a backward-style epilogue with three aux operands and three
// outputs: 144.5 KiB (the model before the padding: 145 KiB).
size_t epilogue_smem_bytes(const Graph& g, const KernelConfig& c) {
  constexpr size_t kTileAlignment = 1024;
  const auto round_up = [](size_t bytes, size_t to) { return (bytes + to - 1) / to * to; };
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
      bytes += reads * round_up(size_t(c.tile_n) * dtype_bytes(n.dtype), kTileAlignment);
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
      // A transposed kernel's (KernelConfig::swap_ab) tile rows are B's, its columns A's.
      size_t(c.tile_m * dtype_bytes(c.swap_ab ? gemm.b_dtype : gemm.a_dtype) +
             c.tile_n * dtype_bytes(c.swap_ab ? gemm.a_dtype : gemm.b_dtype)) * size_t(c.tile_k) +
      kBarriers;
  if (epilogue_bytes + kReserved >= kSmem) return 0;
  return int((kSmem - kReserved - epilogue_bytes) / stage);
}


std::string shared_memory_refusal(const Graph& g, const GemmDesc& gemm, const KernelConfig& c) {
  // CUTLASS 2.x kernels keep the main loop's and the epilogue's shared memory in one union.
  if (c.schedule == MainloopSchedule::multistage) return "";
  const size_t epilogue = epilogue_smem_bytes(g, c);
  if (mainloop_stages(c, gemm, epilogue) >= kMinMainloopStages) return "";
  return fmt::format("the epilogue stages about {} KiB of [m,n] tensors in shared memory, which leaves configuration "
                     "{} fewer than {} main-loop stages (fewer outputs or [m,n] operands would fit)",
                     epilogue / 1024, c.name(), kMinMainloopStages);
}


}  // namespace evtc
