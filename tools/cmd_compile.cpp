// evtc compile: emit the fused kernel for an expression and compile it with nvcc (no GPU
// needed). --emit writes the generated source; --fallback also builds the unfused path.
#include <fmt/format.h>

#include <chrono>
#include <fstream>

#include "cli.hpp"
#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/runtime.hpp"

namespace evtc::cli {

Command add_compile_command(CLI::App& app) {
  struct Args {
    std::string expr, config, emit, arch, cast_mode = "eager";
    GemmFlags gemm;
    bool emit_only = false, fallback = false, precise = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("compile", "Generate and compile the fused kernel (no GPU needed)");
  sub->add_option("expr", a->expr, "Expression, or a file holding one")->required();
  a->gemm.add_to(sub);
  sub->add_option("--config", a->config, "Kernel config name")->check(config_value());
  CLI::Option* emit = sub->add_option("--emit", a->emit, "Write the generated CUDA source to this file");
  sub->add_flag("--emit-only", a->emit_only, "Only write the source (with --emit), do not compile")->needs(emit);
  sub->add_flag("--fallback", a->fallback, "Also compile the unfused fallback epilogue");
  sub->add_flag("--precise", a->precise, "Full-precision transcendental math");
  add_arch_option(sub, a->arch);
  add_cast_mode_option(sub, a->cast_mode);
  return {sub, [a] {
            const ParseOptions popts = a->gemm.parse_options();
            CompileOptions opts;
            opts.gemm = a->gemm.desc();
            opts.precise_math = a->precise;
            opts.arch = arch_option(a->arch);
            opts.cast_mode = cast_mode_option(a->cast_mode);
            if (!a->config.empty()) opts.config = KernelConfig::parse(a->config);  // config_value() checked it
            Kernel kernel(parse_expression_arg(a->expr, popts), opts);
            const std::string not_fusable = kernel.fallback_reason(0, 0, 0);
            if (!not_fusable.empty() && (!a->fallback || !a->emit.empty()))
              throw UserError(fmt::format("no fused kernel to {}: {}{}", a->emit.empty() ? "compile" : "emit",
                                          not_fusable,
                                          a->fallback ? "" : " (--fallback compiles the unfused path's epilogue)"));
            if (!a->emit.empty()) {
              write_output_file(a->emit, kernel.source(), "--emit");
              fmt::print("wrote {}\n", a->emit);
              if (a->emit_only) return kExitOk;
            }
            auto t0 = std::chrono::steady_clock::now();
            if (!not_fusable.empty()) {
              fmt::print("fused kernel: none ({})\n", not_fusable);
            } else {
              kernel.compile();
              fmt::print("fused kernel: {} ({:.3f} s)\n", kernel.library_path(),
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            }
            if (a->fallback) {
              t0 = std::chrono::steady_clock::now();
              const std::string path = kernel.compile_fallback();
              fmt::print("fallback epilogue: {} ({:.1f} s)\n", path,
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            }
            return kExitOk;
          }};
}

}  // namespace evtc::cli
