// Golden tests for the passes: tests/golden/passes/<pass>/<case>.ir holds an input graph in
// canonical text; <case>.expected beside it holds what the pass prints for it. The folder
// `pipeline` runs the whole pipeline and records the graph after every pass that changes it;
// `swap_ab` records the transposed problem (evtc::swap_ab: its graph and GEMM) or the reason
// it is refused.
//
// Input files may start with directives for the options:
//   #! cast_mode fast (or eager, compile)
//   #! gemm m=128 n=256 k=64 a=bf16 b=bf16 a_layout=row_major b_layout=col_major sm=90
//   #! view NAME ROWS COLS ROW_STRIDE COL_STRIDE
// Run with EVTC_UPDATE_GOLDEN=1 to rewrite the expected files from the current output.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "golden_files.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "evtc/error.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/passes.hpp"

using namespace evtc;
namespace fs = std::filesystem;

namespace {

const fs::path kGoldenDir = fs::path(EVTC_TEST_DATA_DIR) / "golden" / "passes";

struct GoldenCase {
  std::string pass;  // a pass name, or "pipeline"
  fs::path input;
};

void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.input.string(); }

std::vector<GoldenCase> discover_cases() {
  std::vector<GoldenCase> cases;
  if (!fs::is_directory(kGoldenDir)) return cases;
  for (const auto& dir : fs::directory_iterator(kGoldenDir)) {
    if (!dir.is_directory()) continue;
    for (const auto& file : fs::directory_iterator(dir.path()))
      if (file.path().extension() == ".ir")
        cases.push_back({dir.path().filename().string(), file.path()});
  }
  std::sort(cases.begin(), cases.end(),
            [](const GoldenCase& a, const GoldenCase& b) { return a.input < b.input; });
  return cases;
}

using evtc::test::read_file;

Layout parse_layout(const std::string& s) {
  if (s == "row_major") return Layout::row_major;
  if (s == "col_major") return Layout::col_major;
  throw std::invalid_argument("bad layout " + s);
}

DType parse_dtype_or_throw(const std::string& s) {
  auto d = parse_dtype(s);
  if (!d) throw std::invalid_argument("bad dtype " + s);
  return *d;
}

PipelineOptions parse_directives(const std::string& text) {
  PipelineOptions o;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("#!", 0) != 0) continue;
    std::istringstream words(line.substr(2));
    std::string what;
    words >> what;
    if (what == "cast_mode") {
      std::string mode;
      words >> mode;
      const auto named = cast_mode_named(mode);
      if (!named) throw std::invalid_argument("bad cast mode " + mode);
      o.cast_mode = *named;
    } else if (what == "gemm") {
      std::string kv;
      while (words >> kv) {
        const auto eq = kv.find('=');
        const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
        if (k == "m") o.gemm.m = std::stoll(v);
        else if (k == "n") o.gemm.n = std::stoll(v);
        else if (k == "k") o.gemm.k = std::stoll(v);
        else if (k == "a") o.gemm.a_dtype = parse_dtype_or_throw(v);
        else if (k == "b") o.gemm.b_dtype = parse_dtype_or_throw(v);
        else if (k == "a_layout") o.gemm.a_layout = parse_layout(v);
        else if (k == "b_layout") o.gemm.b_layout = parse_layout(v);
        else if (k == "sm") o.gemm.sm = std::stoi(v);
        else throw std::invalid_argument("bad gemm key " + k);
      }
    } else if (what == "view") {
      std::string name;
      OperandView v;
      if (!(words >> name >> v.rows >> v.cols >> v.row_stride >> v.col_stride))
        throw std::invalid_argument("bad view directive: " + line);
      o.views[name] = v;
    } else {
      throw std::invalid_argument("unknown directive: " + line);
    }
  }
  return o;
}

// The input without comment lines: must already be canonical.
std::string strip_comments(const std::string& text) {
  std::istringstream lines(text);
  std::string line, out;
  while (std::getline(lines, line))
    if (!line.empty() && line[0] != '#') out += line + "\n";
  return out;
}

std::string gemm_line(const GemmDesc& g) {
  auto layout = [](Layout l) { return l == Layout::row_major ? "row_major" : "col_major"; };
  return fmt::format("#! gemm m={} n={} k={} a={} b={} a_layout={} b_layout={} sm={}\n", g.m, g.n, g.k,
                     dtype_name(g.a_dtype), dtype_name(g.b_dtype), layout(g.a_layout), layout(g.b_layout), g.sm);
}

std::string legality_lines(const Legality& l) {
  if (l.fusable()) return "# legality: fusable\n";
  std::string out;
  for (const std::string& r : l.reasons) out += "# not fusable: " + r + "\n";
  return out;
}

// What the golden file records for one case, and the graph it ends with.
std::pair<std::string, Graph> run_case(const GoldenCase& c, const Graph& input,
                                       PipelineOptions options) {
  Legality legality;
  options.legality = &legality;
  if (c.pass == "pipeline") {
    std::string out;
    Graph result = run_pipeline(input, options, [&](const PassInfo& p, const Graph& after,
                                                    bool changed) {
      out += fmt::format("# after {}{}\n", p.name, changed ? "" : " (unchanged)");
      if (changed) out += print(after);
    });
    return {out + legality_lines(legality), result};
  }
  if (c.pass == "swap_ab") {
    if (std::string why = swap_ab_refusal(input, options.gemm); !why.empty())
      return {"# refused: " + why + "\n", input};
    SwappedProblem swapped = swap_ab(input, options.gemm);
    return {gemm_line(swapped.gemm) + print(swapped.graph), std::move(swapped.graph)};
  }
  const PassInfo* pass = find_pass(c.pass);
  if (!pass) throw std::invalid_argument("no pass named " + c.pass);
  Graph result = pass->run(input, options);
  std::string out = print(result);
  if (c.pass == "legality") out += legality_lines(legality);
  return {out, result};
}

class PassGolden : public testing::TestWithParam<GoldenCase> {};

TEST_P(PassGolden, MatchesExpectedOutput) {
  const GoldenCase& c = GetParam();
  const std::string text = read_file(c.input);
  const PipelineOptions options = parse_directives(text);
  const Graph input = parse_canonical(text);
  ASSERT_EQ(print(input), strip_comments(text)) << c.input << " is not in canonical form";

  const auto [got, result] = run_case(c, input, options);
  fs::path expected_path = c.input;
  expected_path.replace_extension(".expected");
  evtc::test::expect_matches_golden(expected_path, got, c.input.string());

  if (c.pass == "swap_ab") {
    // An involution: the transposed problem's transpose is the original problem.
    if (!swap_ab_refusal(input, options.gemm).empty()) return;
    const SwappedProblem once = swap_ab(input, options.gemm);
    const SwappedProblem back = swap_ab(once.graph, once.gemm);
    EXPECT_EQ(print(back.graph), print(input)) << c.input;
    EXPECT_EQ(gemm_line(back.gemm), gemm_line(options.gemm)) << c.input;
    return;
  }
  // Idempotence: running the same step on its own output changes nothing.
  const auto [again, twice] = run_case(c, result, options);
  EXPECT_EQ(print(twice), print(result)) << c.pass << " is not idempotent on " << c.input;
}

std::string case_name(const testing::TestParamInfo<GoldenCase>& info) {
  std::string name = info.param.pass + "_" + info.param.input.stem().string();
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Passes, PassGolden, testing::ValuesIn(discover_cases()), case_name);

TEST(PassGoldenCoverage, EveryPassHasGoldenCases) {
  std::set<std::string> covered;
  for (const GoldenCase& c : discover_cases()) covered.insert(c.pass);
  for (const PassInfo& p : pipeline_passes())
    EXPECT_TRUE(covered.count(std::string(p.name))) << "no golden case for " << p.name;
  EXPECT_TRUE(covered.count("pipeline"));
}

TEST(PassGoldenCoverage, EveryGoldenFolderIsAPass) {
  for (const GoldenCase& c : discover_cases())
    EXPECT_TRUE(c.pass == "pipeline" || c.pass == "swap_ab" || find_pass(c.pass) != nullptr) << c.input;
}

}  // namespace
