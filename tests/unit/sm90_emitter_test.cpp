// Tests of the sm90 emitter (src/backends/sm90).
//
// Golden tests: every tests/golden/sm90/NAME.evt is parsed, run through the pass pipeline and
// emitted; the part of the source that the graph decides is compared with NAME.expected:
//   - the type aliases, from `using ElementA` up to (not including) `using CollectiveEpilogue`
//     (element types, layouts, tile shapes and the visitor tree);
//   - `fusion_arguments` (which pointer and scalar slot feeds which node, op parameters);
//   - `finish_reductions` (the fixed-order final stage of every reduction).
// The rest of the file is boilerplate that the nvcc test (tests/nvcc) compiles.
// Leading comment lines of an .evt may set the GEMM and the kernel configuration:
//   # gemm: DTYPE LAYOUT_A LAYOUT_B     (A/B dtype; layouts `row` or `col`; default bf16 row col)
//   # config: NAME                      (a KernelConfig name; default KernelConfig{})
// Run with EVTC_UPDATE_GOLDEN=1 to rewrite the expected files, and review the diff.
//
// The targeted tests below check the lowering rules one at a time.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "golden_files.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cutlass3/emitter.hpp"
#include "backends/emit.hpp"
#include "evtc/expression.hpp"
#include "evtc/graph.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/kernel_config.hpp"
#include "evtc/passes.hpp"

namespace fs = std::filesystem;
using namespace evtc;

namespace {

const fs::path kGoldenDir = fs::path(EVTC_TEST_DATA_DIR) / "golden" / "sm90";
const fs::path kIncludeDir = fs::path(EVTC_TEST_DATA_DIR).parent_path() / "include";

using evtc::test::read_file;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The source from the line starting with `first` up to the line starting with `end` (not
// included), or to the end of the first line that is exactly `end` when `inclusive`.
std::string section(const std::string& source, const std::string& first, const std::string& end,
                    bool inclusive) {
  const size_t b = source.find("\n" + first);
  if (b == std::string::npos) return "(no line starting with " + first + ")\n";
  const size_t e = source.find("\n" + end + (inclusive ? "\n" : ""), b + 1);
  if (e == std::string::npos) return "(no " + end + " after " + first + ")\n";
  return source.substr(b + 1, e - b + (inclusive ? end.size() + 1 : 0));
}

// The graph-dependent part of an emitted kernel (see the header comment).
std::string visitor_part(const std::string& source) {
  return section(source, "using ElementA", "using CollectiveEpilogue", false) +
         section(source, "typename Callbacks::Arguments fusion_arguments", "}", true) + "\n" +
         section(source, "void finish_reductions", "}", true);
}

Graph pipeline(const Graph& parsed, const GemmDesc& gemm, Legality* legality = nullptr) {
  PipelineOptions o;
  o.gemm = gemm;
  o.legality = legality;
  return run_pipeline(parsed, o);
}

// Parses, runs the pipeline and emits with the default GEMM and configuration.
backend::EmittedKernel emit(const std::string& expr, const GemmDesc& gemm = {},
                         const KernelConfig& cfg = {}) {
  return cutlass3::emit_kernel(pipeline(parse_expression(expr), gemm), gemm, cfg);
}

// --- golden files ----------------------------------------------------------------------

std::vector<std::string> golden_names() {
  std::vector<std::string> names;
  if (!fs::is_directory(kGoldenDir)) return names;
  for (const auto& entry : fs::directory_iterator(kGoldenDir))
    if (entry.path().extension() == ".evt") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

struct GoldenInput {
  std::string source;
  GemmDesc gemm;
  KernelConfig config;
};

Layout parse_layout(const std::string& word, const std::string& file) {
  if (word == "row") return Layout::row_major;
  if (word == "col") return Layout::col_major;
  ADD_FAILURE() << file << ": layout '" << word << "' is neither row nor col";
  return Layout::row_major;
}

GoldenInput read_golden_input(const std::string& name) {
  const std::string file = name + ".evt";
  GoldenInput in;
  in.source = read_file(kGoldenDir / file);
  std::istringstream lines(in.source);
  for (std::string line; std::getline(lines, line) && line.rfind("#", 0) == 0;) {
    std::istringstream words(line.substr(1));
    std::string directive;
    words >> directive;
    if (directive == "gemm:") {
      std::string dtype, la, lb;
      words >> dtype >> la >> lb;
      const auto dt = parse_dtype(dtype);
      EXPECT_TRUE(dt.has_value()) << file << ": unknown dtype '" << dtype << "'";
      in.gemm.a_dtype = in.gemm.b_dtype = dt.value_or(DType::bf16);
      in.gemm.a_layout = parse_layout(la, file);
      in.gemm.b_layout = parse_layout(lb, file);
    } else if (directive == "config:") {
      std::string cfg;
      words >> cfg;
      const auto parsed = KernelConfig::parse(cfg);
      EXPECT_TRUE(parsed.has_value()) << file << ": '" << cfg << "' is not a kernel config name";
      in.config = parsed.value_or(KernelConfig{});
    }
  }
  return in;
}

class Sm90Golden : public testing::TestWithParam<std::string> {};

TEST_P(Sm90Golden, MatchesExpected) {
  const std::string name = GetParam();
  const GoldenInput in = read_golden_input(name);
  Legality legality;
  const Graph g = pipeline(parse_expression(in.source, {}, name + ".evt"), in.gemm, &legality);
  ASSERT_TRUE(legality.fusable()) << name << ".evt is not fusable: " << legality.reasons.front();
  const std::string actual = visitor_part(cutlass3::emit_kernel(g, in.gemm, in.config).source);
  evtc::test::expect_matches_golden(kGoldenDir / (name + ".expected"), actual, name + ".evt");
}

INSTANTIATE_TEST_SUITE_P(Sm90, Sm90Golden, testing::ValuesIn(golden_names()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string id = info.param;
                           for (char& c : id)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return id;
                         });

TEST(Sm90GoldenFiles, EveryExpectedFileHasAnInputAndThereAreCases) {
  EXPECT_GE(golden_names().size(), 10u) << "tests/golden/sm90 lost its cases";
  for (const auto& entry : fs::directory_iterator(kGoldenDir))
    if (entry.path().extension() == ".expected") {
      fs::path input = entry.path();
      input.replace_extension(".evt");
      EXPECT_TRUE(fs::exists(input)) << entry.path() << " has no " << input.filename();
    }
}

// --- trees and topological visitors ----------------------------------------------------

TEST(Sm90Emitter, TreeGraphIsNestedEvtsWithoutATopologicalVisitor) {
  const std::string s = emit("out D: bf16 = silu(acc * scale[m] + bias[n])").source;
  EXPECT_EQ(s.find("Sm90TopologicalVisitor"), std::string::npos);
  EXPECT_EQ(count(s, "= cutlass::epilogue::fusion::Sm90EVT<"), 3u);  // mul, add, silu
  EXPECT_NE(s.find("using Callbacks = V"), std::string::npos);
  EXPECT_EQ(s.find("struct Callbacks"), std::string::npos);
}

TEST(Sm90Emitter, SharedValueMakesATopologicalVisitor) {
  // f is used twice; gelu(f) * f does not fold into a single activation.
  const std::string s = emit("f = acc + bias[n]\nout D: bf16 = gelu(f) * f").source;
  EXPECT_EQ(count(s, "Sm90TopologicalVisitor<"), 1u);
  // The shared add is materialised once: one Add compute in the whole file.
  EXPECT_EQ(count(s, "Sm90Compute<evtc::device::Add,"), 1u);
}

TEST(Sm90Emitter, ExtraOutputMakesATopologicalVisitor) {
  const std::string s = emit("out pre: bf16 = acc * 2\nout D: bf16 = relu(acc)").source;
  EXPECT_EQ(count(s, "Sm90TopologicalVisitor<"), 1u);
  EXPECT_EQ(count(s, "Sm90AuxStore<"), 1u);
}

TEST(Sm90Emitter, RepeatedLeafIsReadAgainRatherThanShared) {
  // acc and bias are leaves: used twice, but no topological visitor is needed for them.
  const std::string s = emit("out D: bf16 = (acc + bias[n]) * (acc - bias[n])").source;
  EXPECT_EQ(s.find("Sm90TopologicalVisitor"), std::string::npos);
  EXPECT_EQ(count(s, "= cutlass::epilogue::fusion::Sm90AccFetch;"), 2u);
}

// --- Blackwell backends (compile-checked by tests/nvcc/compile_kernels.sh) --------------

TEST(BlackwellEmitter, Sm100KernelIsTheOneSmUmmaKernelWithAConvertingRoot) {
  GemmDesc g;
  g.sm = 100;
  const KernelConfig c = default_config(parse_expression("out D: bf16 = acc"), g);
  const std::string s = emit("out D: bf16 = silu(acc + bias[n]) * gate[m,n]", g, c).source;
  for (const char* part :
       {"using ArchTag = cutlass::arch::Sm100;", "using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecialized1SmSm100;",
        "using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized1Sm;",
        "detail::Sm100EpilogueDescriptor<", "detail::Sm100AuxLoadDescriptor<EpilogueDescriptor,",
        "#include <cutlass/gemm/collective/collective_builder.hpp>",
        // Blackwell's epilogue stores the tree's result as it is: the root converts it to D's type.
        "cutlass::epilogue::thread::Identity, ElementD, float,",
        "return typename Callbacks::Arguments{typename V"})
    EXPECT_NE(s.find(part), std::string::npos) << part;
  EXPECT_EQ(s.find("sm90_gmma_builder.inl"), std::string::npos);
  EXPECT_EQ(s.find("ArchTag = cutlass::arch::Sm90"), std::string::npos);
  // 256-row tiles: the two-SM MMA; the builders take its tile, the visitor nodes one CTA's half.
  const std::string two = emit("out D: bf16 = acc + bias[n]", g, *KernelConfig::parse("coop_256x128x64_c2x1_persistent")).source;
  for (const char* part : {"using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecialized2SmSm100;",
                           "using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized2Sm;",
                           "using TileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;",
                           "using MmaTileShape = cute::Shape<cute::_256, cute::_128, cute::_64>;",
                           "Sm90RowBroadcast<0, TileShape,", "OpClassTensorOp, MmaTileShape, ClusterShape, EpilogueTile,"})
    EXPECT_NE(two.find(part), std::string::npos) << part;
}

TEST(BlackwellEmitter, Sm120KernelIsFp8WithItsOwnArchTag) {
  GemmDesc g;
  g.sm = 120;
  g.a_dtype = g.b_dtype = DType::f8e4m3;
  g.b_layout = Layout::col_major;
  const KernelConfig c = default_config(parse_expression("out D: bf16 = acc"), g);
  EXPECT_EQ(c.name(), "coop_128x128x128_c1x1_persistent");
  const std::string s = emit("input sa[m]: f32\ninput sb[n]: f32\nout D: bf16 = acc * sa[m] * sb[n]", g, c).source;
  for (const char* part : {"using ArchTag = cutlass::arch::Sm120;",
                           "using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;",
                           "using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;",
                           "cutlass::epilogue::thread::Identity, ElementD, float,"})
    EXPECT_NE(s.find(part), std::string::npos) << part;
  // Hopper's two-level fp8 main loop header is not included.
  EXPECT_EQ(s.find("sm90_mma_tma_gmma_ss_warpspecialized_fp8.hpp"), std::string::npos);
}

// --- reductions ------------------------------------------------------------------------

TEST(Sm90Emitter, ReductionOverNIsCutlassColReduction) {
  const std::string s = emit("out r = row_sum(acc)").source;
  EXPECT_NE(s.find("Sm90ColReduction<cutlass::plus"), std::string::npos);
  EXPECT_EQ(s.find("Sm90RowReduction"), std::string::npos);
}

TEST(Sm90Emitter, ReductionOverMIsCutlassRowReduction) {
  const std::string s = emit("out c = col_sum(acc)").source;
  EXPECT_NE(s.find("Sm90RowReduction<cutlass::plus"), std::string::npos);
  EXPECT_EQ(s.find("Sm90ColReduction"), std::string::npos);
}

TEST(Sm90Emitter, HostPartsDevicePassReadsTheFileWhereTheHostLaunchesTheReductionsFinish) {
  // The reductions' finish is launched from the host part (<<<>>>): its device pass must
  // compile those kernels, or they fail at launch with "invalid device function" in a library
  // compiled in two parts. Without reductions the pass skips the file.
  const std::string skip = "#if !(defined(EVTC_PART) && EVTC_PART == 2 && defined(__CUDA_ARCH__))";
  const std::string with = emit("out D: bf16 = acc; out r = row_sum(acc)").source;
  EXPECT_NE(with.find("finish_reductions"), std::string::npos);
  EXPECT_EQ(with.find(skip), std::string::npos);
  EXPECT_NE(emit("out D: bf16 = acc").source.find(skip), std::string::npos);
}

TEST(Sm90Emitter, ReductionOpsUseTheirCutlassOperatorAndIdentity) {
  struct Case {
    const char* expr;
    const char* op;
    const char* identity;
  };
  const Case cases[] = {
      {"out r = row_sum(acc)", "cutlass::plus", "0.0f"},
      {"out r = row_max(acc)", "cutlass::maximum",
       "(-cutlass::platform::numeric_limits<float>::infinity())"},
      {"out r = row_min(acc)", "cutlass::minimum",
       "cutlass::platform::numeric_limits<float>::infinity()"},
      {"out r = row_amax(acc)", "cutlass::maximum", "0.0f"},
  };
  for (const Case& c : cases) {
    const std::string s = emit(c.expr).source;
    EXPECT_NE(s.find(std::string("Sm90ColReduction<") + c.op + ", " + c.op + ", " + c.op),
              std::string::npos)
        << c.expr;
    // Partials go to evtc's scratch; the final kernel folds them into the output slot.
    const std::string args = section(s, "typename Callbacks::Arguments fusion_arguments", "}", true);
    EXPECT_NE(args.find(std::string("scratch_partials(a, scratch, 0), ") + c.identity + ", {}"),
              std::string::npos)
        << c.expr << ":\n" << args;
    const std::string final_stage = section(s, "void finish_reductions", "}", true);
    EXPECT_NE(final_stage.find("reduce_partial_rows<"), std::string::npos) << final_stage;
    EXPECT_NE(final_stage.find(std::string("static_cast<float*>(a.ptrs[0]), ") + c.identity + ");"),
              std::string::npos)
        << c.expr << ":\n" << final_stage;
  }
}

// The name of the first alias `using Vk = <prefix>...`, or "" if there is none.
std::string alias_of(const std::string& s, const std::string& prefix) {
  const std::string using_v = "\nusing V";
  for (size_t at = s.find(using_v); at != std::string::npos; at = s.find(using_v, at + 1)) {
    const size_t name = at + using_v.size() - 1, eq = s.find(" = ", at);
    if (eq != std::string::npos && s.compare(eq + 3, prefix.size(), prefix) == 0)
      return s.substr(name, eq - name);
  }
  return "";
}

// The single topological visitor of a kernel: its entries and, for each, its operands.
struct Topological {
  std::vector<std::string> entries;
  std::vector<std::vector<int>> operands;
};

std::optional<Topological> topological_visitor(const std::string& s) {
  static const std::regex re(
      R"(Sm90TopologicalVisitor<float, cute::tuple<((?:cute::seq<[\d, ]*>(?:, )?)+)>, ((?:V\d+(?:, )?)+)>;)");
  std::smatch m;
  if (!std::regex_search(s, m, re)) return std::nullopt;
  Topological t;
  const std::string edges = m[1].str(), entries = m[2].str();
  static const std::regex seq(R"(cute::seq<([\d, ]*)>)"), number(R"(\d+)"), alias(R"(V\d+)");
  for (std::sregex_iterator it(edges.begin(), edges.end(), seq), end; it != end; ++it) {
    const std::string list = (*it)[1].str();
    std::vector<int> ops;
    for (std::sregex_iterator n(list.begin(), list.end(), number); n != end; ++n) ops.push_back(std::stoi(n->str()));
    t.operands.push_back(ops);
  }
  for (std::sregex_iterator it(entries.begin(), entries.end(), alias), end; it != end; ++it)
    t.entries.push_back(it->str());
  return t;
}

TEST(Sm90Emitter, AmaxIsAbsInFrontOfAMaxReduction) {
  for (const char* expr : {"out r = row_amax(acc)", "out c = col_amax(acc)", "out t = amax(acc)",
                           "out D: bf16 = acc\nout t = amax(acc * 2)"}) {
    const std::string s = emit(expr).source;
    const std::string types = section(s, "using ElementA", "using CollectiveEpilogue", false);
    const std::string abs = alias_of(s, "cutlass::epilogue::fusion::Sm90Compute<evtc::device::Abs,");
    ASSERT_NE(abs, "") << expr << ": no Abs compute\n" << types;
    std::string red = alias_of(s, "cutlass::epilogue::fusion::Sm90ColReduction<cutlass::maximum");
    if (red.empty()) red = alias_of(s, "cutlass::epilogue::fusion::Sm90RowReduction<cutlass::maximum");
    if (red.empty()) red = alias_of(s, "evtc::device::Sm90ScalarPartials<evtc::device::MaxOp");
    ASSERT_NE(red, "") << expr << ": no max reduction\n" << types;
    EXPECT_EQ(count(s, "evtc::device::Abs,"), 1u) << expr;
    // The reduction's operand is the abs: a tree EVT<reduction, EVT<abs, ...>>, or in a
    // topological visitor an entry whose only operand is the abs entry.
    const std::string abs_tree = alias_of(s, "cutlass::epilogue::fusion::Sm90EVT<" + abs + ",");
    if (!abs_tree.empty() && s.find("Sm90EVT<" + red + ", " + abs_tree + ">;") != std::string::npos)
      continue;
    const auto topo = topological_visitor(s);
    ASSERT_TRUE(topo.has_value()) << expr << ": the reduction does not take the abs tree\n" << types;
    const auto pos = [&](const std::string& v) {
      return std::find(topo->entries.begin(), topo->entries.end(), v) - topo->entries.begin();
    };
    const auto ia = pos(abs), ir = pos(red);
    ASSERT_LT(ir, static_cast<long>(topo->entries.size())) << expr << "\n" << types;
    ASSERT_LT(ia, ir) << expr << "\n" << types;
    EXPECT_EQ(topo->operands.at(ir), std::vector<int>{static_cast<int>(ia)}) << expr << "\n" << types;
  }
}

TEST(Sm90Emitter, MaxReductionHasNoAbs) {
  EXPECT_EQ(emit("out r = row_max(acc)").source.find("evtc::device::Abs"), std::string::npos);
}

TEST(Sm90Emitter, WholeMatrixReductionGoesThroughPerWarpPartialsAndAFinalKernel) {
  const std::string s = emit("out lo = min(acc)\nout hi: bf16 = max(acc)").source;
  EXPECT_NE(s.find("constexpr char kReductionAxes[] = \"aa\";"), std::string::npos);
  EXPECT_EQ(count(s, "evtc::device::Sm90ScalarPartials<"), 2u);
  EXPECT_EQ(s.find("Sm90ColReduction"), std::string::npos);
  EXPECT_EQ(count(s, "scratch_partials(a, scratch, 0)"), 2u);  // fusion args + final kernel
  EXPECT_EQ(count(s, "scratch_partials(a, scratch, 1)"), 2u);
  // The final kernels write the outputs' slots (hi is slot 0, lo slot 1: outputs are in
  // canonical order, by name) with the identity of their operation.
  const std::string final_stage = section(s, "void finish_reductions", "}", true);
  EXPECT_NE(s.find("reduce_partials<evtc::device::MaxOp, cutlass::bfloat16_t><<<1, 1024, 0, s>>>("
                   "scratch_partials(a, scratch, 0), int64_t(kScratch.floats(a, 'a')), "
                   "static_cast<cutlass::bfloat16_t*>(a.ptrs[0]), "
                   "(-cutlass::platform::numeric_limits<float>::infinity()));"),
            std::string::npos)
      << final_stage;
  EXPECT_NE(s.find("reduce_partials<evtc::device::MinOp, float><<<1, 1024, 0, s>>>("
                   "scratch_partials(a, scratch, 1), int64_t(kScratch.floats(a, 'a')), "
                   "static_cast<float*>(a.ptrs[1]), "
                   "cutlass::platform::numeric_limits<float>::infinity());"),
            std::string::npos)
      << final_stage;
}

TEST(Sm90Emitter, RowAndColumnReductionsSkipCutlasssFinalStageAndFoldPartialRows) {
  const std::string s = emit("out r = row_sum(acc)\nout c: bf16 = col_max(acc)").source;
  // CUTLASS's reductions with FinalReduction = false (the trailing `true, false`).
  EXPECT_NE(s.find("Sm90ColReduction<cutlass::plus, cutlass::plus, cutlass::plus, 0, TileShape, "
                   "float, float, cutlass::FloatRoundStyle::round_to_nearest, "
                   "cute::Stride<cute::_1, cute::_0, cute::_0>, 4, true, false>"),
            std::string::npos);
  EXPECT_NE(s.find("Sm90RowReduction<cutlass::maximum, cutlass::maximum, cutlass::maximum, 0, "
                   "TileShape, float, float, cutlass::FloatRoundStyle::round_to_nearest, "
                   "cute::Stride<cute::_0, cute::_1, cute::_0>, 4, true, false>"),
            std::string::npos);
  const std::string final_stage = section(s, "void finish_reductions", "}", true);
  // c (slot 0): tiles_m rows of the padded N; r (slot 1): tiles_n rows of the padded M.
  EXPECT_NE(final_stage.find("reduce_partial_rows<evtc::device::MaxOp, cutlass::bfloat16_t>"
                             "<<<int((a.n + 255) / 256), 256, 0, s>>>(scratch_partials(a, "
                             "scratch, 0), a.n, kScratch.tiles_n(a) * kTileN, kScratch.tiles_m(a), "),
            std::string::npos)
      << final_stage;
  EXPECT_NE(final_stage.find("reduce_partial_rows<evtc::device::SumOp, float>"
                             "<<<int((a.m + 255) / 256), 256, 0, s>>>(scratch_partials(a, "
                             "scratch, 1), a.m, kScratch.tiles_m(a) * kTileM, kScratch.tiles_n(a), "),
            std::string::npos)
      << final_stage;
}

TEST(Sm90Emitter, RowLogsumexpIsEvtcsPairNodeWithPairPartials) {
  const std::string s = emit("out r = row_logsumexp(acc)\nout c = col_logsumexp(acc)\nout a = logsumexp(acc)").source;
  EXPECT_NE(s.find("#include \"evtc/device/sm90_logsumexp.cuh\""), std::string::npos);
  // Rows: evtc's (m, s) node, not CUTLASS's column reduction; columns: CUTLASS's row reduction
  // folding log(e^a + e^b); the whole matrix: per-warp partials with the same fold.
  EXPECT_NE(s.find("evtc::device::Sm90RowLsePartials<TileShape>"), std::string::npos);
  EXPECT_EQ(s.find("Sm90ColReduction"), std::string::npos);
  EXPECT_NE(s.find("Sm90RowReduction<evtc::device::LogAddExpFn, evtc::device::LogAddExpFn, "
                   "evtc::device::LogAddExpFn"),
            std::string::npos);
  EXPECT_NE(s.find("evtc::device::Sm90ScalarPartials<evtc::device::LogAddExpOp, TileShape>"), std::string::npos);
  // Slots in output order a, c, r: the row reduction's partials are pairs ('R').
  EXPECT_NE(s.find("constexpr char kReductionAxes[] = \"acR\";"), std::string::npos) << s;
  const std::string final_stage = section(s, "void finish_reductions", "}", true);
  EXPECT_NE(final_stage.find("evtc::device::reduce_lse_pair_rows<float><<<int((a.m + 255) / 256), 256, 0, s>>>("
                             "scratch_partials(a, scratch, 2), a.m, kScratch.tiles_m(a) * kTileM, "
                             "kScratch.tiles_n(a), "),
            std::string::npos)
      << final_stage;
  EXPECT_NE(final_stage.find("reduce_partials<evtc::device::LogAddExpOp, float>"), std::string::npos) << final_stage;
}

TEST(Sm90Emitter, KernelsWithoutLogsumexpDoNotIncludeItsHeader) {
  EXPECT_EQ(emit("out r = row_sum(acc)").source.find("sm90_logsumexp"), std::string::npos);
}

// --- the index leaves and integer operands -------------------------------------------

TEST(Sm90Emitter, IndexLeavesAreEvtcsIndexNodeWithItsHeader) {
  const std::string s = emit("out D: bf16 = acc * (m >= n)").source;
  EXPECT_NE(s.find("#include \"evtc/device/sm90_index.cuh\""), std::string::npos);
  EXPECT_EQ(count(s, "= evtc::device::Sm90Index<0>;"), 1u) << s;  // m: axis 0 of (M, N)
  EXPECT_EQ(count(s, "= evtc::device::Sm90Index<1>;"), 1u) << s;  // n: axis 1
  EXPECT_EQ(emit("out D: bf16 = acc * bias[n]").source.find("sm90_index"), std::string::npos);
}

TEST(Sm90Emitter, IntegerVectorsAreBroadcastsOfIntegerElementsReadAsFloat) {
  const std::string s = emit("input t[m]: i32\ninput q[n]: i64\nout D: bf16 = acc * (n == t[m]) - q[n]").source;
  EXPECT_NE(s.find("cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, int32_t, float, "
                   "cute::Stride<cute::_1, cute::_0, cute::_0>>"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, int64_t, float, "
                   "cute::Stride<cute::_0, cute::_1, cute::_0>>"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("static_cast<const int32_t*>(a.ptrs["), std::string::npos);
  EXPECT_NE(s.find("static_cast<const int64_t*>(a.ptrs["), std::string::npos);
}

// A transposed kernel's rows are the problem's columns: the dense emitter's swap-AB rewrite
// gives n the kernel's axis 0 and m its axis 1, and the [m] labels a row broadcast.
TEST(Sm90Emitter, SwapAbKernelsExchangeTheIndices) {
  GemmDesc gemm;
  gemm.m = 16;
  gemm.n = 4096;
  gemm.k = 4096;
  gemm.b_layout = Layout::col_major;
  const std::optional<KernelConfig> cfg = KernelConfig::parse("pingpong_64x16x128_c1x1_persistent_swap");
  ASSERT_TRUE(cfg && cfg->swap_ab);
  const std::string s =
      backend::emit_dense_kernel(pipeline(parse_expression("input t[m]: i32\nout D: bf16 = acc * (n == t[m])"), gemm),
                                 gemm, *cfg)
          .source;
  EXPECT_NE(s.find("// row index m\nusing V1 = evtc::device::Sm90Index<0>;"), std::string::npos) << s;
  EXPECT_NE(s.find("Sm90RowBroadcast<0, TileShape, int32_t, float"), std::string::npos) << s;
  EXPECT_EQ(s.find("Sm90Index<1>"), std::string::npos) << s;
}

// --- the main output -------------------------------------------------------------------

TEST(Sm90Emitter, MainOutputIsTheOneNamedD) {
  const auto k = emit("out a: f16 = acc\nout D: f32 = relu(acc)");
  EXPECT_EQ(k.signature.d_name, "D");
  EXPECT_NE(k.source.find("using ElementD = float;"), std::string::npos);
  EXPECT_NE(k.source.find("// output a[m,n]"), std::string::npos);
  EXPECT_EQ(k.source.find("// output D[m,n]"), std::string::npos);
}

TEST(Sm90Emitter, WithoutDTheMainOutputIsTheFirstFullOutput) {
  const auto k = emit("out b: f32 = relu(acc)\nout a: f16 = acc");
  EXPECT_EQ(k.signature.d_name, "a");
  EXPECT_NE(k.source.find("using ElementD = cutlass::half_t;"), std::string::npos);
  EXPECT_NE(k.source.find("// output b[m,n]"), std::string::npos);
  EXPECT_EQ(k.source.find("// output a[m,n]"), std::string::npos);
}

TEST(Sm90Emitter, ReductionIsNeverTheMainOutput) {
  const auto k = emit("out r = row_sum(acc)\nout y: f16 = acc");
  EXPECT_EQ(k.signature.d_name, "y");
  EXPECT_NE(k.source.find("using ElementD = cutlass::half_t;"), std::string::npos);
}

TEST(Sm90Emitter, NoFullOutputMeansNoDAndCallbacksWithElementAux) {
  const auto k = emit("out r = row_sum(acc)");
  EXPECT_EQ(k.signature.d_name, "");
  EXPECT_NE(k.source.find("using ElementD = void;"), std::string::npos);
  EXPECT_NE(k.source.find("struct Callbacks : V"), std::string::npos);
  EXPECT_NE(k.source.find("  using ElementAux = "), std::string::npos);
}

// --- loads, scalars, C -----------------------------------------------------------------

TEST(Sm90Emitter, ElementCIsVoidWithoutCAndTheSourceDtypeWithIt) {
  EXPECT_NE(emit("out D: bf16 = acc").source.find("using ElementC = void;"), std::string::npos);
  const std::string s = emit("input C: f16\nout D: bf16 = acc + C").source;
  EXPECT_NE(s.find("using ElementC = cutlass::half_t;"), std::string::npos);
  EXPECT_NE(s.find("Sm90SrcFetch<cutlass::half_t>"), std::string::npos);
}

TEST(Sm90Emitter, ScalarsByValueByPointerAndConstants) {
  const std::string s = emit("input p: f32 ptr\nout D: bf16 = acc * p + v * 3").source;
  const std::string args = section(s, "typename Callbacks::Arguments fusion_arguments", "}", true);
  EXPECT_NE(args.find("{{}, {static_cast<const float*>(a.ptrs[0])}}"), std::string::npos) << args;
  EXPECT_NE(args.find("{{float(float(a.scalars[0]))}}"), std::string::npos) << args;
  EXPECT_NE(args.find("{{float(3)}}"), std::string::npos) << args;
}

TEST(Sm90Emitter, AuxLoadLayoutSetsDescriptorAndStride) {
  const std::string row = emit("out D: bf16 = acc + r[m,n]").source;
  EXPECT_NE(row.find("AuxLoadDescriptor<EpilogueDescriptor, cutlass::layout::RowMajor, cutlass::bfloat16_t>"),
            std::string::npos);
  EXPECT_NE(row.find("cute::make_stride(int64_t(a.n), cute::Int<1>{}, int64_t(0))"), std::string::npos);
  const std::string col = emit("input r[m,n]: f16 col_major\nout D: bf16 = acc + r").source;
  EXPECT_NE(col.find("AuxLoadDescriptor<EpilogueDescriptor, cutlass::layout::ColumnMajor, cutlass::half_t>"),
            std::string::npos);
  EXPECT_NE(col.find("cute::make_stride(cute::Int<1>{}, int64_t(a.m), int64_t(0))"), std::string::npos);
}

TEST(Sm90Emitter, GemmDtypesLayoutsAndConfigReachTheKernel) {
  GemmDesc gemm;
  gemm.a_dtype = gemm.b_dtype = DType::f8e4m3;
  gemm.a_layout = Layout::row_major;
  gemm.b_layout = Layout::col_major;
  KernelConfig cfg;
  cfg.tile_m = 256;
  cfg.tile_n = 128;
  cfg.tile_k = 128;
  cfg.cluster_m = 1;
  cfg.cluster_n = 2;
  cfg.scheduler = TileSchedulerKind::stream_k;
  cfg.precise_math = true;
  const std::string s = emit("out D: bf16 = acc", gemm, cfg).source;
  EXPECT_NE(s.find("using ElementA = cutlass::float_e4m3_t;\nusing LayoutA = cutlass::layout::RowMajor;"),
            std::string::npos);
  EXPECT_NE(s.find("using ElementB = cutlass::float_e4m3_t;\nusing LayoutB = cutlass::layout::ColumnMajor;"),
            std::string::npos);
  EXPECT_NE(s.find("using TileShape = cute::Shape<cute::_256, cute::_128, cute::_128>;"), std::string::npos);
  EXPECT_NE(s.find("using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;"), std::string::npos);
  EXPECT_NE(s.find("cutlass::gemm::KernelTmaWarpSpecializedCooperative"), std::string::npos);
  EXPECT_NE(s.find("cutlass::epilogue::TmaWarpSpecializedCooperative"), std::string::npos);
  EXPECT_NE(s.find("cutlass::gemm::StreamKScheduler"), std::string::npos);
  EXPECT_NE(s.find("#define EVTC_PRECISE_MATH 1"), std::string::npos);
  EXPECT_NE(s.find(cfg.name()), std::string::npos);

  cfg = KernelConfig{};
  cfg.schedule = MainloopSchedule::pingpong;
  const std::string p = emit("out D: bf16 = acc", {}, cfg).source;
  EXPECT_NE(p.find("cutlass::gemm::KernelTmaWarpSpecializedPingpong"), std::string::npos);
  EXPECT_NE(p.find("using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;"), std::string::npos);
  EXPECT_EQ(p.find("StreamKScheduler"), std::string::npos);
  EXPECT_EQ(p.find("EVTC_PRECISE_MATH"), std::string::npos);
}

TEST(Sm90Emitter, ExportsTheSignatureAsEscapedJson) {
  const auto k = emit("out D: bf16 = acc + bias[n]");
  std::string escaped;
  for (char c : k.signature.to_json()) escaped += c == '"' ? std::string("\\\"") : std::string(1, c);
  EXPECT_NE(k.source.find("const char* evtc_kernel_signature(void) { return \"" + escaped + "\"; }"),
            std::string::npos);
}

// --- the op table ----------------------------------------------------------------------

TEST(Sm90Emitter, EveryOpEmitsItsFunctor) {
  for (const OpInfo& info : op_table()) {
    Graph g;
    std::vector<Value> in = {g.accum(), g.row_vec("bias", DType::bf16), g.col_vec("scale", DType::bf16)};
    in.resize(static_cast<size_t>(info.arity));
    std::vector<double> attrs(info.attr_defaults.begin(), info.attr_defaults.begin() + info.num_attrs);
    const Value v = g.compute(info.op, in, attrs);
    g.store("D", v, DType::bf16);
    const Graph lowered = pipeline(g, {});
    bool kept = false;
    for (const Node& n : lowered.nodes()) kept |= n.kind == NodeKind::compute && n.op == info.op;
    ASSERT_TRUE(kept) << info.name << " did not survive the pipeline:\n" << print(lowered);
    const std::string s = cutlass3::emit_kernel(lowered, {}, {}).source;
    EXPECT_NE(s.find(fmt::format("Sm90Compute<evtc::device::{}, float, float,", info.cuda_functor)),
              std::string::npos)
        << info.name;
    EXPECT_NE(s.find(fmt::format("// {}\nusing V", info.name)), std::string::npos) << info.name;
  }
}

TEST(Sm90Emitter, OpParametersArePassedAsArguments) {
  const std::string s = emit("out D: bf16 = leaky_relu(acc, alpha=0.25)").source;
  const std::string args = section(s, "typename Callbacks::Arguments fusion_arguments", "}", true);
  EXPECT_NE(args.find("::Arguments{float(0.25)}"), std::string::npos) << args;
}

// The host code keeps the kernel's Params of the last calls per thread and, when a call's
// arguments are the same (the scalar fields, the workspace, the device, and the contents of
// the pointer and scalar tables), launches with them instead of building them again.
TEST(Sm90Emitter, HostCodeReusesTheParamsOfARepeatedCall) {
  const auto k = emit("out D: bf16 = acc * s[m] + beta * bias[n]; out r = row_sum(acc)");
  const std::string& s = k.source;
  EXPECT_NE(s.find(fmt::format("constexpr int kPointerSlots = {};", k.signature.pointers.size())),
            std::string::npos);
  EXPECT_NE(s.find(fmt::format("constexpr int kScalarSlots = {};", k.signature.scalars.size())),
            std::string::npos);
  ASSERT_EQ(k.signature.scalars.size(), 1u);
  const std::string run = section(s, "int evtc_run(", "}", true);
  EXPECT_NE(run.find("thread_local LaunchCache cache;"), std::string::npos) << run;
  EXPECT_NE(run.find("same_call(c, *a, workspace, device)"), std::string::npos) << run;
  EXPECT_NE(run.find("prepare(*e, kernel, *a, workspace, device, s)"), std::string::npos) << run;
  EXPECT_NE(run.find("launch(*e, kernel, s)"), std::string::npos) << run;
  // Stream-K's tile counters are set up again for every launch, cached or not.
  EXPECT_NE(run.find("GemmKernel::initialize_workspace(e->args, workspace, s, nullptr)"), std::string::npos) << run;
  // The comparison covers every field of evtc_gemm_args but the two table pointers, whose
  // contents it compares instead.
  const std::string same = section(s, "bool same_call(", "}", true);
  for (const char* field : {"m", "n", "k", "a", "b", "c", "d", "lda", "ldb", "ldc", "ldd", "sm_count",
                            "raster", "swizzle", "scale_a", "scale_b", "ld_scale_a", "scale_a_m_stride",
                            "scale_b_k_stride", "scale_b_n_stride"})
    EXPECT_NE(same.find(fmt::format("k.{0} == a.{0}", field)), std::string::npos) << field << "\n" << same;
  EXPECT_NE(same.find("std::memcmp(e.ptrs, a.ptrs, sizeof(void*) * kPointerSlots)"), std::string::npos);
  EXPECT_NE(same.find("std::memcmp(e.scalars, a.scalars, sizeof(double) * kScalarSlots)"), std::string::npos);
  EXPECT_NE(same.find("e.workspace == workspace"), std::string::npos);
  EXPECT_NE(same.find("e.device == device"), std::string::npos);
  // Params are built once, by CUTLASS's own functions, and the launch names the cluster.
  const std::string prepare = section(s, "cutlass::Status prepare(", "}", true);
  EXPECT_NE(prepare.find("GemmKernel::to_underlying_arguments(e.args, workspace)"), std::string::npos);
  EXPECT_NE(prepare.find("std::memcpy(e.ptrs, a.ptrs, sizeof(void*) * kPointerSlots)"), std::string::npos);
  EXPECT_NE(s.find("cudaLaunchAttributeClusterDimension"), std::string::npos);
  EXPECT_EQ(s.find("gemm.initialize("), std::string::npos);
}

// Only sm90's CUTLASS headers: no umbrella header that includes every architecture's
// builders and kernels (they cost nvcc seconds of parsing per kernel).
TEST(Sm90Emitter, IncludesOnlyTheSm90PartsOfCutlass) {
  const std::string bf16 = emit("out D: bf16 = acc").source;
  for (const char* umbrella : {"cutlass/gemm/collective/collective_builder.hpp",
                               "cutlass/gemm/kernel/gemm_universal.hpp",
                               "cutlass/gemm/device/gemm_universal_adapter.h"})
    EXPECT_EQ(bf16.find(umbrella), std::string::npos) << umbrella;
  EXPECT_NE(bf16.find("#include <cutlass/gemm/collective/builders/sm90_gmma_builder.inl>"), std::string::npos);
  EXPECT_EQ(bf16.find("sm90_mma_tma_gmma_ss_warpspecialized_fp8.hpp"), std::string::npos);
  KernelConfig coop;
  coop.schedule = MainloopSchedule::cooperative;
  KernelConfig pingpong;
  pingpong.schedule = MainloopSchedule::pingpong;
  pingpong.tile_n = 128;
  const std::string c = emit("out D: bf16 = acc", {}, coop).source;
  const std::string p = emit("out D: bf16 = acc", {}, pingpong).source;
  EXPECT_NE(c.find("sm90_gemm_tma_warpspecialized_cooperative.hpp"), std::string::npos);
  EXPECT_EQ(c.find("sm90_gemm_tma_warpspecialized_pingpong.hpp"), std::string::npos);
  EXPECT_NE(p.find("sm90_gemm_tma_warpspecialized_pingpong.hpp"), std::string::npos);
  EXPECT_EQ(p.find("sm90_gemm_tma_warpspecialized_cooperative.hpp"), std::string::npos);
  GemmDesc fp8;
  fp8.a_dtype = fp8.b_dtype = DType::f8e4m3;
  fp8.b_layout = Layout::col_major;
  EXPECT_NE(emit("out D: bf16 = acc", fp8).source.find("sm90_mma_tma_gmma_ss_warpspecialized_fp8.hpp"),
            std::string::npos);
}

// fp8's default two-level main loop runs as evtc's overlapped promotion where its third set of
// accumulators fits (cooperative 128x128, ping-pong 64x128); wider tiles, fast accumulation and a
// given promotion interval keep CUTLASS's own loop, and 16-bit kernels never include it.
TEST(Sm90Emitter, Fp8TwoLevelMainLoopOverlapsItsPromotionsWhereThreeAccumulatorSetsFit) {
  GemmDesc fp8;
  fp8.a_dtype = fp8.b_dtype = DType::f8e4m3;
  fp8.b_layout = Layout::col_major;
  const std::string wrapper =
      "using CollectiveMainloop = evtc::device::Sm90Fp8OverlappedPromotion<BuiltCollectiveMainloop>;";
  const std::string header = "#include \"evtc/device/sm90_fp8_mainloop.cuh\"";
  auto config = [](const std::string& name) { return *KernelConfig::parse(name); };
  for (const char* name : {"coop_128x128x128_c1x1_persistent", "pingpong_64x128x128_c1x1_persistent",
                           "coop_128x64x128_c1x1_streamk", "pingpong_64x32x128_c1x1_persistent_swap"}) {
    const std::string s = emit("out D: bf16 = acc * sa[m] * sb[n]", fp8, config(name)).source;
    EXPECT_NE(s.find(wrapper), std::string::npos) << name;
    EXPECT_NE(s.find(header), std::string::npos) << name;
    EXPECT_TRUE(overlapped_fp8_promotion(config(name), fp8)) << name;
  }
  for (const char* name : {"coop_128x192x128_c1x1_persistent", "pingpong_128x128x128_c1x1_persistent",
                           "coop_128x128x128_c1x1_persistent_pk128", "coop_128x128x128_c1x1_persistent_fastacc"}) {
    const std::string s = emit("out D: bf16 = acc", fp8, config(name)).source;
    EXPECT_EQ(s.find(header), std::string::npos) << name;
    EXPECT_NE(s.find("using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<"),
              std::string::npos)
        << name;
    EXPECT_FALSE(overlapped_fp8_promotion(config(name), fp8)) << name;
  }
  GemmDesc fast = fp8;
  fast.fp8_fast_accum = true;
  EXPECT_FALSE(overlapped_fp8_promotion(config("coop_128x128x128_c1x1_persistent"), fast));
  GemmDesc blockwise = fp8;
  blockwise.fp8_blockwise = true;
  EXPECT_FALSE(overlapped_fp8_promotion(config("coop_128x128x128_c1x1_persistent"), blockwise));
  EXPECT_FALSE(overlapped_fp8_promotion(config("coop_128x128x64_c1x1_persistent"), GemmDesc{}));
  EXPECT_EQ(emit("out D: bf16 = acc").source.find(header), std::string::npos);
}

// CUTLASS's wgmma selector offers the widths that are not multiples of 64 or 96 only with
// CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED; without it a 112-wide tile runs as seven 16-wide wgmmas
// (twice the time on an H100). The define comes before the first CUTLASS include, and only where
// the tile needs it (other kernels' sources, and so their cache keys, stay as they were).
TEST(Sm90Emitter, TileWidthsOutsideCutlasssDefaultWgmmasEnableTheExtendedShapes) {
  const std::string define = "#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED 1";
  for (int width : {48, 80, 112, 144, 160, 208, 224, 240}) {
    KernelConfig c = KernelConfig::of(MainloopSchedule::pingpong, 128, width);
    const std::string s = emit("out D: bf16 = acc", {}, c).source;
    const size_t at = s.find(define);
    ASSERT_NE(at, std::string::npos) << width;
    EXPECT_LT(at, s.find("#include <cutlass/")) << width;
  }
  for (int width : {16, 32, 64, 96, 128, 192, 256}) {
    KernelConfig c = KernelConfig::of(MainloopSchedule::pingpong, 64, width);
    EXPECT_EQ(emit("out D: bf16 = acc", {}, c).source.find(define), std::string::npos) << width;
  }
}

// Every functor the emitters name exists in the device headers, with the right arity: a
// missing one would only show when nvcc compiles a kernel that uses the op.
TEST(Sm90Emitter, EveryFunctorIsDefinedInTheDeviceHeaders) {
  const std::string list = read_file(kIncludeDir / "evtc" / "device" / "op_list.inc");
  const std::string math = read_file(kIncludeDir / "evtc" / "device" / "math.cuh");
  const std::string ops = read_file(kIncludeDir / "evtc" / "device" / "ops.cuh");
  ASSERT_FALSE(list.empty());
  const char* macro[] = {"", "EVTC_UNARY_FN(", "EVTC_BINARY_FN(", "EVTC_TERNARY_FN("};
  for (const OpInfo& info : op_table()) {
    const std::string f(info.cuda_functor);
    if (info.num_attrs == 0) {
      ASSERT_GE(info.arity, 1);
      ASSERT_LE(info.arity, 3);
      EXPECT_NE(list.find(std::string("\n") + macro[info.arity] + f + ","), std::string::npos)
          << info.name << ": op_list.inc has no " << macro[info.arity] << f << ", ...)";
    } else {
      // Ops with parameters define their functors by hand.
      EXPECT_NE(math.find("struct " + f + "Fn {"), std::string::npos) << info.name;
      EXPECT_NE(ops.find("struct " + f + " {"), std::string::npos) << info.name;
    }
  }
  // Casts use the identity functor.
  EXPECT_NE(list.find("EVTC_UNARY_FN(Identity,"), std::string::npos);
}

}  // namespace
