// The autotuner's parts that need no GPU: the candidate configurations of a problem (pruned
// by heuristics before anything is compiled), and the store of tuned choices on disk.
//
// A tuned choice is persisted under $EVTC_CACHE_DIR/tuning/<problem key>/<M>x<N>x<K>.json,
// one file per problem shape, written to a temporary file and renamed into place (so
// concurrent processes never read half a record). The problem key hashes the graph's hash,
// the A/B dtypes and layouts, the precise-math flag, the target arch and the device name:
// a choice is only reused for the same epilogue on the same kind of GPU.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "evtc/gemm.hpp"
#include "evtc/graph.hpp"
#include "evtc/kernel.hpp"

namespace evtc::tuning {

// What candidate generation knows about the GPU.
struct DeviceLimits {
  int sm_count = 132;                    // H100 SXM
  int smem_bytes_per_block = 227 * 1024;  // opt-in shared memory per block on sm90
};

// The candidate configurations for a problem, best-first by the heuristic score, at most
// `max_candidates` of them (0: no limit). The space: CTA tiles 128×128×64, 128×256×64,
// 256×128×64, 64×128×64, 64×256×64 (and the K tile of 128 for fp8); clusters 1×1, 2×1,
// 1×2; cooperative and ping-pong schedules; persistent and stream-K tile schedulers.
// Pruned before compiling: configurations CUTLASS cannot build (see KernelConfig::parse),
// ping-pong tiles whose accumulators do not fit one warp group's registers, clusters wider
// than the problem's tile grid, main-loop stages that do not fit shared memory, tiles mostly
// outside the problem (M or N far below the tile), stream-K where the persistent grid
// already fills its waves, and — for epilogues with reductions — stream-K (the reductions
// combine one partial per tile and warp; a K-split tile would be counted twice). fp8's
// two-level accumulation counts its accumulators twice.
std::vector<KernelConfig> candidate_configs(const Graph& g, const GemmDesc& gemm,
                                            const DeviceLimits& device = {},
                                            size_t max_candidates = 0);

// Why a configuration is pruned for this problem; empty if it is kept.
std::string prune_reason(const KernelConfig& c, const Graph& g, const GemmDesc& gemm,
                         const DeviceLimits& device = {});

// The heuristic score of a configuration (higher is better): the fraction of the
// multiprocessors' tile slots doing useful work over all waves, times the tile's
// arithmetic intensity relative to the largest tile.
double heuristic_score(const KernelConfig& c, const GemmDesc& gemm, const DeviceLimits& device = {});

// The fraction of the tile grid's work slots that do useful work: the padding of partial
// tiles times, for persistent kernels, the last wave's occupancy (stream-K balances its
// waves, less its fix-up). The cost model and the candidate score share it.
double grid_efficiency(const KernelConfig& c, const GemmDesc& gemm, const DeviceLimits& device = {});
// Output tiles (CTAs' worth of work) of a problem.
int64_t tile_count(const KernelConfig& c, const GemmDesc& gemm);

// Which problems a tuned choice applies to.
struct ProblemIdentity {
  std::string graph_hash;  // graph_hash_hex of the lowered graph
  GemmDesc gemm;           // dtypes and layouts (sizes ignored)
  bool precise_math = false;
  int arch = 90;
  std::string device_name;  // e.g. "NVIDIA H100 80GB HBM3"
};
// 16 hex digits naming the folder of a problem's tuned choices.
std::string problem_key(const ProblemIdentity& id);

struct CandidateTiming {
  std::string config;     // KernelConfig::name()
  double median_ms = -1;  // < 0 when it failed
  std::string error;      // why it failed (did not compile, cannot implement, launch failed)
};

struct TuningRecord {
  int64_t m = 0, n = 0, k = 0;
  KernelConfig best;
  double best_ms = 0;
  std::vector<CandidateTiming> candidates;
  ProblemIdentity identity;
  std::string tuned_at;  // UTC, ISO 8601

  std::string to_json() const;
  // Parses to_json(); throws RuntimeError naming what is wrong.
  static TuningRecord from_json(const std::string& text);
};

// The tuned choices of one problem identity in a cache folder.
class TuningStore {
 public:
  TuningStore(std::string cache_dir, const ProblemIdentity& id);
  // Writes the record (replacing an older one of the same shape); returns its path.
  std::string save(const TuningRecord& r) const;
  std::optional<TuningRecord> find(int64_t m, int64_t n, int64_t k) const;
  // Every record, in no particular order; unreadable files are skipped.
  std::vector<TuningRecord> all() const;
  const std::string& folder() const { return folder_; }

 private:
  std::string folder_;
};

// The current time, UTC, ISO 8601 (a record's tuned_at).
std::string utc_now();

// The record of `records` nearest to M×N×K: the smallest sum of |log| ratios of M, N and K
// (a problem twice as large in one dimension is as far as one half as large).
std::optional<TuningRecord> nearest(const std::vector<TuningRecord>& records, int64_t m, int64_t n,
                                    int64_t k);

}  // namespace evtc::tuning
