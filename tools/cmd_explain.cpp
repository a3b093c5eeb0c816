// `evtc explain`: parses an epilogue expression and shows its canonical IR and hash, and,
// on request, what each pass of the pipeline does to it (an opt-style driver for passes).
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>

#include "cli.hpp"
#include "evtc/expression.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/passes.hpp"

namespace evtc::cli {
namespace {

struct ExplainArgs {
  std::string expression;
  bool json = false;
  bool passes = false;
  std::string pass;
  std::string dtype = "bf16";
};

std::string pass_names() {
  std::string names;
  for (const PassInfo& p : pipeline_passes()) names += (names.empty() ? "" : ", ") + std::string(p.name);
  return names.empty() ? std::string("(none)") : names;
}

int run_explain(const ExplainArgs& args) {
  ParseOptions options;
  options.operand_dtype = options.output_dtype = *parse_dtype(args.dtype);
  Graph g = parse_expression_arg(args.expression, options);

  if (!args.pass.empty()) {
    const PassInfo* pass = find_pass(args.pass);
    if (!pass) {
      fmt::print(stderr, "error: unknown pass '{}'; the passes are: {}\n", args.pass, pass_names());
      return kExitUsage;
    }
    g = pass->run(g, PipelineOptions{});
  }
  if (args.passes) {
    fmt::print("== parsed ==\n{}", print(g));
    g = run_pipeline(g, PipelineOptions{}, [](const PassInfo& pass, const Graph& after, bool changed) {
      fmt::print("== after {} ==\n{}", pass.name, changed ? print(after) : "(unchanged)\n");
    });
  }

  const Legality legality = check_legality(g, GemmDesc{});
  if (args.json) {
    nlohmann::json j = nlohmann::json::parse(to_json(g));
    j["legality"] = {{"fusable", legality.fusable()}, {"reasons", legality.reasons}};
    fmt::print("{}\n", j.dump(2));
    return kExitOk;
  }
  if (!args.passes) fmt::print("{}", print(g));
  fmt::print("hash: {}\n", graph_hash_hex(g));
  for (const std::string& reason : legality.reasons) fmt::print("not fusable: {}\n", reason);
  return kExitOk;
}

}  // namespace

Command add_explain_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "explain", "Parse an epilogue expression; print its canonical IR and hash, and optionally "
                 "what the passes do to it");
  auto args = std::make_shared<ExplainArgs>();
  sub->add_option("expression", args->expression,
                  "the expression, or a file holding one (see docs/expressions.md)")
      ->type_name("EXPR_OR_FILE")
      ->required();
  CLI::Option* json = sub->add_flag("--json", args->json, "print the graph as JSON");
  CLI::Option* passes = sub->add_flag(
      "--passes", args->passes, "run the pass pipeline, printing the IR after every pass");
  CLI::Option* pass =
      sub->add_option("--pass", args->pass, "run the one pass NAME and print its result")
          ->type_name("NAME");
  sub->add_option("--dtype", args->dtype,
                  "dtype of operands and [m,n] outputs the expression does not declare")
      ->check(dtype_value())
      ->capture_default_str();
  passes->excludes(pass);
  json->excludes(passes);
  return {sub, [args] { return run_explain(*args); }};
}

}  // namespace evtc::cli
