// Defects found by probing evtc as a hostile user would, each reproduced here: deep chains
// (a stack overflow in the emitter, CUTLASS template errors past the nesting limit), compiles
// of epilogues that cannot be fused, unchecked writes, and failures that escaped as aborts.
// None needs a GPU or runs nvcc on a CUTLASS kernel.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli_runner.hpp"
#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/grouped.hpp"
#include "evtc/kernel_config.hpp"
#include "evtc/kernel_library.hpp"
#include "evtc/passes.hpp"
#include "evtc/runtime.hpp"
#include "runtime/shared_memory_model.hpp"

namespace fs = std::filesystem;
using namespace evtc;
using evtc::test::run_cli;

namespace {

// x{i+1} = silu(x{i}) + 1, `steps` times: 2 operations a step.
std::string chain(int steps) {
  std::string text = "x0 = acc\n";
  for (int i = 0; i < steps; ++i) text += fmt::format("x{} = silu(x{}) + 1\n", i + 1, i);
  return text + fmt::format("out D: bf16 = x{}\n", steps);
}

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / fmt::format("evtc-robustness-{}-{}", getpid(), name);
}

fs::path write_temp(const std::string& name, const std::string& text) {
  const fs::path p = temp_path(name);
  std::ofstream(p) << text;
  return p;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Robustness, NestingDepthIsMeasuredWithoutRecursion) {
  EXPECT_EQ(epilogue_depth(parse_expression(chain(24))), 48u);
  EXPECT_EQ(epilogue_depth(parse_expression(chain(20000))), 40000u);  // overflowed the stack before
  EXPECT_EQ(epilogue_depth(parse_expression("out D = acc")), 0u);
}

// 24 steps compile with nvcc, 27 do not (CUTLASS template errors): legality says so first.
TEST(Robustness, LegalityRefusesChainsTooDeepToCompile) {
  GemmDesc gemm;
  EXPECT_TRUE(check_legality(run_pipeline(parse_expression(chain(24))), gemm).fusable());
  const Legality deep = check_legality(run_pipeline(parse_expression(chain(25))), gemm);
  ASSERT_FALSE(deep.fusable());
  EXPECT_TRUE(has(deep.reasons[0], "chains 50 operations")) << deep.reasons[0];
  EXPECT_THROW(GroupedKernel(parse_expression(chain(25))), UserError);
}

TEST(Robustness, KernelCompileRefusesWhatCannotBeFused) {
  std::string many;
  for (int i = 0; i < 12; ++i) many += fmt::format("out o{}: bf16 = acc * {}\n", i, i + 1);
  for (const std::string& text : {many, chain(20000)}) {
    Kernel k(parse_expression(text));
    const size_t runs = compiler_runs();
    try {
      k.compile();
      ADD_FAILURE() << "compiled";
    } catch (const UserError& e) {
      EXPECT_TRUE(has(e.what(), "no fused kernel to compile")) << e.what();
    }
    EXPECT_EQ(compiler_runs(), runs);
  }
}

TEST(Robustness, CliCompileOfADeepChainIsRefusedNotACrash) {
  const fs::path file = write_temp("deep.evt", chain(20000));
  const fs::path out = temp_path("deep.cu");
  const auto r = run_cli(fmt::format("compile {} --emit {}", file.string(), out.string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;  // was a segmentation fault
  EXPECT_TRUE(has(r.output, "no fused kernel to emit")) << r.output;
  EXPECT_FALSE(fs::exists(out));
  fs::remove(file);
}

TEST(Robustness, CliCompileRefusesUnfusableEpiloguesBeforeNvcc) {
  std::string many;
  for (int i = 0; i < 12; ++i) many += fmt::format("out o{}: bf16 = acc * {}; ", i, i + 1);
  const auto r = run_cli("compile '" + many + "'", "EVTC_CACHE_DIR=" + temp_path("cache").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;  // ran nvcc for 40 s and printed template errors before
  EXPECT_TRUE(has(r.output, "at most 8 can be fused")) << r.output;
  EXPECT_FALSE(fs::exists(temp_path("cache") / "tmp"));
}

// A file that cannot be written is a failure (exit 1) naming the option and the path.
TEST(Robustness, CliChecksEveryFileItWrites) {
  auto r = run_cli("compile 'out D = acc' --emit /nonexistent-folder/x.cu --emit-only");
  EXPECT_EQ(r.exit_code, 1) << r.output;  // printed "wrote" and exited 0 before
  EXPECT_TRUE(has(r.output, "--emit: cannot write '/nonexistent-folder/x.cu'")) << r.output;
  const fs::path dir = temp_path("folder");
  fs::create_directories(dir);
  // A folder given as a file to write is bad usage (exit 2; it was 1).
  r = run_cli(fmt::format("compile 'out D = acc' --emit {} --emit-only", dir.string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "it is a folder")) << r.output;
  r = run_cli(fmt::format("grouped 'out D = acc' --compile-only --emit {}", dir.string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run_cli(fmt::format("fuzz --cpu --count 1 --json {}", dir.string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, fmt::format("--json: cannot write '{}': it is a folder", dir.string()))) << r.output;
  // --json is checked before the work it reports on (a GPU run, a tuning session).
  r = run_cli("run 'out D = acc' -m 8 -n 8 -k 8 --json /nonexistent-folder/r.json");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(has(r.output, "--json: cannot write")) << r.output;
  r = run_cli("tune 'out D = acc' -s 8x8x8 --json /nonexistent-folder/t.json");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  fs::remove_all(dir);
}

// An expression argument naming something that is not a regular file says what it is (it said
// "no such file"), and a FIFO is not opened (reading one would wait for a writer).
TEST(Robustness, CliExpressionFilesThatAreNotFilesSayWhatTheyAre) {
  const fs::path folder = temp_path("expr-folder");
  fs::create_directories(folder);
  const fs::path fifo = temp_path("expr-fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::pair<std::string, std::string> cases[] = {
      {folder.string(), fmt::format("'{}' is a folder, not an expression file", folder.string())},
      {fifo.string(), fmt::format("'{}' is a FIFO, not an expression file", fifo.string())},
      {"/dev/null", "'/dev/null' is a device, not an expression file"},
  };
  for (const auto& [arg, want] : cases) {
    const auto r = run_cli("explain " + arg);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(has(r.output, want)) << r.output;
  }
  fs::remove(fifo);
  fs::remove_all(folder);
}

// An unknown command is named, with the commands there are (CLI11 said "A subcommand is
// required"), at the top and under a command that has its own.
TEST(Robustness, CliUnknownCommandsAreNamed) {
  auto r = run_cli("frobnicate");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "unknown command 'frobnicate' (the commands: explain, ref, run, compile, cache, tune, "
                            "grouped, aot, fuzz)"))
      << r.output;
  r = run_cli("--log debug cache frob");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "unknown command 'cache frob' (the commands of cache: ls, info, clear, prune)")) << r.output;
  r = run_cli("cache");  // none given: CLI11's own message
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "A subcommand is required")) << r.output;
}

// Numbers that may not be negative say so in a few words (a 309-digit bound before); NaN and
// infinity are refused; --min-outputs may not exceed --max-outputs.
TEST(Robustness, CliNonNegativeNumbersAreChecked) {
  const std::pair<std::string, std::string> cases[] = {
      {"tune 'out D = acc' -s 8x8x8 --max-candidates -1", "--max-candidates: '-1' is not a count (an integer from 0 to"},
      {"cache prune --unused-days -1", "--unused-days: '-1' is not a number of days (a number, 0 or more)"},
      {"cache prune --unused-days nan", "--unused-days: 'nan' is not a number of days (a number, 0 or more)"},
      {"cache prune --unused-days inf", "--unused-days: 'inf' is not a number of days (a number, 0 or more)"},
      {"fuzz --compile-only --compile-for -1", "--compile-for: '-1' is not a number of seconds (a number, 0 or more)"},
      {"fuzz --cpu --min-outputs 8 --max-outputs 2", "--min-outputs 8 is more than --max-outputs 2"},
  };
  for (const auto& [args, want] : cases) {
    const auto r = run_cli(args, "EVTC_CACHE_DIR=" + temp_path("unused-cache").string());
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_TRUE(has(r.output, want)) << args << ": " << r.output;
    EXPECT_LT(r.output.size(), 400u) << args << ": " << r.output;
  }
}

TEST(Robustness, CliTurnsEnvironmentFailuresIntoErrors) {
  const fs::path file = write_temp("not-a-folder", "x");
  const auto r = run_cli("compile 'out D = relu(acc)'", "EVTC_CACHE_DIR=" + file.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;  // std::filesystem_error aborted the CLI (134) before
  EXPECT_TRUE(has(r.output, "cannot use the kernel cache folder")) << r.output;
  fs::remove(file);
}

TEST(Robustness, CliRefusesGroupedProblemsTooLargeToAllocate) {
  const std::pair<const char*, const char*> cases[] = {
      {"-g 2 -m 64 -n 64 -k 1099511627776", "sizes this large cannot run"},
      {"-g 1099511627776 -m 64 -n 64 -k 64", "-g: 1099511627776 groups; expected 1 to 65536"},
      {"-g 4 -m 1099511627776 -n 64 -k 64", "the int32 group offsets hold at most 2147483647"},
      {"-g 4 -m 100000 -n 100000 -k 100000", "of host memory for its inputs and reference"}};
  for (const auto& [sizes, message] : cases) {
    const auto r = run_cli(std::string("grouped 'out D = acc' ") + sizes);
    EXPECT_EQ(r.exit_code, 2) << sizes << ": " << r.output;  // std::bad_alloc aborted (134) before
    EXPECT_FALSE(has(r.output, "terminate called")) << r.output;
    EXPECT_TRUE(has(r.output, message)) << sizes << ": " << r.output;
  }
}

// Eight outputs with f32 ones and [m,n] operands left CUTLASS's main loop no shared memory
// (its "Stages set to value 2 or more" assertion, found by evtc fuzz): the configuration moves
// to 64-row tiles, or, with a column reduction (cooperative only), the epilogue is refused.
TEST(Robustness, WideEpiloguesGetConfigurationsThatCompileOrAreRefused) {
  std::string wide;
  for (int i = 0; i < 8; ++i) wide += fmt::format("out o{}: {} = acc * x{}[m,n]\n", i, i % 2 ? "f32" : "bf16", i % 2);
  GemmDesc gemm;
  gemm.m = 4096;
  gemm.n = 4096;
  gemm.k = 4096;
  const Graph g = run_pipeline(parse_expression(wide));
  const KernelConfig c = default_config(g, gemm);
  EXPECT_EQ(c.tile_m, 64) << c.name();
  EXPECT_EQ(shared_memory_refusal(g, gemm, c), "") << c.name();
  EXPECT_NE(shared_memory_refusal(g, gemm, KernelConfig::of(MainloopSchedule::cooperative, 128, 128)), "");
  const Kernel reduced(parse_expression(wide + "out q = col_sum(acc)\n"));
  EXPECT_TRUE(has(reduced.fallback_reason(4096, 4096, 4096), "main-loop stages"))
      << reduced.fallback_reason(4096, 4096, 4096);
  // An ordinary epilogue keeps its configuration.
  EXPECT_EQ(default_config(run_pipeline(parse_expression("out D: bf16 = silu(acc + bias[n])")), gemm).tile_m, 128);
}

// An fp8 epilogue of eight outputs whose f32 [m,n] operand x0 is read at two places (two aux
// loads, 32 KiB of shared memory each at 64-row tiles) failed CUTLASS's stage assertion at
// pingpong_64x128x128 (found by evtc fuzz, seed 31): the model counted x0 once. It is refused.
TEST(Robustness, AnOperandLoadedAtTwoPlacesCountsTwiceInSharedMemory) {
  const std::string text =
      "out o0: bf16 = (abs(log((abs(r1[n]) + 0.25)))) + acc\n"
      "out o1: bf16 = (r1[n] * acc)\n"
      "out o2: f32 = gelu(min(hardswish((s1 - x0[m,n])), reciprocal((abs(acc) + 0.25))))\n"
      "out o3: bf16 = (acc - abs(s0))\n"
      "out o4: bf16 = fma(x1[m,n], acc, acc)\n"
      "out o5: bf16 = (silu(gelu_tanh(reciprocal((abs(relu_square(r2[n])) + 0.25))))) + acc\n"
      "out o6: f16 = (c1[m]) + acc\n"
      "out o7: f32 = rsqrt((abs(fma(min(neg(x0[m,n]), bf16(log((abs(acc) + 0.25)))), acc, "
      "log((abs(quick_gelu(acc)) + 0.25)))) + 0.25))\n";
  ParseOptions p;
  p.operand_dtype = DType::f32;
  CompileOptions o;
  o.gemm.a_dtype = o.gemm.b_dtype = DType::f8e4m3;
  o.gemm.b_layout = Layout::col_major;
  const Kernel k(parse_expression(text, p), o);
  const std::string why = k.fallback_reason(280, 624, 320);
  EXPECT_TRUE(has(why, "fewer than 2 main-loop stages")) << why;
  EXPECT_TRUE(has(why, "pingpong_64x128x128")) << why;
}

// Eight outputs reading two bf16 [m,n] operands at three places each and a bf16 row vector at
// two: CUTLASS's epilogue storage is 179 KiB at ping-pong 64×128 (sizeof of the generated
// kernel's CollectiveEpilogue::SharedStorage, 183,296 bytes), which leaves one main-loop stage.
// The model counted each row vector's 256 bytes without the padding before the next 1 KiB-
// aligned tile, said two stages, and nvcc refused the default configuration (evtc fuzz, seed
// 20261128). It is refused now, with the reason.
TEST(Robustness, RowVectorsCountTheirPaddingInSharedMemory) {
  const std::string text =
      "out o0: bf16 = (gelu_tanh(square(bf16((c0[m] == r0[n]))))) + acc\n"
      "out o1: f32 = ((x0[m,n] > c0[m])) + acc\n"
      "out o2: bf16 = (relu_square((c0[m] > c0[m]))) + acc\n"
      "out o3: bf16 = tanh((acc * fma(c1[m], s0, acc)))\n"
      "out o4: bf16 = (erf(min((x1[m,n] + -1.25), (x1[m,n] == x0[m,n])))) + acc\n"
      "out o5: bf16 = (sqrt((abs(reciprocal((abs(0.5) + 0.25))) + 0.25))) + acc\n"
      "out o6: f32 = (r2[n]) + acc\n"
      "out o7: bf16 = (min(x1[m,n], x0[m,n])) + acc\n";
  const Graph g = run_pipeline(parse_expression(text));
  const KernelConfig pingpong = KernelConfig::of(MainloopSchedule::pingpong, 64, 128);
  EXPECT_GE(epilogue_smem_bytes(g, pingpong), size_t(183296)) << "the model must not fall below CUTLASS's storage";
  GemmDesc gemm;
  gemm.b_layout = Layout::col_major;
  EXPECT_EQ(mainloop_stages(pingpong, gemm, epilogue_smem_bytes(g, pingpong)), 1);
  CompileOptions o;
  o.gemm.b_layout = Layout::col_major;
  const Kernel k(parse_expression(text), o);
  const std::string why = k.fallback_reason(552, 240, 80);
  EXPECT_TRUE(has(why, "fewer than 2 main-loop stages")) << why;
  EXPECT_TRUE(has(why, "pingpong_64x128x64")) << why;
}

TEST(Robustness, NanAndInfAreNotSilentlyParameters) {
  for (const char* text : {"out D = acc * nan", "out D = acc + inf", "out D = max(acc, -Infinity)"}) {
    try {
      parse_expression(text);
      ADD_FAILURE() << text << ": parsed (as a scalar parameter named so)";
    } catch (const ParseError& e) {
      EXPECT_TRUE(has(e.what(), "is not a number in expressions")) << e.what();
      EXPECT_EQ(e.line(), 1) << e.what();
    }
  }
  EXPECT_NO_THROW(parse_expression("out D = acc * nanny + info"));  // ordinary parameter names
}

// The verify pass's rule (every output reads acc) is checked where the expression is read, so
// its error has a line and column, and `evtc explain` (which runs no pass) refuses it too.
TEST(Robustness, OutputsThatIgnoreTheAccumulatorAreRefusedWithALocation) {
  try {
    parse_expression("x = y[m,n] * 2\nout D = acc + x\nout E = x * 3");
    ADD_FAILURE() << "parsed";
  } catch (const ParseError& e) {
    EXPECT_EQ(e.line(), 3) << e.what();
    EXPECT_TRUE(has(e.what(), "output 'E' does not depend on the accumulator acc")) << e.what();
  }
  const auto r = run_cli("explain 'out D = C * 2'");
  EXPECT_EQ(r.exit_code, 2) << r.output;  // printed the graph and exited 0 before
  EXPECT_TRUE(has(r.output, "expr:1:9")) << r.output;
}

TEST(Robustness, NumericOptionsSayWhatTheyTake) {
  struct Case {
    const char* args;
    const char* message;
  };
  for (const Case& c : {Case{"ref 'out D = acc' -m 99999999999999999999 -n 2 -k 2", "'99999999999999999999' is not a size"},
                        Case{"ref 'out D = acc' -m 2 -n 2 -k 2 --seed -1", "'-1' is not a seed"},
                        Case{"run 'out D = acc' -m 0 -n 8 -k 8", "'0' is not a size (an integer from 1 to"},
                        Case{"run 'out D = acc' -m x -n 8 -k 8", "'x' is not a size"},
                        Case{"fuzz --cpu --seed 1e3", "'1e3' is not a seed"}}) {
    const auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.output;  // -1 wrapped, overflow clamped before
    EXPECT_TRUE(has(r.output, c.message)) << c.args << ": " << r.output;
    EXPECT_LT(r.output.size(), 300u) << "a 309-digit range again? " << r.output;
  }
}

TEST(Robustness, AotBuildSaysWhatItNeeds) {
  auto r = run_cli("aot build -o " + temp_path("lib").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "nothing to build: give --expr, --list or --preset")) << r.output;
  r = run_cli("aot build -o " + temp_path("lib").string() + " --preset transformer --config coop_128x256x64_c2x1_persistent");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "--config: applies to --expr kernels")) << r.output;
  EXPECT_FALSE(fs::exists(temp_path("lib") / "manifest.json"));
}

// A kernel list's errors name the file and the field; a folder given as the list says so.
TEST(Robustness, AotBuildNamesTheListFileAndTheField) {
  const fs::path list = write_temp(
      "list.json", R"J({"format": "evtc-kernel-list", "format_version": 1, "kernels": [{"expr": "out D = acc", "shapes": [{"m": "8"}]}]})J");
  auto r = run_cli(fmt::format("aot build -o {} --list {}", temp_path("lib").string(), list.string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, fmt::format("--list {}: kernel list entry 1: shape 1: \"m\" must be a whole number from 0 "
                                        "to 2147483647, not \"8\"",
                                        list.string())))
      << r.output;
  const fs::path folder = temp_path("list-folder");
  fs::create_directories(folder);
  r = run_cli(fmt::format("aot build -o {} --list {}", temp_path("lib").string(), folder.string()));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, fmt::format("--list: File is actually a directory: {}", folder.string()))) << r.output;
  EXPECT_FALSE(fs::exists(temp_path("lib") / "manifest.json"));
  fs::remove(list);
  fs::remove_all(folder);
}

// A stand-in nvcc that gives its version and fails every compile without a word.
fs::path silent_failing_nvcc(const fs::path& dir) {
  fs::create_directories(dir);
  const fs::path fake = dir / "nvcc";
  std::ofstream(fake) << "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Cuda compilation tools, release 13.0, "
                         "V13.0.88'; exit 0; fi\nexit 1\n";
  fs::permissions(fake, fs::perms::owner_all);
  return fake;
}

TEST(Robustness, ACompilerThatPrintsNothingStillGivesAnError) {
  const fs::path fake = silent_failing_nvcc(temp_path("silent"));
  const auto r = run_cli("compile 'out D = relu(acc)' --fallback",
                         "EVTC_CACHE_DIR=" + temp_path("false-cache").string() + " CUDACXX=" + fake.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(has(r.output, "the compiler printed nothing")) << r.output;  // an empty error list before
  // A program that is no nvcc is refused when its version is asked for.
  const auto f = run_cli("compile 'out D = relu(acc)' --fallback",
                         "EVTC_CACHE_DIR=" + temp_path("false-cache").string() + " CUDACXX=/bin/false");
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_TRUE(has(f.output, "/bin/false --version failed (exit 1) or printed no version: is it nvcc?")) << f.output;
  fs::remove_all(temp_path("false-cache"));
  fs::remove_all(temp_path("silent"));
}

// nvcc writes the source's path into the PTX, where ptxas cannot read a double quote: a cache
// folder whose path holds one is refused before any compile, naming it.
TEST(Robustness, ACachePathWithADoubleQuoteIsRefusedBeforeCompiling) {
  const std::string dir = temp_path("quote\"d").string();
  const auto r = run_cli("compile 'out D = relu(acc)'", "EVTC_CACHE_DIR='" + dir + "'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(has(r.output, "has a double quote in its path")) << r.output;
  EXPECT_TRUE(has(r.output, dir)) << r.output;
  EXPECT_FALSE(fs::exists(fs::path(dir) / "tmp")) << "a compile started";
  fs::remove_all(dir);
}

// A compile's nvcc does not outlive a killed evtc process, and its temporary folder is removed
// by the next compile in that cache.
// A stand-in compiler that starts a process of its own (as nvcc starts cicc and cudafe++),
// records both pids and hangs.
fs::path compiler_with_a_child(const fs::path& dir) {
  fs::create_directories(dir);
  const fs::path fake = dir / "nvcc";
  std::ofstream(fake) << "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Cuda compilation tools, release 13.0, "
                         "V13.0.88'; exit 0; fi\nsleep 60 &\necho $$ $! > "
                      << (dir / "pids.tmp").string() << "; mv " << (dir / "pids.tmp").string() << " "
                      << (dir / "pids").string() << "\nwait\n";
  fs::permissions(fake, fs::perms::owner_all);
  return fake;
}

bool gone_within(pid_t pid, int tenths) {
  for (int i = 0; i < tenths; ++i) {
    // A zombie of a re-parented process counts as gone.
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');
    if (text.empty() || (close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'Z')) return true;
    usleep(100000);
  }
  return false;
}

// Killing evtc mid-compile (SIGKILL, SIGTERM, SIGINT) leaves no compiler running: not nvcc, and
// not the processes nvcc started (they were re-parented and ran on); on SIGTERM and SIGINT evtc
// also removes its compile lock and its compile folder, and then dies of the signal.

// `evtc compile --fallback` in a child process with `fake` as its compiler, the cache in `dir`
// and compile slots of its own (other compiles on this machine must not hold the stand-in
// back); the child's pid, or -1.
pid_t start_compile(const fs::path& fake, const fs::path& dir) {
  const pid_t cli = fork();
  if (cli == 0) {
    setenv("CUDACXX", fake.c_str(), 1);
    setenv("EVTC_CACHE_DIR", (dir / "cache").c_str(), 1);
    setenv("EVTC_MACHINE_SLOT_DIR", (dir / "slots").c_str(), 1);
    execl(EVTC_CLI_PATH, EVTC_CLI_PATH, "compile", "out D = relu(acc)", "--fallback", static_cast<char*>(nullptr));
    _exit(127);
  }
  return cli;
}

TEST(Robustness, KilledCompilesLeaveNoCompilerChildren) {
  for (const int sig : {SIGKILL, SIGTERM, SIGINT}) {
    SCOPED_TRACE(strsignal(sig));
    const fs::path dir = temp_path(fmt::format("killed-children-{}", sig));
    fs::remove_all(dir);
    const fs::path fake = compiler_with_a_child(dir);
    const pid_t cli = start_compile(fake, dir);
    ASSERT_GE(cli, 0);
    for (int i = 0; i < 200 && !fs::exists(dir / "pids"); ++i) usleep(50000);
    ASSERT_TRUE(fs::exists(dir / "pids")) << "the stand-in compiler did not start";
    long compiler = 0, child = 0;
    std::ifstream(dir / "pids") >> compiler >> child;
    ASSERT_GT(compiler, 0);
    ASSERT_GT(child, 0);
    kill(cli, sig);
    int status = 0;
    waitpid(cli, &status, 0);
    EXPECT_TRUE(gone_within(pid_t(compiler), 50)) << "the compiler outlived evtc";
    EXPECT_TRUE(gone_within(pid_t(child), 50)) << "the compiler's child outlived evtc";
    kill(pid_t(child), SIGKILL);
    kill(pid_t(compiler), SIGKILL);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "status " << status;
    if (sig != SIGKILL) {
      EXPECT_EQ(std::distance(fs::directory_iterator(dir / "cache" / "locks"), fs::directory_iterator()), 0)
          << "the compile lock was left";
      EXPECT_EQ(std::distance(fs::directory_iterator(dir / "cache" / "tmp"), fs::directory_iterator()), 0)
          << "the compile folder was left";
    }
    fs::remove_all(dir);
  }
}

TEST(Robustness, KilledCompilesLeaveNoCompilerAndNoTemporaries) {
  const fs::path dir = temp_path("killed");
  fs::create_directories(dir);
  const fs::path fake = dir / "nvcc";
  const fs::path pid_file = dir / "nvcc.pid";
  // A stand-in compiler: answers --version, otherwise records its pid and hangs.
  std::ofstream(fake) << "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Cuda compilation tools, release 13.0, "
                         "V13.0.88'; exit 0; fi\necho $$ > "
                      << pid_file.string() << ".tmp; mv " << pid_file.string() << ".tmp " << pid_file.string()
                      << "\nexec sleep 60\n";
  fs::permissions(fake, fs::perms::owner_all);
  const pid_t cli = start_compile(fake, dir);
  ASSERT_GE(cli, 0);
  for (int i = 0; i < 200 && !fs::exists(pid_file); ++i) usleep(50000);
  ASSERT_TRUE(fs::exists(pid_file)) << "the stand-in compiler did not start";
  long compiler = 0;
  std::ifstream(pid_file) >> compiler;
  ASSERT_GT(compiler, 0);
  kill(cli, SIGKILL);
  waitpid(cli, nullptr, 0);
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = kill(pid_t(compiler), 0) != 0;
    if (!gone) usleep(50000);
  }
  EXPECT_TRUE(gone) << "the compiler outlived the killed evtc process";
  if (!gone) kill(pid_t(compiler), SIGKILL);
  ASSERT_EQ(std::distance(fs::directory_iterator(dir / "cache" / "tmp"), fs::directory_iterator()), 1);
  // The next compile in this cache (here: one that fails at once) removes the dead folder.
  run_cli("compile 'out D = relu(acc)' --fallback",
          "EVTC_CACHE_DIR=" + (dir / "cache").string() + " EVTC_MACHINE_SLOT_DIR=" + (dir / "slots").string() +
              " CUDACXX=" + silent_failing_nvcc(dir / "silent").string());
  size_t left = 0;
  for (const auto& e : fs::directory_iterator(dir / "cache" / "tmp"))
    left += e.path().filename().string().find(std::to_string(cli)) != std::string::npos;
  EXPECT_EQ(left, 0u) << "the killed compile's temporary folder is still there";
  fs::remove_all(dir);
}

}  // namespace
