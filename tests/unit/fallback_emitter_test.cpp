// Tests of the plain CUDA epilogue used on the unfused path (src/backends/cuda). The source is
// checked line by line here; kernel_cache_test.cpp compiles one with nvcc, and the GPU suite
// runs them.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cuda/fallback_emitter.hpp"
#include "evtc/expression.hpp"
#include "evtc/graph.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/kernel_config.hpp"
#include "evtc/passes.hpp"

using namespace evtc;

namespace {

struct Emitted {
  Graph graph;
  KernelSignature sig;
  std::string source;
};

Emitted emit_graph(const Graph& parsed) {
  Emitted e;
  e.graph = run_pipeline(parsed);
  e.sig = make_signature(e.graph);
  e.source = cuda::emit_fallback_kernel(e.graph, e.sig);
  return e;
}

Emitted emit(const std::string& expr) { return emit_graph(parse_expression(expr)); }

// The statements of the per-element loop of the epilogue kernel, one per line, unindented.
std::vector<std::string> body_lines(const std::string& source) {
  const std::string begin = "    (void)i; (void)j;\n";
  const size_t b = source.find(begin);
  const size_t e = source.find("\n  }\n", b);
  std::vector<std::string> lines;
  if (b == std::string::npos || e == std::string::npos) {
    ADD_FAILURE() << "no epilogue loop in\n" << source;
    return lines;
  }
  std::istringstream in(source.substr(b + begin.size(), e - b - begin.size()));
  for (std::string line; std::getline(in, line);) {
    EXPECT_EQ(line.rfind("    ", 0), 0u) << "not indented as the loop body: " << line;
    lines.push_back(line.substr(line.find_first_not_of(' ')));
  }
  return lines;
}

// The statements of the evtc_plain_init_reductions kernel that set the fp32 accumulators to their
// identity (finish=false), or of evtc_plain_finish_reductions that write the outputs (finish=true).
std::vector<std::string> init_lines(const std::string& source, bool finish = false) {
  std::vector<std::string> lines;
  std::istringstream in(source);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("  for (int64_t t = tid; ", 0) == 0 &&
        (line.find("from_float") != std::string::npos) == finish)
      lines.push_back(line.substr(2));
  return lines;
}

size_t count_matching(const std::vector<std::string>& lines, const std::string& what) {
  size_t n = 0;
  for (const auto& l : lines) n += l.find(what) != std::string::npos;
  return n;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

size_t slot_of(const KernelSignature& sig, const std::string& name) {
  for (size_t i = 0; i < sig.pointers.size(); ++i)
    if (sig.pointers[i].name == name) return i;
  ADD_FAILURE() << "no pointer slot " << name;
  return 0;
}

NodeId node_named(const Graph& g, NodeKind kind, const std::string& name) {
  for (NodeId id = 0; id < g.size(); ++id)
    if (g.node(id).kind == kind && g.node(id).name == name) return id;
  ADD_FAILURE() << "no " << node_kind_name(kind) << " node " << name << " in\n" << print(g);
  return 0;
}

// Every kind of load, compute, cast and output in one epilogue.
constexpr const char* kEverything = R"(
input p: f32 ptr
input C: f16
input r[m,n]: f16 col_major
x = acc * s[m] + bias[n] + C * p + r + v
out D: bf16 = leaky_relu(x, 0.2)
out e: f32 col_major = bf16(x)
out rs = row_sum(x)
out cm = col_max(x)
out t = min(x)
out a = amax(x)
)";

TEST(FallbackEmitter, OneStatementPerNode) {
  const Emitted k = emit(kEverything);
  const auto body = body_lines(k.source);
  size_t expected_lines = 0;
  for (NodeId id = 0; id < k.graph.size(); ++id) {
    const Node& n = k.graph.node(id);
    const std::string v = fmt::format("v{}", id);
    switch (n.kind) {
      case NodeKind::reduce:  // computed by its store's statement
        EXPECT_EQ(count_matching(body, "const float " + v + " ="), 0u) << k.graph.describe(id);
        break;
      case NodeKind::store: {
        ++expected_lines;
        if (k.graph.node(n.inputs[0]).kind == NodeKind::reduce) break;  // see the Reductions test
        const std::string target = n.name == k.sig.d_name
                                       ? std::string("p.d)")
                                       : fmt::format("p.ptrs[{}])", slot_of(k.sig, n.name));
        EXPECT_EQ(count_matching(body, target), 1u) << k.graph.describe(id) << "\n" << joined(body);
        break;
      }
      default:
        ++expected_lines;
        EXPECT_EQ(count_matching(body, "const float " + v + " = "), 1u)
            << k.graph.describe(id) << "\n" << joined(body);
    }
  }
  EXPECT_EQ(body.size(), expected_lines) << joined(body);
  // Each value is defined before it is used.
  for (size_t i = 0; i < body.size(); ++i) {
    static const std::regex use(R"(\bv(\d+)\b)");
    const std::string& line = body[i];
    const size_t eq = line.find(" = ");
    const std::string rhs = line.substr(eq == std::string::npos ? 0 : eq);
    for (std::sregex_iterator it(rhs.begin(), rhs.end(), use), end; it != end; ++it) {
      const std::string def = "const float " + it->str() + " = ";
      bool before = false;
      for (size_t j = 0; j < i; ++j) before |= body[j].rfind(def, 0) == 0;
      EXPECT_TRUE(before) << it->str() << " used before its definition:\n" << joined(body);
    }
  }
}

TEST(FallbackEmitter, LoadsReadTheirOperandWithTheRightIndex) {
  const Emitted k = emit(kEverything);
  const std::string body = joined(body_lines(k.source));
  const auto& g = k.graph;
  auto has = [&](const std::string& line) {
    EXPECT_NE(body.find(line + "\n"), std::string::npos) << "missing: " << line << "\nin\n" << body;
  };
  has(fmt::format("const float v{} = acc_sum(acc, i * n + j, part_stride);", node_named(g, NodeKind::accum, "")));
  has(fmt::format("const float v{} = to_float(static_cast<const __nv_bfloat16*>(p.ptrs[{}])[i]);",
                  node_named(g, NodeKind::col_vec, "s"), slot_of(k.sig, "s")));
  has(fmt::format("const float v{} = to_float(static_cast<const __nv_bfloat16*>(p.ptrs[{}])[j]);",
                  node_named(g, NodeKind::row_vec, "bias"), slot_of(k.sig, "bias")));
  has(fmt::format("const float v{} = to_float(static_cast<const __half*>(p.c)[i * p.ldc + j]);",
                  node_named(g, NodeKind::source, "")));
  has(fmt::format("const float v{} = to_float(*static_cast<const float*>(p.ptrs[{}]));",
                  node_named(g, NodeKind::scalar, "p"), slot_of(k.sig, "p")));
  has(fmt::format("const float v{} = to_float(static_cast<const __half*>(p.ptrs[{}])[j * m + i]);",
                  node_named(g, NodeKind::aux, "r"), slot_of(k.sig, "r")));
  ASSERT_EQ(k.sig.scalars.size(), 1u);
  // By-value scalars are rounded to their dtype, as the fused kernel and the reference do.
  has(fmt::format("const float v{} = to_float(from_float<float>(p.scalars[0]));", node_named(g, NodeKind::scalar, "v")));

  const Emitted row = emit("out D: bf16 = acc + r[m,n] * 2 + 0.5");
  const std::string row_body = joined(body_lines(row.source));
  EXPECT_NE(row_body.find("(p.ptrs[0])[i * n + j]);"), std::string::npos) << row_body;
  EXPECT_NE(row_body.find(" = 2.0f;"), std::string::npos) << row_body;
  EXPECT_NE(row_body.find(" = 0.5f;"), std::string::npos) << row_body;
}

// m and n are the thread's own row and column; integer operands convert with float(), not
// through the floating types' to_float.
TEST(FallbackEmitter, IndexLeavesAreTheElementsCoordinatesAndIntegerOperandsConvert) {
  const Emitted k = emit("input t[m]: i32\ninput q[n]: i64\nout D: bf16 = acc * (n == t[m]) + m - q[n]");
  const std::string body = joined(body_lines(k.source));
  NodeId index_m = 0, index_n = 0;
  for (NodeId id = 0; id < k.graph.size(); ++id)
    if (k.graph.node(id).kind == NodeKind::index)
      (k.graph.node(id).index_axis == IndexAxis::m ? index_m : index_n) = id;
  EXPECT_NE(body.find(fmt::format("const float v{} = float(i);\n", index_m)), std::string::npos) << body;
  EXPECT_NE(body.find(fmt::format("const float v{} = float(j);\n", index_n)), std::string::npos) << body;
  EXPECT_NE(body.find(fmt::format("const float v{} = float(static_cast<const int32_t*>(p.ptrs[{}])[i]);\n",
                                  node_named(k.graph, NodeKind::col_vec, "t"), slot_of(k.sig, "t"))),
            std::string::npos)
      << body;
  EXPECT_NE(body.find(fmt::format("const float v{} = float(static_cast<const int64_t*>(p.ptrs[{}])[j]);\n",
                                  node_named(k.graph, NodeKind::row_vec, "q"), slot_of(k.sig, "q"))),
            std::string::npos)
      << body;
}

// Before gate()/up(), n is the column of the full-width value: each lane of a (gate, up) pair
// reads its own column (j0, j1), and m is the row of both.
TEST(FallbackEmitter, TheColumnIndexOfAGatedEpilogueIsTheFullWidthColumn) {
  const Emitted k = emit("out y: bf16 = swiglu(acc * (n < 64)) * m");
  NodeId index_m = 0, index_n = 0;
  for (NodeId id = 0; id < k.graph.size(); ++id)
    if (k.graph.node(id).kind == NodeKind::index)
      (k.graph.node(id).index_axis == IndexAxis::m ? index_m : index_n) = id;
  EXPECT_NE(k.source.find(fmt::format("const float v{}_0 = float(j0);\n", index_n)), std::string::npos) << k.source;
  EXPECT_NE(k.source.find(fmt::format("const float v{}_1 = float(j1);\n", index_n)), std::string::npos) << k.source;
  EXPECT_NE(k.source.find(fmt::format("const float v{}_0 = float(i);\n", index_m)), std::string::npos) << k.source;
}

TEST(FallbackEmitter, OutputsAreWrittenInTheirDtypeAndLayout) {
  const Emitted k = emit(kEverything);
  const std::string body = joined(body_lines(k.source));
  const auto& g = k.graph;
  const NodeId d = node_named(g, NodeKind::store, "D"), e = node_named(g, NodeKind::store, "e");
  EXPECT_NE(body.find(fmt::format("static_cast<__nv_bfloat16*>(p.d)[i * p.ldd + j] = "
                                  "from_float<__nv_bfloat16>(v{});\n",
                                  g.node(d).inputs[0])),
            std::string::npos)
      << body;
  EXPECT_NE(body.find(fmt::format("static_cast<float*>(p.ptrs[{}])[j * m + i] = from_float<float>(v{});\n",
                                  slot_of(k.sig, "e"), g.node(e).inputs[0])),
            std::string::npos)
      << body;
  // The explicit bf16 rounding before the f32 output.
  const NodeId cast = g.node(e).inputs[0];
  ASSERT_EQ(g.node(cast).kind, NodeKind::cast) << print(g);
  EXPECT_NE(body.find(fmt::format("const float v{} = to_float(from_float<__nv_bfloat16>(v{}));\n", cast,
                                  g.node(cast).inputs[0])),
            std::string::npos)
      << body;

  const Emitted extra = emit("out D: f16 = acc\nout q: f8e4m3 = relu(acc)\nout w: f8e5m2 = acc * 2");
  const std::string extra_body = joined(body_lines(extra.source));
  EXPECT_NE(extra_body.find("static_cast<__half*>(p.d)[i * p.ldd + j] = from_float<__half>("),
            std::string::npos)
      << extra_body;
  EXPECT_NE(extra_body.find(fmt::format("static_cast<__nv_fp8_e4m3*>(p.ptrs[{}])[i * n + j] = "
                                        "from_float<__nv_fp8_e4m3>(",
                                        slot_of(extra.sig, "q"))),
            std::string::npos)
      << extra_body;
  EXPECT_NE(extra_body.find(fmt::format("static_cast<__nv_fp8_e5m2*>(p.ptrs[{}])[i * n + j] = "
                                        "from_float<__nv_fp8_e5m2>(",
                                        slot_of(extra.sig, "w"))),
            std::string::npos)
      << extra_body;
}

TEST(FallbackEmitter, ComputeNodesCallTheDeviceFunctors) {
  for (const OpInfo& info : op_table()) {
    Graph g;
    std::vector<Value> in = {g.accum(), g.row_vec("bias", DType::bf16), g.col_vec("scale", DType::bf16)};
    in.resize(static_cast<size_t>(info.arity));
    std::vector<double> attrs(info.attr_defaults.begin(), info.attr_defaults.begin() + info.num_attrs);
    g.store("D", g.compute(info.op, in, attrs), DType::bf16);
    const Emitted k = emit_graph(g);
    NodeId id = 0;
    bool found = false;
    for (NodeId i = 0; i < k.graph.size(); ++i)
      if (k.graph.node(i).kind == NodeKind::compute && k.graph.node(i).op == info.op) {
        id = i;
        found = true;
      }
    ASSERT_TRUE(found) << info.name << " did not survive the pipeline:\n" << print(k.graph);
    std::string args;
    for (NodeId operand : k.graph.node(id).inputs) args += fmt::format("{}v{}", args.empty() ? "" : ", ", operand);
    const std::string call = fmt::format("const float v{} = evtc::device::{}Fn{{}}({}", id, info.cuda_functor, args);
    const auto body = body_lines(k.source);
    ASSERT_EQ(count_matching(body, call), 1u) << info.name << "\n" << joined(body);
    // Parameters follow the operands.
    for (const auto& line : body)
      if (line.rfind(call, 0) == 0)
        EXPECT_EQ(line.substr(call.size()), info.num_attrs == 0 ? ");" : ", 0.01f);") << info.name;
  }
}

TEST(FallbackEmitter, OpParametersAreLiterals) {
  const std::string body = joined(body_lines(emit("out D: bf16 = leaky_relu(acc, alpha=0.25)").source));
  EXPECT_NE(body.find("evtc::device::LeakyReluFn{}(v0, 0.25f);"), std::string::npos) << body;
}

TEST(FallbackEmitter, ReductionsAccumulateAtomicallyFromTheirIdentity) {
  const Emitted k = emit(R"(
x = acc * s[m]
out D: bf16 = x
out r_sum = row_sum(x)
out r_max = row_max(x)
out r_min = row_min(x)
out r_amax = row_amax(x)
out c_sum = col_sum(x)
out c_amax = col_amax(x)
out total = sum(x)
out hi = max(x)
out lo = min(x)
out peak = amax(x)
)");
  EXPECT_NE(k.source.find("constexpr bool kHasReductions = true;\n"), std::string::npos);
  const auto inits = init_lines(k.source);
  const auto body = body_lines(k.source);
  const std::string zero = "0.0f", neg_inf = "__int_as_float(0xff800000)", pos_inf = "__int_as_float(0x7f800000)";
  struct Case {
    const char* name;
    const char* count;  // elements set to the identity
    std::string identity;
    const char* atomic;
    const char* index;
    bool abs;
  };
  const Case cases[] = {
      {"r_sum", "m", zero, "atomicAdd", "i", false},
      {"r_max", "m", neg_inf, "atomic_max_float", "i", false},
      {"r_min", "m", pos_inf, "atomic_min_float", "i", false},
      {"r_amax", "m", zero, "atomic_max_float", "i", true},
      {"c_sum", "n", zero, "atomicAdd", "j", false},
      {"c_amax", "n", zero, "atomic_max_float", "j", true},
      {"total", "1", zero, "atomicAdd", "0", false},
      {"hi", "1", neg_inf, "atomic_max_float", "0", false},
      {"lo", "1", pos_inf, "atomic_min_float", "0", false},
      {"peak", "1", zero, "atomic_max_float", "0", true},
  };
  ASSERT_EQ(inits.size(), std::size(cases)) << joined(inits);
  const auto finishes = init_lines(k.source, true);
  ASSERT_EQ(finishes.size(), std::size(cases)) << joined(finishes);
  const NodeId x = node_named(k.graph, NodeKind::store, "D");
  const std::string value = fmt::format("v{}", k.graph.node(x).inputs[0]);
  std::set<std::string> accumulators;
  for (const Case& c : cases) {
    const size_t slot = slot_of(k.sig, c.name);
    EXPECT_TRUE(k.sig.pointers[slot].is_reduction) << c.name;
    // The finishing statement names the fp32 accumulator this output is reduced into.
    const std::string head = fmt::format("for (int64_t t = tid; t < {}; t += stride) static_cast<float*>(p.ptrs[{}])[t] = "
                                         "from_float<float>(",
                                         c.count, slot);
    std::string accumulator;
    for (const auto& f : finishes)
      if (f.rfind(head, 0) == 0) accumulator = f.substr(head.size(), f.size() - head.size() - std::string("[t]);").size());
    ASSERT_FALSE(accumulator.empty()) << c.name << "\n" << joined(finishes);
    EXPECT_EQ(accumulator.rfind("(p.scratch + ", 0), 0u) << accumulator;
    EXPECT_TRUE(accumulators.insert(accumulator).second) << "two outputs share " << accumulator;
    EXPECT_EQ(count_matching(inits, fmt::format("for (int64_t t = tid; t < {}; t += stride) {}[t] = {};", c.count,
                                                accumulator, c.identity)),
              1u)
        << c.name << "\n" << joined(inits);
    const std::string operand = c.abs ? "fabsf(" + value + ")" : value;
    if (std::string(c.count) != "1") {
      EXPECT_EQ(count_matching(body, fmt::format("{}({} + {}, {});", c.atomic, accumulator, c.index, operand)), 1u)
          << c.name << "\n" << joined(body);
      continue;
    }
    // Whole-matrix reductions: a per-thread accumulator from the identity, reduced over the
    // warp, one atomic per warp.
    const std::string r = fmt::format("red{}", slot);
    const std::string op = std::string(c.atomic) == "atomicAdd" ? "{} + {}"
                           : std::string(c.atomic) == "atomic_min_float" ? "fminf({}, {})"
                                                                         : "fmaxf({}, {})";
    EXPECT_EQ(count_matching(body, fmt::format("{} = {};", r, fmt::format(fmt::runtime(op), r, operand))), 1u)
        << c.name << "\n" << joined(body);
    EXPECT_NE(k.source.find(fmt::format("  float {} = {};\n", r, c.identity)), std::string::npos) << c.name;
    EXPECT_NE(k.source.find(fmt::format("{} = {};", r, fmt::format(fmt::runtime(op), r,
                                                                  "__shfl_xor_sync(0xffffffffu, " + r + ", o)"))),
              std::string::npos)
        << c.name;
    EXPECT_NE(k.source.find(fmt::format("if ((threadIdx.x & 31) == 0) {}({}, {});", c.atomic, accumulator, r)),
              std::string::npos)
        << c.name;
    EXPECT_EQ(count_matching(body, fmt::format("{}({}", c.atomic, accumulator)), 0u)
        << c.name << ": an atomic per element";
  }
  // The scratch holds every accumulator: 4 rows (m), 2 columns (n), 4 scalars.
  const size_t at = k.source.find("  return size_t(0");
  ASSERT_NE(at, std::string::npos);
  const std::string sum = k.source.substr(at, k.source.find('\n', at) - at);
  auto terms = [&](const std::string& t) {
    size_t c = 0;
    for (size_t p = sum.find(" + " + t); p != std::string::npos; p = sum.find(" + " + t, p + 1)) ++c;
    return c;
  };
  EXPECT_EQ(terms("m"), 4u) << sum;
  EXPECT_EQ(terms("n"), 2u) << sum;
  EXPECT_EQ(terms("1"), 4u) << sum;
}

TEST(FallbackEmitter, NoReductionsNoInitialisation) {
  const Emitted k = emit("out D: bf16 = relu(acc)\nout pre: f32 = acc");
  EXPECT_NE(k.source.find("constexpr bool kHasReductions = false;\n"), std::string::npos);
  EXPECT_TRUE(init_lines(k.source).empty()) << joined(init_lines(k.source));
}

TEST(FallbackEmitter, TableSizesMatchTheSignature) {
  for (const char* expr : {kEverything, "out D: bf16 = acc",
                           "input q: f32 ptr\nout D: bf16 = acc * a * b * q + bias[n]\nout s = sum(acc)"}) {
    const Emitted k = emit(expr);
    EXPECT_NE(k.source.find(fmt::format("\nconstexpr int kNumPtrs = {};\n", k.sig.pointers.size())), std::string::npos)
        << expr;
    EXPECT_NE(k.source.find(fmt::format("\nconstexpr int kNumScalars = {};\n", k.sig.scalars.size())), std::string::npos)
        << expr;
  }
  const Emitted k = emit("input q: f32 ptr\nout D: bf16 = acc * a * b * q + bias[n]\nout s = sum(acc)");
  EXPECT_EQ(k.sig.pointers.size(), 3u);  // q, bias, s
  EXPECT_EQ(k.sig.scalars.size(), 2u);   // a, b
}

TEST(FallbackEmitter, ExportsTheSignatureAndTheRunEntryPoint) {
  const Emitted k = emit("out D: bf16 = acc + bias[n]");
  std::string escaped;
  for (char c : k.sig.to_json()) escaped += c == '"' ? std::string("\\\"") : std::string(1, c);
  EXPECT_NE(k.source.find("const char* evtc_kernel_signature(void) { return \"" + escaped + "\"; }"),
            std::string::npos);
  EXPECT_NE(k.source.find("int evtc_fallback_run(const evtc_gemm_args* a, const float* acc, float* scratch, void* stream)"),
            std::string::npos);
  EXPECT_NE(k.source.find("// Graph hash " + graph_hash_hex(k.graph) + "."), std::string::npos);
  // Plain CUDA: no CUTLASS header.
  EXPECT_EQ(k.source.find("cutlass"), std::string::npos);
}

}  // namespace
