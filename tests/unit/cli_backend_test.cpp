// Errors of the backend-facing commands (compile, run, cache), asserted by their text.
#include <gtest/gtest.h>

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

TEST(CliBackend, FastAccumulationNeedsFp8) {
  const auto r = run_cli("compile 'out D = acc' --fast-accum --emit-only --emit /dev/null");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--fast-accum: only fp8 A/B have a fast-accumulation main loop, but A "
                          "and B are bf16"),
            std::string::npos)
      << r.output;
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
