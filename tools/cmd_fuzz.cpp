// evtc fuzz: random differential testing. Random epilogues (src/testing/random_epilogue), several
// packed into each kernel as independent outputs, checked end to end against the fp64
// reference: on the GPU the fused kernel and the unfused path (cuBLASLt + plain epilogue) on
// sizes that are not tile multiples, with poisoned outputs; with --cpu (no GPU) the pass pipeline
// against the reference before the passes, legality and both emitters. A mismatch prints a
// ready-to-run `evtc run ... --check` line for the output alone; --json records each failing
// case (its epilogue, sizes, seed and metric), not only their count.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <charconv>
#include <cstdio>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <semaphore>
#include <string_view>
#include <thread>

#include "cli.hpp"
#include "evtc/jit.hpp"
#include "evtc/error.hpp"
#include "evtc/log.hpp"
#include "evtc/expression.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/ops.hpp"
#include "evtc/reference.hpp"
#include "testing/harness.hpp"
#include "testing/pass_check.hpp"
#include "testing/random_epilogue.hpp"
#include "testing/shrink.hpp"

namespace evtc::cli {
namespace {

using testing::KernelKind;
using testing::RandomKernel;

struct FuzzArgs {
  uint64_t seed = 1;
  int count = 200, min_outputs = 1, max_outputs = 8, max_depth = 4, isolate = 5;
  double compile_for = 0;  // > 0: start no compile after this many seconds
  double reduction_share = testing::GeneratorOptions{}.reduction_share;  // of the 16-bit kernels
  int shrink_rounds = 4;   // batches of smaller candidates tried per isolated mismatch
  bool cpu = false, print = false, integers = false, compile_only = false;
  std::string json;
  std::string shard;  // "K/N": kernels K, K+N, K+2N, ... of the run
};

// --shard K/N: {K, N}, or nullopt where the text is not a shard (0 <= K < N). A run split into
// shards 0/N .. N-1/N (on as many GPUs) checks the same kernels as the whole run, each once.
std::optional<std::pair<int, int>> parse_shard(const std::string& text) {
  auto number = [](std::string_view s) -> std::optional<int> {
    int v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
    return v;
  };
  const size_t slash = text.find('/');
  if (slash == std::string::npos) return std::nullopt;
  const auto k = number(std::string_view(text).substr(0, slash));
  const auto n = number(std::string_view(text).substr(slash + 1));
  if (!k || !n || *n < 1 || *k < 0 || *k >= *n) return std::nullopt;
  return std::pair{*k, *n};
}

const CLI::Validator& shard_value() {
  static const CLI::Validator v = CLI::Validator(
      [](std::string& text) -> std::string {
        return parse_shard(text) ? std::string()
                                 : fmt::format("'{}' is not a shard K/N with 0 <= K < N (e.g. 0/4, the first of four)",
                                               text);
      },
      "K/N");
  return v;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

ParseOptions parse_options_for(const RandomKernel& k) {
  ParseOptions p;
  p.operand_dtype = k.kind == KernelKind::fp8 ? DType::f32 : k.gemm.a_dtype;
  p.output_dtype = DType::bf16;
  return p;
}

struct Case {
  size_t index = 0;  // the kernel's number in the whole run (the same in every shard)
  RandomKernel kernel;
  int64_t m = 0, n = 0, k = 0;
  uint64_t seed = 0;
  bool integers = false;  // integer-valued inputs, exact results
  // A configuration the case is compiled with instead of the default: a transposed (swap-AB)
  // one for some decode-sized cases. Empty: the default.
  std::string config;
};

CompileOptions options_for(const Case& c, bool disable) {
  CompileOptions o;
  o.gemm = c.kernel.gemm;
  o.disable_fusion = disable;
  if (!c.config.empty()) o.config = KernelConfig::parse(c.config);
  return o;
}

ReferenceInputs inputs_for(const Case& c, const Graph& g) {
  return c.integers ? random_integer_inputs(g, c.m, c.n, c.k, c.seed)
                    : random_reference_inputs(g, c.m, c.n, c.k, c.kernel.gemm.a_dtype, c.kernel.gemm.b_dtype, c.seed);
}

// Sizes that are not tile multiples and satisfy the kernel's alignment (16-byte rows of A,
// B and the outputs; fp8 rows of 16 elements; even N for gated outputs).
void choose_sizes(Case& c, std::mt19937_64& rng) {
  auto pick = [&](int lo, int hi) { return int64_t(std::uniform_int_distribution<int>(lo, hi)(rng)); };
  // M a multiple of 8 (an odd one: never a tile multiple) where a column vector or a column-major
  // A needs 16-byte columns, else any.
  const bool m_aligned = c.kernel.gemm.a_layout == Layout::col_major || c.kernel.text().find("[m]") != std::string::npos;
  c.m = m_aligned ? 8 * (2 * pick(5, 45) + 1) : 8 * pick(9, 90) + pick(1, 7);
  c.n = 16 * pick(5, 40);
  c.k = (c.kernel.kind == KernelKind::fp8 ? 16 : 8) * pick(8, 40);
  // The case's epilogue as its kernel lowers it, built once where a configuration is checked
  // against it; nullptr where it does not lower (the case reports that error when it runs).
  std::optional<Graph> graph;
  bool lowered = false;
  auto epilogue = [&]() -> const Graph* {
    if (!lowered) {
      lowered = true;
      PipelineOptions popts;
      popts.gemm = c.kernel.gemm;
      try {
        graph = run_pipeline(parse_expression(c.kernel.text(), parse_options_for(c.kernel)), popts);
      } catch (const Error&) {
      }
    }
    return graph ? &*graph : nullptr;
  };
  // A quarter of the cases that have a transposed kernel (no gated output) run decode-sized M
  // (at most 64 rows, never a tile multiple where alignment allows) with a transposed
  // configuration of 16 or 32 columns. Its K tile is 128 for every dtype: fp8's two-level
  // accumulation promotes every 128 of K (config_refusal), as the fp8 tables' decode entries do.
  const bool swappable = c.kernel.kind != KernelKind::gated;
  if (swappable && pick(0, 3) == 0) {
    c.m = m_aligned ? 8 * pick(1, 8) : pick(1, 64);
    const int width = pick(0, 1) ? 32 : 16;
    c.config = fmt::format("pingpong_64x{}x128_c1x1_persistent_swap", width);
    // Half of them, where the epilogue has no reduction, compute K in 2 or 4 parts added by the
    // plain epilogue (KernelConfig::k_parts), K rounded up to whole 16-byte parts. Decided by the
    // case's seed, so that the generator's draws (and every other case of a seed) stay as they were.
    if ((c.seed >> 7) % 2 == 0) {
      KernelConfig parts = *KernelConfig::parse(c.config);
      parts.k_parts = (c.seed >> 9) % 2 ? 4 : 2;
      const int64_t unit = parts.k_parts * (c.kernel.kind == KernelKind::fp8 ? 16 : 8);
      if (const Graph* g = epilogue(); g && epilogue_config_refusal(*g, parts).empty()) {
        c.config = parts.name();
        c.k = (c.k + unit - 1) / unit * unit;
      }
    }
    // Half of the others, where N holds four 64-row tiles of the transposed problem, run in 4x1
    // clusters (the activations' tile multicast to four CTAs along N), as the H200's decode
    // entries do: the 64-row ping-pong tile, or the 128-row cooperative one. Decided by the
    // case's seed, as above; where the epilogue cannot take the tile the case keeps its own.
    if (c.config.find("kparts") == std::string::npos && (c.seed >> 11) % 2 == 0 && c.n >= 4 * 64) {
      const KernelConfig clustered = *KernelConfig::parse(
          (c.seed >> 12) % 2 ? fmt::format("pingpong_64x{}x128_c4x1_persistent_swap", width)
                             : fmt::format("coop_128x{}x64_c4x1_persistent_swap", width));
      if (const Graph* g = epilogue(); g && epilogue_config_refusal(*g, clustered).empty() &&
                                       shared_memory_refusal(*g, c.kernel.gemm, clustered).empty() &&
                                       config_refusal(clustered, c.kernel.gemm).empty())
        c.config = clustered.name();
    }
  } else if (c.kernel.kind != KernelKind::fp8 && pick(0, 3) == 0) {
    // A quarter of the other 16-bit cases run a tile whose width is an odd multiple of 16, as the
    // selection tables pick for grids the usual widths fill badly: one wgmma of CUTLASS's
    // extended widths and 16-column epilogue subtiles. Where the epilogue cannot take one (a
    // column reduction in a tall tile, or too much shared memory) the case keeps the default.
    static const char* const kFitted[] = {"pingpong_128x80x64_c1x1_persistent", "pingpong_128x112x64_c2x1_persistent",
                                          "coop_256x144x64_c1x1_persistent", "pingpong_64x176x64_c1x1_persistent"};
    const KernelConfig fitted = *KernelConfig::parse(kFitted[pick(0, 3)]);
    if (const Graph* g = epilogue();
        g && epilogue_config_refusal(*g, fitted).empty() && shared_memory_refusal(*g, c.kernel.gemm, fitted).empty())
      c.config = fitted.name();
  }
}

std::string run_line(const Case& c, std::string text) {
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return fmt::format("evtc run '{}' -m {} -n {} -k {} {} --seed {}{}{} --check", text, c.m, c.n, c.k,
                     c.kernel.cli_options(), c.seed, c.integers ? " --integer-inputs" : "",
                     c.config.empty() ? "" : " --config " + c.config);
}

std::string run_line(const Case& c, size_t output) { return run_line(c, c.kernel.text_of(output)); }

// What a run's expressions exercise, counted per expression (output) from its parsed graph:
// comparisons (eq ne lt le gt ge), the index leaves m and n, row_logsumexp, and any reduction.
struct Coverage {
  size_t expressions = 0, comparisons = 0, indices = 0, row_logsumexp = 0, reductions = 0;

  // A kernel's expressions, each parsed alone.
  static Coverage of(const Case& c) {
    Coverage r;
    for (size_t o = 0; o < c.kernel.outputs.size(); ++o) {
      const Graph g = parse_expression(c.kernel.text_of(o), parse_options_for(c.kernel));
      bool comparison = false, index = false, lse = false, reduction = false;
      for (const Node& n : g.nodes()) {
        comparison |= n.kind == NodeKind::compute && op_info(n.op).comparison;
        index |= n.kind == NodeKind::index;
        reduction |= n.kind == NodeKind::reduce;
        lse |= n.kind == NodeKind::reduce && n.reduce_op == ReduceOp::logsumexp && n.axis == ReduceAxis::row;
      }
      ++r.expressions;
      r.comparisons += comparison;
      r.indices += index;
      r.row_logsumexp += lse;
      r.reductions += reduction;
    }
    return r;
  }
  Coverage& operator+=(const Coverage& o) {
    expressions += o.expressions;
    comparisons += o.comparisons;
    indices += o.indices;
    row_logsumexp += o.row_logsumexp;
    reductions += o.reductions;
    return *this;
  }
  std::string text() const {
    return fmt::format("{} expressions: {} with a comparison, {} with m or n, {} with row_logsumexp, {} with a "
                       "reduction",
                       expressions, comparisons, indices, row_logsumexp, reductions);
  }
  nlohmann::json json() const {
    return {{"expressions", expressions}, {"comparisons", comparisons}, {"indices", indices},
            {"row_logsumexp", row_logsumexp}, {"reductions", reductions}};
  }
};

// --- CPU ----------------------------------------------------------------------------------

int fuzz_cpu(const FuzzArgs& fa, const std::vector<Case>& cases, nlohmann::json& report) {
  const auto t0 = std::chrono::steady_clock::now();
  size_t graphs = 0, outputs = 0, fusable = 0, errors = 0;
  Coverage covered;
  nlohmann::json mismatches = nlohmann::json::array(), failed = nlohmann::json::array();
  for (const Case& c : cases) {
    const size_t index = c.index;
    try {
      const Graph g = parse_expression(c.kernel.text(), parse_options_for(c.kernel));
      PipelineOptions popts;
      popts.gemm = c.kernel.gemm;
      const Graph after = run_pipeline(g, popts);
      ++graphs;
      covered += Coverage::of(c);
      // Small sizes: the reference before and after the passes agree within an output ulp.
      ReferenceInputs in = c.integers ? random_integer_inputs(g, 5, 8, 8, c.seed)
                                      : random_reference_inputs(g, 5, 8, 8, c.kernel.gemm.a_dtype,
                                                                c.kernel.gemm.b_dtype, c.seed);
      for (const testing::PassCheck& check : testing::check_pipeline(g, after, in)) {
        ++outputs;
        if (check.comparison.pass) continue;
        testing::CaseOrigin origin{index, c.kernel.text(), "", 5, 8, 8, c.seed, c.kernel.cli_options()};
        for (const testing::RandomOutput& o : c.kernel.outputs)
          if (o.name == check.output) origin.expression = o.statement;
        mismatches.push_back(testing::failing_case_record(origin, check));
        fmt::print("MISMATCH (passes) seed {} output {}: {}\n  {}\n", c.seed, check.output,
                   check.comparison.describe(), c.kernel.text());
      }
      if (testing::emit_sources(after, c.kernel.gemm, c.config.empty() ? KernelConfig{} : *KernelConfig::parse(c.config)))
        ++fusable;
    } catch (const Error& e) {
      ++errors;
      failed.push_back({{"kernel", index}, {"kernel_text", c.kernel.text()}, {"seed", c.seed},
                        {"options", c.kernel.cli_options()}, {"error", e.what()}});
      fmt::print("ERROR seed {}: {}\n  {}\n", c.seed, e.what(), c.kernel.text());
    }
  }
  const double secs = seconds_since(t0);
  fmt::print("fuzz --cpu: {} graphs ({} outputs, {} fusable) through parse, passes, reference, legality and "
             "emitters in {:.1f} s: {} mismatches, {} errors\n",
             graphs, outputs, fusable, secs, mismatches.size(), errors);
  fmt::print("fuzz --cpu: checked {}\n", covered.text());
  // Each failing output and each error, with what reproduces it (testing::failing_case_record).
  report["cpu"] = {{"graphs", graphs}, {"outputs", outputs}, {"fusable", fusable},
                   {"mismatches", mismatches.size()}, {"errors", errors}, {"seconds", secs},
                   {"coverage", covered.json()}, {"failing_cases", mismatches}, {"error_cases", failed}};
  (void)fa;
  return !mismatches.empty() || errors ? kExitFailed : kExitOk;
}

// --- GPU ----------------------------------------------------------------------------------

struct GpuCase {
  const Case* c = nullptr;
  std::unique_ptr<Kernel> fused, unfused;
  std::string not_fused;  // why the fused path is not taken
  std::future<bool> compiling;  // false: not compiled (past --compile-for)
  std::string compile_error;
  bool skipped = false;
};

struct RunResult {
  std::vector<std::pair<std::string, std::string>> bad;  // output, what
  size_t boundary = 0;                                  // outputs failed only by boundary flips
  size_t exact = 0;                                     // elements that had to match bit for bit
};

// Runs `kernel` on the problem and compares every output with the reference.
RunResult check_run(const Kernel& kernel, const ReferenceInputs& inputs,
                    const runtime::Expected& expected, ExecutionPath expect) {
  runtime::DeviceProblem problem(kernel, inputs);
  problem.poison_outputs(nullptr);
  const ExecutionPath path = kernel.run(problem.arguments(), nullptr);
  RunResult r;
  if (path != expect)
    r.bad.emplace_back("(path)", fmt::format("ran {}", path == ExecutionPath::fused ? "fused" : "unfused"));
  for (const auto& c : runtime::check_outputs(kernel, problem.read_outputs(nullptr), expected)) {
    r.exact += c.comparison.exact;
    r.boundary += c.comparison.rounding_flips;
    if (!c.comparison.pass) r.bad.emplace_back(c.name, c.comparison.describe());
  }
  return r;
}

// Runs `kernel` (an epilogue of case `c`, compiled) fused on the case's sizes and seed and
// compares it with its own reference: how isolated outputs and shrinking candidates are checked.
RunResult check_alone(const Case& c, const Kernel& kernel) {
  const ReferenceInputs inputs = inputs_for(c, kernel.graph());
  return check_run(kernel, inputs, runtime::expected_outputs(kernel, inputs, c.integers), ExecutionPath::fused);
}

// Shrinks a failing output (src/testing/shrink): each batch of smaller epilogues compiles at
// once (a kernel each) and runs on the case's sizes and seed; the first that still mismatches
// is kept.
testing::ShrinkResult shrink_on_gpu(const Case& c, const std::string& text, int rounds) {
  const ParseOptions parse = parse_options_for(c.kernel);
  auto failing = [&](const std::vector<std::string>& batch) {
    std::vector<std::unique_ptr<Kernel>> kernels;
    std::vector<std::future<void>> compiles;
    for (const std::string& t : batch) {
      kernels.push_back(std::make_unique<Kernel>(parse_expression(t, parse), options_for(c, false)));
      Kernel* k = kernels.back().get();
      compiles.push_back(std::async(std::launch::async, [k, &c] { k->compile(c.m, c.n, c.k); }));
    }
    int first = -1;
    for (size_t i = 0; i < batch.size(); ++i) {
      try {
        compiles[i].get();
        if (first < 0 && !check_alone(c, *kernels[i]).bad.empty()) first = int(i);
      } catch (const std::exception&) {
        // A candidate that cannot be compiled or run is not the failure being shrunk.
      }
    }
    return first;
  };
  return testing::shrink(text, parse, c.kernel.gemm, failing, rounds, jit::compile_slots() < 8 ? 4 : 8);
}

struct Compiled {
  std::vector<GpuCase> gpu;
  size_t compile_failures = 0, skipped = 0;
  double seconds = 0;
};

// Builds every kernel of the run, fused and unfused, and compiles them all at once
// (EVTC_COMPILE_JOBS at a time); needs nvcc, not a GPU.
Compiled compile_all(const FuzzArgs& fa, const std::vector<Case>& cases) {
  set_default_log_level(LogLevel::error);  // hundreds of compiles: the progress line says enough
  const auto t_compile = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (fa.compile_for > 0)
    deadline = t_compile + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(fa.compile_for));
  std::counting_semaphore<> turns(jit::compile_slots());
  std::vector<GpuCase> gpu(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    GpuCase& g = gpu[i];
    g.c = &cases[i];
    const Graph graph = parse_expression(cases[i].kernel.text(), parse_options_for(cases[i].kernel));
    g.fused = std::make_unique<Kernel>(graph, options_for(cases[i], false));
    g.unfused = std::make_unique<Kernel>(graph, options_for(cases[i], true));
    g.not_fused = g.fused->fallback_reason(cases[i].m, cases[i].n, cases[i].k);
    Kernel* f = g.fused.get();
    Kernel* u = g.unfused.get();
    const Case* c = g.c;
    const bool fuse = g.not_fused.empty();
    g.compiling = std::async(std::launch::async, [f, u, c, fuse, deadline, &turns] {
      // One turn per compile slot, so that the deadline is checked when a kernel's compile
      // would start; kernels compiled already need no turn.
      if (fuse && f->is_compiled(c->m, c->n, c->k)) {
        f->compile(c->m, c->n, c->k);
      } else if (fuse) {
        turns.acquire();
        struct Release {
          std::counting_semaphore<>& t;
          ~Release() { t.release(); }
        } release{turns};
        if (deadline && std::chrono::steady_clock::now() > *deadline) return false;
        f->compile(c->m, c->n, c->k);
      }
      u->compile_fallback();
      return true;
    });
  }
  const ProgressFn progress = progress_printer("evtc fuzz");
  Compiled out;
  size_t compiled = 0;
  for (GpuCase& g : gpu) {
    try {
      g.skipped = !g.compiling.get();
      out.skipped += g.skipped;
    } catch (const std::exception& e) {
      g.compile_error = e.what();
      ++out.compile_failures;
    }
    progress("compiling", int(++compiled), int(gpu.size()));
  }
  out.seconds = seconds_since(t_compile);
  out.gpu = std::move(gpu);
  return out;
}

// --compile-only: the run's kernels into the cache, for a later run of the same seed and count
// on a GPU (which then compiles nothing it finds there).
int fuzz_compile_only(const FuzzArgs& fa, const std::vector<Case>& cases, nlohmann::json& report) {
  Compiled c = compile_all(fa, cases);
  size_t fused = 0, fused_expressions = 0;
  for (const GpuCase& g : c.gpu) {
    if (!g.compile_error.empty())
      fmt::print("COMPILE FAILURE ({}): {}\n  kernel: {}\n", kernel_kind_name(g.c->kernel.kind),
                 g.compile_error.substr(0, 600), g.c->kernel.text());
    if (g.not_fused.empty() && !g.skipped && g.compile_error.empty()) {
      ++fused;
      fused_expressions += g.c->kernel.outputs.size();
    }
  }
  fmt::print("fuzz --compile-only: {} kernels, {} fused kernels ({} expressions) compiled into the cache, {} compile "
             "failures, {} skipped; {:.0f} s\n",
             c.gpu.size(), fused, fused_expressions, c.compile_failures, c.skipped, c.seconds);
  report["compile_only"] = {{"kernels", c.gpu.size()},       {"fused_kernels", fused},
                            {"fused_expressions", fused_expressions}, {"compile_failures", c.compile_failures},
                            {"skipped_kernels", c.skipped},  {"compile_s", c.seconds}};
  return c.compile_failures == 0 && c.skipped == 0 ? kExitOk : kExitFailed;
}

int fuzz_gpu(const FuzzArgs& fa, const std::vector<Case>& cases, nlohmann::json& report) {
  if (!have_gpu("fuzz", "--cpu runs the checks that need none; --compile-only compiles the kernels")) return kExitFailed;
  Compiled compiled = compile_all(fa, cases);
  std::vector<GpuCase>& gpu = compiled.gpu;
  const size_t compile_failures = compiled.compile_failures, skipped = compiled.skipped;
  const double compile_s = compiled.seconds;
  const ProgressFn progress = progress_printer("evtc fuzz");
  fmt::print("fuzz: {} kernels compiled or found in the cache in {:.0f} s ({} compile failures, {} skipped); running "
             "them\n",
             gpu.size() - compile_failures - skipped, compile_s, compile_failures, skipped);

  const auto t_run = std::chrono::steady_clock::now();
  size_t expressions = 0, fused_checks = 0, unfused_checks = 0, fused_expressions = 0, boundary = 0, exact = 0;
  nlohmann::json mismatches = nlohmann::json::array(), compile_errors = nlohmann::json::array();
  std::vector<std::pair<const Case*, size_t>> to_isolate;
  Coverage covered_fused, covered_unfused;
  std::vector<size_t> skipped_kernels;  // their numbers in the whole run
  for (size_t i = 0; i < gpu.size(); ++i) {
    const GpuCase& g = gpu[i];
    const Case& c = *g.c;
    if (!g.skipped) expressions += c.kernel.outputs.size();
    auto note = [&](const std::string& path, const std::string& output, const std::string& what) {
      size_t index = 0;
      for (size_t o = 0; o < c.kernel.outputs.size(); ++o)
        if (c.kernel.outputs[o].name == output) index = o;
      fmt::print("MISMATCH kernel {} ({}), {} path, output {}: {}\n  {}\n", c.index, kernel_kind_name(c.kernel.kind),
                 path, output, what, run_line(c, index));
      mismatches.push_back({{"kernel", c.index}, {"path", path}, {"output", output}, {"what", what},
                            {"run", run_line(c, index)}, {"kernel_text", c.kernel.text()}});
      if (path == "fused" && output != "(path)") to_isolate.emplace_back(&c, index);
    };
    if (g.skipped) {
      skipped_kernels.push_back(c.index);
      continue;
    }
    if (!g.compile_error.empty()) {
      const std::string first = g.compile_error.substr(0, 600);
      fmt::print("COMPILE FAILURE kernel {} ({}): {}\n  kernel: {}\n", c.index, kernel_kind_name(c.kernel.kind),
                 first, c.kernel.text());
      compile_errors.push_back({{"kernel", c.index}, {"what", first}, {"kernel_text", c.kernel.text()},
                                {"sizes", {c.m, c.n, c.k}}, {"options", c.kernel.cli_options()}});
      continue;
    }
    const Coverage exercised = Coverage::of(c);  // counted once, for each path that checks it
    const ReferenceInputs inputs = inputs_for(c, g.fused->graph());
    const runtime::Expected expected = runtime::expected_outputs(*g.fused, inputs, c.integers);
    try {
      if (g.not_fused.empty()) {
        const RunResult r = check_run(*g.fused, inputs, expected, ExecutionPath::fused);
        for (const auto& [o, what] : r.bad) note("fused", o, what);
        boundary += r.boundary;
        exact += r.exact;
        ++fused_checks;
        fused_expressions += c.kernel.outputs.size();
        covered_fused += exercised;
      }
      const RunResult r = check_run(*g.unfused, inputs, expected, ExecutionPath::fallback);
      for (const auto& [o, what] : r.bad) note("unfused", o, what);
      boundary += r.boundary;
      exact += r.exact;
      ++unfused_checks;
      covered_unfused += exercised;
    } catch (const Error& e) {
      note("run", "(error)", e.what());
    }
    progress("running", int(i + 1), int(gpu.size()));
  }
  const double run_s = seconds_since(t_run);

  // Each fused mismatch again with its output alone (a new kernel): does it reproduce?
  nlohmann::json isolated = nlohmann::json::array();
  for (size_t j = 0; j < to_isolate.size() && int(j) < fa.isolate; ++j) {
    const auto [c, index] = to_isolate[j];
    const Graph graph = parse_expression(c->kernel.text_of(index), parse_options_for(c->kernel));
    Kernel alone(graph, options_for(*c, false));
    std::string result;
    try {
      alone.compile(c->m, c->n, c->k);
      const RunResult r = check_alone(*c, alone);
      result = r.bad.empty() ? "passes alone" : "fails alone: " + r.bad.front().second;
    } catch (const std::exception& e) {
      result = std::string("error alone: ") + e.what();
    }
    fmt::print("isolated: {}\n  {}\n", result, run_line(*c, index));
    nlohmann::json entry = {{"run", run_line(*c, index)}, {"result", result}};
    if (result.rfind("fails alone", 0) == 0 && fa.shrink_rounds > 0) {
      const testing::ShrinkResult shrunk = shrink_on_gpu(*c, c->kernel.text_of(index), fa.shrink_rounds);
      fmt::print("shrunk ({} batches, {} smaller epilogues tried): {}\n  {}\n", shrunk.rounds, shrunk.tried,
                 shrunk.text == c->kernel.text_of(index) ? "no smaller epilogue fails" : "still fails",
                 run_line(*c, shrunk.text));
      entry["shrunk"] = {{"run", run_line(*c, shrunk.text)}, {"batches", shrunk.rounds}, {"tried", shrunk.tried}};
    }
    isolated.push_back(entry);
  }

  size_t not_fused = 0;
  for (const GpuCase& g : gpu) not_fused += !g.not_fused.empty();
  fmt::print("fuzz: {} kernels ({} expressions; {} not fusable), {} fused kernels ({} expressions) and {} unfused "
             "runs checked against the fp64 reference{}: {} mismatches, {} compile failures, {} outputs off only by "
             "intermediate-rounding flips; compile {:.0f} s, runs {:.0f} s\n",
             gpu.size(), expressions, not_fused, fused_checks, fused_expressions, unfused_checks,
             fa.integers ? fmt::format(" on integer inputs ({} elements bit for bit)", exact) : std::string(),
             mismatches.size(), compile_failures, boundary, compile_s, run_s);
  fmt::print("fuzz: checked fused {}\nfuzz: checked unfused {}\n", covered_fused.text(), covered_unfused.text());
  if (skipped)
    fmt::print("fuzz: {} kernels not compiled within --compile-for {} s were skipped (their expressions are not "
               "counted): {}; the kernels compiled are in the cache for the next run\n",
               skipped, fa.compile_for, fmt::join(skipped_kernels, " "));
  report["gpu"] = {{"kernels", gpu.size() - skipped}, {"skipped_kernels", skipped}, {"expressions", expressions},
                   {"fused_expressions", fused_expressions}, {"boundary_flips", boundary},
                   {"not_fusable", not_fused},      {"fused_checks", fused_checks},
                   {"unfused_checks", unfused_checks}, {"mismatches", mismatches},
                   {"compile_failures", compile_failures}, {"compile_errors", compile_errors}, {"isolated", isolated},
                   {"compile_s", compile_s},        {"run_s", run_s},
                   {"integer_inputs", fa.integers}, {"exact_elements", exact},
                   {"coverage_fused", covered_fused.json()}, {"coverage_unfused", covered_unfused.json()},
                   {"skipped_kernel_numbers", skipped_kernels}};
  return mismatches.empty() && compile_failures == 0 && skipped == 0 ? kExitOk : kExitFailed;
}

}  // namespace

Command add_fuzz_command(CLI::App& app) {
  auto fa = std::make_shared<FuzzArgs>();
  CLI::App* sub = app.add_subcommand(
      "fuzz", "Random differential testing: random epilogues, fused and unfused, against the fp64 reference");
  sub->add_option("--seed", fa->seed, "Seed of the random epilogues (a run is reproducible from it)")
      ->check(seed_value());
  sub->add_option("--count", fa->count, "Random expressions (outputs) to test, packed into kernels")
      ->check(CLI::Range(1, 10000000));
  sub->add_option("--min-outputs", fa->min_outputs, "Fewest [m,n] outputs packed into one kernel")
      ->check(CLI::Range(1, 8));
  sub->add_option("--max-outputs", fa->max_outputs, "Most [m,n] outputs packed into one kernel")->check(CLI::Range(1, 8));
  sub->add_flag("--print", fa->print, "Print each kernel's epilogue and evtc options, then stop");
  sub->add_option("--max-depth", fa->max_depth, "Most nested operations in one output")->check(CLI::Range(1, 12));
  sub->add_option("--reduction-share", fa->reduction_share,
                  "Share of the 16-bit, non-gated kernels that also get one or two random reductions (row, column or "
                  "whole-matrix sum, max, min, amax or logsumexp)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  CLI::Option* cpu = sub->add_flag("--cpu", fa->cpu,
                "No GPU: the pass pipeline against the reference before it, legality and the emitters");
  sub->add_option("--isolate", fa->isolate, "Fused mismatches re-run with their output alone (a compile each)")
      ->check(CLI::Range(0, 1000));
  sub->add_option("--compile-for", fa->compile_for,
                  "Start no new compile after this many seconds: kernels not compiled by then are skipped (and the "
                  "run fails), the compiled ones stay cached for the next run")
      ->check(non_negative_value("a number of seconds"));
  sub->add_flag("--compile-only", fa->compile_only,
                "No GPU needed: compile the run's kernels into the cache, for a later run of the same seed and count "
                "on a GPU")
      ->excludes(cpu);
  sub->add_option("--shrink-rounds", fa->shrink_rounds,
                  "Batches of smaller epilogues tried to shrink each mismatch that fails alone (0: none)")
      ->check(CLI::Range(0, 100));
  sub->add_flag("--integers", fa->integers,
                "Integer-valued inputs and only ops exact on integers: results must match the reference bit for bit");
  sub->add_option("--json", fa->json, "Write the report as JSON to this file");
  sub->add_option("--shard", fa->shard,
                  "K/N: check only kernels K, K+N, K+2N, ... of the run (0 <= K < N). Shards 0/N to N-1/N of one "
                  "seed and count, run on as many GPUs, together check what the whole run checks")
      ->check(shard_value());
  return {sub, [fa] {
            if (fa->min_outputs > fa->max_outputs)
              throw UserError(fmt::format("--min-outputs {} is more than --max-outputs {}", fa->min_outputs,
                                          fa->max_outputs));
            if (!fa->json.empty()) check_output_path(fa->json, "--json");
            testing::GeneratorOptions go;
            go.min_outputs = fa->min_outputs;
            go.max_outputs = fa->max_outputs;
            go.max_depth = fa->max_depth;
            go.reduction_share = fa->reduction_share;
            go.integers = fa->integers;
            const auto [shard, shards] = fa->shard.empty() ? std::pair{0, 1} : *parse_shard(fa->shard);
            testing::EpilogueGenerator gen(fa->seed, go);
            std::mt19937_64 rng(fa->seed ^ 0x9e3779b97f4a7c15ull);
            std::vector<Case> cases;
            int expressions = 0;
            size_t generated = 0;
            while (expressions < fa->count) {
              // Every kernel of the run is generated, in one order, whichever shard keeps it.
              Case c;
              c.index = generated++;
              c.kernel = gen.next();
              c.seed = rng();
              c.integers = fa->integers;
              choose_sizes(c, rng);
              expressions += int(c.kernel.outputs.size());
              if (int(c.index % size_t(shards)) == shard) cases.push_back(std::move(c));
            }
            if (fa->print) {
              for (const Case& c : cases) {
                fmt::print("# {} -m {} -n {} -k {} {} --seed {}{}{}\n", kernel_kind_name(c.kernel.kind), c.m, c.n, c.k,
                           c.kernel.cli_options(), c.seed, c.integers ? " --integer-inputs" : "",
                           c.config.empty() ? "" : " --config " + c.config);
                const Kernel k(parse_expression(c.kernel.text(), parse_options_for(c.kernel)),
                               options_for(c, false));
                if (const std::string why = k.fallback_reason(c.m, c.n, c.k); !why.empty())
                  fmt::print("## not fused: {}\n", why);
                fmt::print("{}", c.kernel.text());
              }
              return kExitOk;
            }
            // A line at a time: a run stopped part-way (a time limit, Ctrl-C) keeps every mismatch
            // it printed, even with its output in a file.
            std::setvbuf(stdout, nullptr, _IOLBF, 0);
            nlohmann::json report = {{"seed", fa->seed}, {"count", fa->count}, {"kernels", cases.size()},
                                     {"integers", fa->integers}};
            if (shards > 1) {
              report["shard"] = fmt::format("{}/{}", shard, shards);
              report["run_kernels"] = generated;
              fmt::print("fuzz: shard {}/{}: {} of the run's {} kernels\n", shard, shards, cases.size(), generated);
            }
            const int rc = fa->cpu            ? fuzz_cpu(*fa, cases, report)
                           : fa->compile_only ? fuzz_compile_only(*fa, cases, report)
                                              : fuzz_gpu(*fa, cases, report);
            if (!fa->json.empty()) write_output_file(fa->json, report.dump(2) + "\n", "--json");
            return rc;
          }};
}

}  // namespace evtc::cli
