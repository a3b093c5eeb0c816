// Errors of the backend-facing commands (compile, run, cache), asserted by their text.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli_runner.hpp"

using evtc::test::run_cli;

TEST(CliBackend, UnknownKernelConfigIsAUsageError) {
  const auto r = run_cli("compile 'out D = acc' --config coop_64x64x64_c1x1_persistent");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--config: 'coop_64x64x64_c1x1_persistent' is not a kernel config name"),
            std::string::npos)
      << r.output;
}

TEST(CliBackend, UnknownDtypeIsAUsageError) {
  const auto r = run_cli("compile 'out D = acc' --dtype f7");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--dtype: unknown dtype 'f7'"), std::string::npos) << r.output;
  // An integer dtype is a dtype, but not one of A, B or the default operands.
  const auto i = run_cli("explain 'out D = acc' --dtype int32");
  EXPECT_EQ(i.exit_code, 2) << i.output;
  EXPECT_NE(i.output.find("--dtype: dtype 'int32' is an integer dtype, allowed only for [m] and [n] input vectors "
                          "(declare them in the expression: `input t[m]: i32`)"),
            std::string::npos)
      << i.output;
}

TEST(CliBackend, MissingCompilerSaysWhatToSet) {
  const auto r = run_cli("compile 'out D = relu(acc)' --emit-only --emit /dev/null --fallback",
                         "CUDACXX=/nonexistent/nvcc EVTC_CACHE_DIR=/tmp/evtc-cli-test-cache");
  EXPECT_EQ(r.exit_code, 0) << "--emit-only needs no compiler: " << r.output;
  const auto c = run_cli("compile 'out D = relu(acc)' --fallback",
                         "CUDACXX=/nonexistent/nvcc EVTC_CACHE_DIR=/tmp/evtc-cli-test-cache");
  EXPECT_EQ(c.exit_code, 1) << c.output;
  EXPECT_NE(c.output.find("CUDACXX=/nonexistent/nvcc is not an executable nvcc"), std::string::npos)
      << c.output;
}

// `evtc fuzz --compile-only` needs no GPU: it builds the run's kernels and compiles them (here
// with a compiler that does not exist, so every compile fails, quickly), reports the failures
// with the kernel's text and exits 1; it cannot be combined with --cpu.
TEST(CliBackend, FuzzCompileOnlyNeedsNoGpuAndReportsFailures) {
  const auto r = run_cli("fuzz --compile-only --count 3 --max-outputs 1 --seed 5",
                         "CUDACXX=/nonexistent/nvcc EVTC_CACHE_DIR=/tmp/evtc-cli-test-cache");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("fuzz --compile-only: 1 kernels, 0 fused kernels (0 expressions) compiled into the cache, 1 compile failures"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("COMPILE FAILURE"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("CUDACXX=/nonexistent/nvcc is not an executable nvcc"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("no GPU"), std::string::npos) << r.output;
  const auto both = run_cli("fuzz --compile-only --cpu");
  EXPECT_EQ(both.exit_code, 2) << both.output;
  EXPECT_NE(both.output.find("--cpu excludes --compile-only"), std::string::npos) << both.output;
}

// --shard K/N keeps kernels K, K+N, ... of the whole run, with the same epilogues, sizes and seeds:
// the shards of one seed and count together are the run, each kernel once.
TEST(CliBackend, FuzzShardsSplitTheRunsKernels) {
  auto headers = [](const std::string& out) {
    std::vector<std::string> lines;
    size_t at = 0;
    while ((at = out.find("\n# ", at)) != std::string::npos) {
      const size_t end = out.find('\n', at + 1);
      lines.push_back(out.substr(at + 1, end - at - 1));
      at = end;
    }
    return lines;
  };
  const auto whole = run_cli("fuzz --print --count 60 --seed 7");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::vector<std::string> all = headers("\n" + whole.output);
  ASSERT_GE(all.size(), 9u) << whole.output;
  std::vector<std::string> joined(all.size());
  for (int k = 0; k < 3; ++k) {
    const auto part = run_cli(fmt::format("fuzz --print --count 60 --seed 7 --shard {}/3", k));
    ASSERT_EQ(part.exit_code, 0) << part.output;
    const std::vector<std::string> mine = headers("\n" + part.output);
    ASSERT_EQ(mine.size(), (all.size() - k + 2) / 3) << part.output;
    for (size_t i = 0; i < mine.size(); ++i) joined[k + 3 * i] = mine[i];
  }
  EXPECT_EQ(joined, all);
  const auto cpu = run_cli("fuzz --cpu --count 60 --seed 7 --shard 2/3");
  EXPECT_EQ(cpu.exit_code, 0) << cpu.output;
  EXPECT_NE(cpu.output.find(fmt::format("fuzz: shard 2/3: {} of the run's {} kernels", (all.size() + 0) / 3,
                                        all.size())),
            std::string::npos)
      << cpu.output;
  for (const char* bad : {"3/3", "1/0", "-1/2", "2", "1/2x", "+1/2"}) {
    const auto r = run_cli(fmt::format("fuzz --cpu --count 10 --shard {}", bad));
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.output;
    EXPECT_NE(r.output.find(fmt::format("'{}' is not a shard K/N with 0 <= K < N (e.g. 0/4, the first of four)", bad)),
              std::string::npos)
        << r.output;
  }
}

// Every kernel a fuzz run builds has a configuration its GEMM accepts: a run of two thousand
// expressions (fp8 and decode-sized transposed cases among them) prints whole, with no refusal.
TEST(CliBackend, FuzzRunsBuildOnlyAcceptedConfigurations) {
  const auto r = run_cli("fuzz --print --count 2100 --min-outputs 6 --max-outputs 8 --seed 20261128");
  ASSERT_EQ(r.exit_code, 0) << r.output.substr(0, 2000);
  size_t kernels = 0, fp8_swapped = 0, in_parts = 0, clustered = 0;
  for (size_t at = 0; (at = r.output.find("\n# ", at)) != std::string::npos; ++at) {
    ++kernels;
    const std::string header = r.output.substr(at + 1, r.output.find('\n', at + 1) - at - 1);
    fp8_swapped += header.rfind("# fp8", 0) == 0 && header.find("_swap") != std::string::npos;
    in_parts += header.find("_kparts") != std::string::npos;
    clustered += header.find("_c4x1_persistent_swap") != std::string::npos;
  }
  EXPECT_GE(kernels, 300u);
  EXPECT_GE(fp8_swapped, 1u) << "the run should hold decode-sized fp8 cases";
  EXPECT_GE(in_parts, 1u) << "the run should hold decode-sized cases with K in parts";
  EXPECT_GE(clustered, 1u) << "the run should hold transposed cases in 4x1 clusters";
  EXPECT_EQ(r.output.find("has K tiles of"), std::string::npos) << r.output.substr(0, 2000);
}

// A run reports what its checked expressions exercise, counted from each one's graph.
TEST(CliBackend, FuzzReportsWhatTheExpressionsExercise) {
  const std::string json = "/tmp/evtc-cli-test-fuzz-coverage.json";
  std::filesystem::remove(json);
  const auto r = run_cli("fuzz --cpu --count 400 --seed 20261128 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(json);
  const nlohmann::json report = nlohmann::json::parse(in);
  const nlohmann::json& c = report.at("cpu").at("coverage");
  EXPECT_EQ(c.at("expressions"), report.at("cpu").at("outputs"));
  for (const char* key : {"comparisons", "indices", "reductions"}) {
    EXPECT_GT(c.at(key).get<size_t>(), 0u) << key << ": " << c.dump();
    EXPECT_LE(c.at(key).get<size_t>(), c.at("expressions").get<size_t>()) << key;
  }
  EXPECT_LE(c.at("row_logsumexp").get<size_t>(), c.at("reductions").get<size_t>());
  // --reduction-share 1: every 16-bit, non-gated kernel also gets one or two reductions.
  const auto more = run_cli("fuzz --cpu --count 400 --seed 20261128 --reduction-share 1 --json " + json);
  ASSERT_EQ(more.exit_code, 0) << more.output;
  std::ifstream again(json);
  const nlohmann::json m = nlohmann::json::parse(again).at("cpu").at("coverage");
  EXPECT_GT(m.at("reductions").get<size_t>(), 3 * c.at("reductions").get<size_t>()) << m.dump() << " vs " << c.dump();
  const auto bad = run_cli("fuzz --cpu --reduction-share 1.5");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--reduction-share"), std::string::npos) << bad.output;
  EXPECT_NE(r.output.find(fmt::format("fuzz --cpu: checked {} expressions: {} with a comparison, {} with m or n, {} with "
                                      "row_logsumexp, {} with a reduction",
                                      c.at("expressions").get<size_t>(), c.at("comparisons").get<size_t>(),
                                      c.at("indices").get<size_t>(), c.at("row_logsumexp").get<size_t>(),
                                      c.at("reductions").get<size_t>())),
            std::string::npos)
      << r.output;
}

TEST(CliBackend, MissingCutlassSaysWhatToSet) {
  const auto r = run_cli("compile 'out D = relu(acc)'",
                         "EVTC_CUTLASS_DIR=/nonexistent/cutlass EVTC_CACHE_DIR=/tmp/evtc-cli-test-cache");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("EVTC_CUTLASS_DIR=/nonexistent/cutlass holds no CUTLASS headers"),
            std::string::npos)
      << r.output;
}

TEST(CliBackend, CacheInfoNamesTheFolder) {
  const auto r = run_cli("cache info", "EVTC_CACHE_DIR=/tmp/evtc-cli-test-cache-info");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cache: /tmp/evtc-cli-test-cache-info"), std::string::npos) << r.output;
}

// Every cache action on a cache path that is a file fails (exit 1), naming it; they exited 0
// with "entries: 0" before.
TEST(CliBackend, CacheActionsOnAFileFail) {
  const std::string file = "/tmp/evtc-cli-test-cache-file";
  std::ofstream(file) << "x";
  for (const char* action : {"ls", "ls --json", "info", "clear", "prune --max-size 0"}) {
    const auto r = run_cli(std::string("cache ") + action, "EVTC_CACHE_DIR=" + file);
    EXPECT_EQ(r.exit_code, 1) << action << ": " << r.output;
    EXPECT_NE(r.output.find("cannot read the kernel cache folder " + file + ": " + file + " is not a folder"),
              std::string::npos)
        << action << ": " << r.output;
  }
  std::filesystem::remove(file);
}

TEST(CliBackend, FastAccumulationNeedsFp8) {
  const auto r = run_cli("compile 'out D = acc' --fast-accum --emit-only --emit /dev/null");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--fast-accum: only fp8 A/B have a fast-accumulation main loop, but A "
                          "and B are bf16"),
            std::string::npos)
      << r.output;
}

// --fp8-blockwise: fp8 A and B only, and no integer inputs (the scales make products non-integers):
// usage errors found before anything compiles or needs a GPU.
TEST(CliBackend, BlockScalesNeedFp8AndNoIntegerInputs) {
  const auto r = run_cli("compile 'out D = acc' --fp8-blockwise --emit-only --emit /dev/null");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--fp8-blockwise: fp8 block scales (fp8_blockwise): A is bf16 and B is bf16: block "
                          "scales apply to fp8 operands (f8e4m3, f8e5m2) only"),
            std::string::npos)
      << r.output;
  const auto i = run_cli("run 'out D = acc' -m 256 -n 256 -k 256 --dtype f8e4m3 --layout-b c --fp8-blockwise "
                         "--integer-inputs");
  EXPECT_EQ(i.exit_code, 2) << i.output;
  EXPECT_NE(i.output.find("--integer-inputs: not with --fp8-blockwise (block scales make the products non-integers)"),
            std::string::npos)
      << i.output;
  const auto g = run_cli("grouped 'out D = acc' --fp8-blockwise --compile-only");
  EXPECT_EQ(g.exit_code, 2) << g.output;
  EXPECT_NE(g.output.find("--fp8-blockwise: fp8 block scales (fp8_blockwise): A is bf16 and B is bf16"),
            std::string::npos)
      << g.output;
}

TEST(CliBackend, UnknownDtypeOfBIsAUsageError) {
  const auto r = run_cli("compile 'out D = acc' --dtype f8e4m3 --dtype-b e6m1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--dtype-b: unknown dtype 'e6m1'"), std::string::npos) << r.output;
}

TEST(CliBackend, Fp8NeedsKMajorOperands) {
  const auto r = run_cli("compile 'out D: bf16 = acc' --dtype f8e4m3 --layout-b r --emit-only "
                         "--emit /dev/null");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fp8 A and B must both be K-major with 16-byte rows"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("B is row-major K×N: pass B column-major"), std::string::npos) << r.output;
}

// cache ls (and --json) shows each kernel's key, label, expression, size and age; prune removes
// down to a size; sizes are checked.
TEST(CliBackend, CacheListsAndPrunes) {
  const std::string dir = "/tmp/evtc-cli-test-cache-ls";
  std::filesystem::remove_all(dir);
  for (const char* key : {"00000000000000a1", "00000000000000b2"}) {
    const std::filesystem::path e = std::filesystem::path(dir) / "kernels" / key;
    std::filesystem::create_directories(e);
    std::ofstream(e / "kernel.so") << std::string(1000, 'x');
    std::ofstream(e / "entry.json") << R"({"bytes": 1000, "xxh3": "0", "label": "coop_128x256x64_c2x1_persistent", "expression": "out D: bf16 = silu((acc + bias[n]))\n"})";
  }
  const auto ls = run_cli("cache ls", "EVTC_CACHE_DIR=" + dir);
  EXPECT_EQ(ls.exit_code, 0) << ls.output;
  EXPECT_NE(ls.output.find("00000000000000a1  coop_128x256x64_c2x1_persistent"), std::string::npos) << ls.output;
  EXPECT_NE(ls.output.find("out D: bf16 = silu((acc + bias[n]))"), std::string::npos) << ls.output;
  const auto js = run_cli("cache ls --json", "EVTC_CACHE_DIR=" + dir);
  EXPECT_EQ(js.exit_code, 0) << js.output;
  size_t lines = 0;
  for (size_t p = js.output.find('{'); p != std::string::npos; p = js.output.find("\n{", p + 1)) {
    const auto j = nlohmann::json::parse(js.output.substr(p, js.output.find('\n', p + 1) - p));
    EXPECT_EQ(j.at("label"), "coop_128x256x64_c2x1_persistent");
    EXPECT_EQ(j.at("expression"), "out D: bf16 = silu((acc + bias[n]))\n");
    EXPECT_GE(j.at("bytes").get<size_t>(), 1000u);
    ++lines;
  }
  EXPECT_EQ(lines, 2u) << js.output;
  const auto bad = run_cli("cache prune --max-size ten", "EVTC_CACHE_DIR=" + dir);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--max-size: 'ten' is not a size"), std::string::npos) << bad.output;
  const auto pr = run_cli("cache prune --max-size 0", "EVTC_CACHE_DIR=" + dir);
  EXPECT_EQ(pr.exit_code, 0) << pr.output;
  EXPECT_NE(pr.output.find("removed 2 cached kernels"), std::string::npos) << pr.output;
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir) / "kernels" / "00000000000000a1"));
  const auto none = run_cli("cache", "EVTC_CACHE_DIR=" + dir);
  EXPECT_EQ(none.exit_code, 2) << "an action is required: " << none.output;
  std::filesystem::remove_all(dir);
}

// --emit-only does nothing without --emit (it used to compile for ~20 s instead), and a file
// name that does not exist is named as such (it used to be parsed as an expression).
TEST(CliBackend, EmitOnlyNeedsEmitAndMissingFilesAreNamed) {
  const auto r = run_cli("compile 'out D = acc' --emit-only");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--emit-only requires --emit"), std::string::npos) << r.output;
  for (const char* cmd : {"compile examples/w1_bias_silu.ev --emit-only --emit /dev/null", "explain missing.evt",
                          "ref nowhere/k.evt -m 8 -n 8 -k 8"}) {
    const auto m = run_cli(cmd);
    EXPECT_EQ(m.exit_code, 2) << cmd << ": " << m.output;
    EXPECT_NE(m.output.find("no such file: '"), std::string::npos) << cmd << ": " << m.output;
  }
  // An expression without a statement keeps the parser's hint.
  const auto e = run_cli("explain 'silu(acc)'");
  EXPECT_NE(e.output.find("write `out D = ...`"), std::string::npos) << e.output;
}

// --dtype, --layout-*, --cast-mode, --weights, --log and --gpu are checked by CLI11 validators: --help
// lists the choices, and every command words a bad value the same way.
TEST(CliBackend, ChoicesAreListedInHelpAndCheckedAlike) {
  const auto help = run_cli("run --help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("--dtype TEXT:{f32,f16,bf16,f8e4m3,f8e5m2}=bf16"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("--layout-b TEXT:{r,c}=r"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("--cast-mode TEXT:{eager,fast,compile}"), std::string::npos) << help.output;
  for (const char* cmd : {"run 'out D = acc' -m 8 -n 8 -k 8 --cast-mode slow",
                          "compile 'out D = acc' --cast-mode slow --emit-only --emit /dev/null"}) {
    const auto r = run_cli(cmd);
    EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.output;
    EXPECT_NE(r.output.find("--cast-mode: slow not in {eager,fast,compile}"), std::string::npos) << cmd << ": " << r.output;
  }
  const std::string bad_dtype = "--dtype: unknown dtype 'f7' (expected f32, f16, bf16, f8e4m3, f8e5m2)";
  for (const char* cmd : {"run 'out D = acc' -m 8 -n 8 -k 8 --dtype f7", "ref 'out D = acc' -m 8 -n 8 -k 8 --dtype f7",
                          "explain 'out D = acc' --dtype f7", "tune 'out D = acc' -s 8x8x8 --dtype f7"}) {
    const auto r = run_cli(cmd);
    EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.output;
    EXPECT_NE(r.output.find(bad_dtype), std::string::npos) << cmd << ": " << r.output;
  }
  const auto layout = run_cli("compile 'out D = acc' --layout-a x --emit-only --emit /dev/null");
  EXPECT_EQ(layout.exit_code, 2) << layout.output;
  EXPECT_NE(layout.output.find("--layout-a: unknown layout 'x' (expected r or c)"), std::string::npos) << layout.output;
  // Aliases are accepted (and PyTorch's spellings of dtypes).
  const auto alias = run_cli("compile 'out D = acc' --dtype bfloat16 --layout-b col --emit-only --emit /dev/null");
  EXPECT_EQ(alias.exit_code, 0) << alias.output;
  const auto log = run_cli("--log loud explain 'out D = acc'");
  EXPECT_EQ(log.exit_code, 2) << log.output;
  EXPECT_NE(log.output.find("--log: loud not in {error,warning,info,debug}"), std::string::npos) << log.output;
  const auto weights = run_cli("grouped 'out D: bf16 = acc' --weights km --compile-only");
  EXPECT_EQ(weights.exit_code, 2) << weights.output;
  EXPECT_NE(weights.output.find("--weights: km not in {nk,kn}"), std::string::npos) << weights.output;
  // The GPU classes of the shipped selection tables.
  const auto aot_help = run_cli("aot build --help");
  EXPECT_NE(aot_help.output.find("--gpu TEXT:{h100,h200}"), std::string::npos) << aot_help.output;
  const auto gpu = run_cli("aot build -o /tmp/evtc-cli-test-no-library --expr 'out D = acc' --gpu h300");
  EXPECT_EQ(gpu.exit_code, 2) << gpu.output;
  EXPECT_NE(gpu.output.find("--gpu: h300 not in {h100,h200}"), std::string::npos) << gpu.output;
}

// A parse error in a file names the file (line and column), in every command that reads one.
TEST(CliBackend, ErrorsInAFileNameTheFile) {
  const std::string path = "/tmp/evtc-cli-test-bad.evt";
  {
    std::ofstream f(path);
    f << "# a comment line\nout D: bf16 = silu(acc +)\n";
  }
  for (const std::string cmd : {"explain " + path, "compile " + path + " --emit-only --emit /dev/null",
                                "ref " + path + " -m 8 -n 8 -k 8", "tune " + path + " -s 64x64x64",
                                "run " + path + " -m 8 -n 8 -k 8 --check"}) {
    const auto r = run_cli(cmd);
    EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.output;
    EXPECT_NE(r.output.find(path + ":2:25: error:"), std::string::npos) << cmd << ": " << r.output;
  }
  std::filesystem::remove(path);
}

// `grouped` says there is no GPU before compiling its kernel (it compiled for ~40 s first).
TEST(CliBackend, GroupedChecksForAGpuBeforeCompiling) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) GTEST_SKIP() << "a GPU is present";
  const auto start = std::chrono::steady_clock::now();
  const auto r = run_cli("grouped 'out D: bf16 = silu(acc)' -g 4 -m 64 -n 128 -k 128",
                         "EVTC_CACHE_DIR=/tmp/evtc-cli-test-grouped-cache");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("evtc grouped: no CUDA device is available"), std::string::npos) << r.output;
  EXPECT_LT(seconds, 20.0) << "it compiled first: " << r.output;
  EXPECT_FALSE(std::filesystem::exists("/tmp/evtc-cli-test-grouped-cache/kernels")) << r.output;
}

// Off a terminal (as here), a compile still says when it starts and ends at the default level;
// --log warning (or EVTC_LOG=warning) silences it; --log debug adds nvcc's command line.
TEST(CliBackend, CompilesAreAnnouncedOffATerminal) {
  std::string nine;
  for (int i = 0; i < 9; ++i) nine += fmt::format("out o{}: bf16 = acc * {}; ", i, i + 2);
  const std::string dir = "/tmp/evtc-cli-test-announce";
  for (const char* level : {"info", "warning", "debug"}) {
    std::filesystem::remove_all(dir);
    const auto r = run_cli(fmt::format("--log {} compile '{}' --fallback", level, nine), "EVTC_CACHE_DIR=" + dir);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const bool info = std::string(level) != "warning";
    EXPECT_EQ(r.output.find("evtc: compiling plain epilogue ["), info ? 0u : std::string::npos) << level << r.output;
    EXPECT_EQ(r.output.find("evtc: compiled plain epilogue in ") != std::string::npos, info) << level << r.output;
    EXPECT_EQ(r.output.find("-gencode=arch=compute_90,code=[sm_90,compute_90]") != std::string::npos,
              std::string(level) == "debug")
        << level << r.output;
  }
  std::filesystem::remove_all(dir);
}

// The toolchain is checked: CUTLASS headers of another release and an nvcc too old for sm_90a
// are refused with what to do; nvcc is started without a shell, so its path may hold a quote.
TEST(CliBackend, ToolchainVersionsAreCheckedAndPathsNeedNoQuoting) {
  namespace fs = std::filesystem;
  const fs::path root = "/tmp/evtc-cli-test-toolchain it's";
  fs::remove_all(root);
  fs::create_directories(root / "cutlass" / "include" / "cutlass");
  {
    std::ofstream(root / "cutlass" / "include" / "cutlass" / "cutlass.h") << "#pragma once\n";
    std::ofstream(root / "cutlass" / "include" / "cutlass" / "version.h")
        << "#define CUTLASS_MAJOR 3\n#define CUTLASS_MINOR 5\n#define CUTLASS_PATCH 1\n";
  }
  const std::string quoted_root = "\"" + root.string() + "\"";
  const auto old = run_cli("compile 'out D = relu(acc)'", "EVTC_CUTLASS_DIR=" + quoted_root + "/cutlass EVTC_CACHE_DIR=/tmp/evtc-cli-test-tc");
  EXPECT_EQ(old.exit_code, 1) << old.output;
  EXPECT_NE(old.output.find("are version 3.5.1, but evtc's kernels are written for CUTLASS 4.2.x"), std::string::npos)
      << old.output;
  // An nvcc that says it is CUDA 11.8.
  fs::create_directories(root / "bin");
  {
    std::ofstream f(root / "bin" / "nvcc");
    f << "#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n";
  }
  fs::permissions(root / "bin" / "nvcc", fs::perms::owner_all);
  const auto old_nvcc = run_cli("compile 'out D = relu(acc)' --fallback", "CUDACXX=" + quoted_root + "/bin/nvcc EVTC_CACHE_DIR=/tmp/evtc-cli-test-tc");
  EXPECT_EQ(old_nvcc.exit_code, 1) << old_nvcc.output;
  EXPECT_NE(old_nvcc.output.find("is CUDA 11.8; evtc's kernels need nvcc 12.0 or newer"), std::string::npos)
      << old_nvcc.output;
  // The real nvcc, reached through a folder whose name has a quote and a space.
  const auto real = run_cli("cache info", "EVTC_CACHE_DIR=/tmp/evtc-cli-test-tc");
  const size_t at = real.output.find("nvcc: ");
  ASSERT_NE(at, std::string::npos) << real.output;
  const fs::path nvcc = real.output.substr(at + 6, real.output.find(' ', at + 6) - at - 6);
  fs::create_directory_symlink(nvcc.parent_path().parent_path(), root / "cuda");  // the whole toolkit
  std::string nine;
  for (int i = 0; i < 9; ++i) nine += fmt::format("out o{}: bf16 = acc * {}; ", i, i + 3);
  fs::remove_all("/tmp/evtc-cli-test-tc");
  const auto ok = run_cli("compile '" + nine + "' --fallback", "CUDACXX=" + quoted_root + "/cuda/bin/nvcc EVTC_CACHE_DIR=/tmp/evtc-cli-test-tc");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("fallback epilogue: /tmp/evtc-cli-test-tc/kernels/"), std::string::npos) << ok.output;
  fs::remove_all(root);
  fs::remove_all("/tmp/evtc-cli-test-tc");
}
