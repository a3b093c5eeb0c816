// Tests of KernelSignature (the operand tables of a compiled kernel's C ABI) and of
// KernelConfig's names (src/runtime/signature.cpp).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "evtc/expression.hpp"
#include "evtc/graph.hpp"
#include "evtc/kernel_config.hpp"
#include "evtc/passes.hpp"
#include "evtc/runtime.hpp"
#include "runtime/bind.hpp"

using namespace evtc;
using nlohmann::json;

namespace {

KernelSignature signature(const std::string& expr) { return make_signature(run_pipeline(parse_expression(expr))); }

std::vector<std::string> names(const std::vector<OperandSlot>& slots) {
  std::vector<std::string> out;
  for (const auto& s : slots) out.push_back(s.name);
  return out;
}

const OperandSlot& slot(const std::vector<OperandSlot>& slots, const std::string& name) {
  for (const auto& s : slots)
    if (s.name == name) return s;
  ADD_FAILURE() << "no slot " << name;
  static const OperandSlot none;
  return none;
}

constexpr const char* kMixed = R"(
input q: f32 ptr
input C: f16
out z: f32 = acc * zz[m]
out D: bf16 = acc + bias[n] + q * a + C
out y = row_sum(acc * r[m,n] * b)
)";

// --- pointer and scalar tables ---------------------------------------------------------

TEST(Signature, PointersAreInputsThenOutputsInCanonicalOrder) {
  const KernelSignature sig = signature(kMixed);
  // Canonical order visits the outputs by name (D, y, z), each one's operands first.
  EXPECT_EQ(names(sig.pointers), (std::vector<std::string>{"bias", "q", "r", "zz", "y", "z"}));
  for (size_t i = 0; i < sig.pointers.size(); ++i) EXPECT_EQ(sig.pointers[i].is_output, i >= 4) << i;
  EXPECT_EQ(names(sig.scalars), (std::vector<std::string>{"a", "b"}));
}

TEST(Signature, OrderDoesNotDependOnHowTheGraphWasBuilt) {
  auto build = [](bool reversed) {
    Graph g;
    auto acc = g.accum();
    Value u, w;
    if (reversed) {
      w = g.col_vec("w", DType::f16);
      u = g.row_vec("u", DType::bf16);
    } else {
      u = g.row_vec("u", DType::bf16);
      w = g.col_vec("w", DType::f16);
    }
    auto beta = g.param("beta");
    auto alpha = g.param("alpha");
    if (reversed) {
      g.store("second", acc * w * beta, DType::f32);
      g.store("first", acc + u * alpha, DType::bf16);
    } else {
      g.store("first", acc + u * alpha, DType::bf16);
      g.store("second", acc * w * beta, DType::f32);
    }
    return make_signature(run_pipeline(g));
  };
  const KernelSignature a = build(false), b = build(true);
  EXPECT_EQ(names(a.pointers), names(b.pointers));
  EXPECT_EQ(names(a.scalars), names(b.scalars));
  EXPECT_EQ(a.d_name, b.d_name);
  EXPECT_EQ(a.to_json(), b.to_json());
  EXPECT_EQ(a.d_name, "first");
  EXPECT_EQ(names(a.pointers), (std::vector<std::string>{"u", "w", "second"}));
}

TEST(Signature, SlotsDescribeTheirBuffers) {
  const KernelSignature sig = signature(
      "input r[m,n]: f16 col_major\ninput q: bf16 ptr\n"
      "out D: bf16 = acc + r + bias[n] * q + s[m]\nout e: f32 = relu(acc)");
  const OperandSlot& r = slot(sig.pointers, "r");
  EXPECT_EQ(r.kind, NodeKind::aux);
  EXPECT_EQ(r.dtype, DType::f16);
  EXPECT_EQ(r.shape, Shape::full);
  EXPECT_EQ(r.layout, Layout::col_major);
  EXPECT_FALSE(r.is_output);
  const OperandSlot& bias = slot(sig.pointers, "bias");
  EXPECT_EQ(bias.kind, NodeKind::row_vec);
  EXPECT_EQ(bias.shape, Shape::row);
  EXPECT_EQ(bias.dtype, DType::bf16);
  const OperandSlot& s = slot(sig.pointers, "s");
  EXPECT_EQ(s.kind, NodeKind::col_vec);
  EXPECT_EQ(s.shape, Shape::col);
  const OperandSlot& q = slot(sig.pointers, "q");
  EXPECT_EQ(q.kind, NodeKind::scalar);
  EXPECT_EQ(q.scalar_kind, ScalarKind::pointer);
  EXPECT_EQ(q.shape, Shape::scalar);
  EXPECT_EQ(q.dtype, DType::bf16);
  const OperandSlot& e = slot(sig.pointers, "e");
  EXPECT_EQ(e.kind, NodeKind::store);
  EXPECT_TRUE(e.is_output);
  EXPECT_FALSE(e.is_reduction);
  EXPECT_EQ(e.dtype, DType::f32);
  EXPECT_EQ(e.shape, Shape::full);
}

TEST(Signature, ScalarsByValueAreSeparateAndConstantsAreNowhere) {
  const KernelSignature sig = signature("input p: f32 ptr\nout D: bf16 = acc * alpha * 3 + p");
  EXPECT_EQ(names(sig.scalars), std::vector<std::string>{"alpha"});
  EXPECT_EQ(sig.scalars[0].scalar_kind, ScalarKind::value);
  EXPECT_EQ(names(sig.pointers), std::vector<std::string>{"p"});
  const KernelSignature none = signature("out D: bf16 = acc * 3 + 1");
  EXPECT_TRUE(none.pointers.empty());
  EXPECT_TRUE(none.scalars.empty());
}

TEST(Signature, ReductionOutputsCarryTheirOperation) {
  const KernelSignature sig = signature(
      "x = acc * s[m]\nout D: bf16 = x\nout rs = row_sum(x)\nout cm: bf16 = col_max(x)\n"
      "out lo = min(x)\nout pk = amax(x)\nout extra: f16 = relu(x)");
  struct Expect {
    const char* name;
    ReduceOp op;
    Shape shape;
    DType dtype;
  };
  for (const Expect& e : {Expect{"rs", ReduceOp::sum, Shape::col, DType::f32},
                          Expect{"cm", ReduceOp::max, Shape::row, DType::bf16},
                          Expect{"lo", ReduceOp::min, Shape::scalar, DType::f32},
                          Expect{"pk", ReduceOp::amax, Shape::scalar, DType::f32}}) {
    const OperandSlot& s = slot(sig.pointers, e.name);
    EXPECT_TRUE(s.is_output) << e.name;
    EXPECT_TRUE(s.is_reduction) << e.name;
    EXPECT_EQ(s.reduce_op, e.op) << e.name;
    EXPECT_EQ(s.shape, e.shape) << e.name;
    EXPECT_EQ(s.dtype, e.dtype) << e.name;
  }
  EXPECT_FALSE(slot(sig.pointers, "extra").is_reduction);
  EXPECT_EQ(sig.d_name, "D");
}

// --- C and the main output -------------------------------------------------------------

TEST(Signature, ReadsCOnlyWhenTheEpilogueDoes) {
  const KernelSignature with = signature("input C: f16\nout D: bf16 = acc + C");
  EXPECT_TRUE(with.reads_c);
  EXPECT_EQ(with.c_dtype, DType::f16);
  const KernelSignature fp32 = signature("input C: f32\nout D: bf16 = acc + C");
  EXPECT_EQ(fp32.c_dtype, DType::f32);
  EXPECT_FALSE(signature("out D: bf16 = acc").reads_c);
  // C never takes a pointer slot: it has its own ABI field.
  for (const auto& s : with.pointers) EXPECT_NE(s.kind, NodeKind::source);
}

TEST(Signature, MainOutputIsDWhenThereIsOne) {
  const KernelSignature sig = signature("out a: f16 = acc\nout D: f32 = relu(acc)\nout b: bf16 = acc * 2");
  EXPECT_EQ(sig.d_name, "D");
  EXPECT_EQ(sig.d_dtype, DType::f32);
  EXPECT_EQ(names(sig.pointers), (std::vector<std::string>{"a", "b"}));
}

TEST(Signature, WithoutDTheMainOutputIsTheFirstFullOutputInCanonicalOrder) {
  const KernelSignature sig = signature("out zeta: f16 = acc\nout beta: f32 = relu(acc)");
  EXPECT_EQ(sig.d_name, "beta");
  EXPECT_EQ(sig.d_dtype, DType::f32);
  EXPECT_EQ(names(sig.pointers), std::vector<std::string>{"zeta"});
}

TEST(Signature, AReductionIsNeverTheMainOutput) {
  const KernelSignature sig = signature("out a = row_sum(acc)\nout z: f16 = acc");
  EXPECT_EQ(sig.d_name, "z");
  EXPECT_EQ(names(sig.pointers), std::vector<std::string>{"a"});
  const KernelSignature none = signature("out a = row_sum(acc)\nout b = sum(acc)");
  EXPECT_EQ(none.d_name, "");
  EXPECT_EQ(names(none.pointers), (std::vector<std::string>{"a", "b"}));
}

TEST(Signature, OnlyAnOutputNamedExactlyDIsD) {
  const KernelSignature sig = signature("out d: f16 = acc\nout Dx: bf16 = relu(acc)");
  EXPECT_EQ(sig.d_name, "Dx");  // canonical order: "Dx" < "d"
  EXPECT_EQ(names(sig.pointers), std::vector<std::string>{"d"});
}

// --- JSON ------------------------------------------------------------------------------

TEST(Signature, JsonListsTheTables) {
  const json j = json::parse(signature(kMixed).to_json());
  EXPECT_EQ(j.at("d"), "D");
  EXPECT_EQ(j.at("d_dtype"), "bf16");
  EXPECT_EQ(j.at("reads_c"), true);
  EXPECT_EQ(j.at("c_dtype"), "f16");
  ASSERT_EQ(j.at("pointers").size(), 6u);
  EXPECT_EQ(j["pointers"][0], (json{{"name", "bias"}, {"kind", "row_vec"}, {"dtype", "bf16"},
                                    {"shape", "[n]"}, {"output", false}}));
  EXPECT_EQ(j["pointers"][1], (json{{"name", "q"}, {"kind", "scalar"}, {"dtype", "f32"}, {"shape", "scalar"},
                                    {"output", false}, {"by_pointer", true}}));
  EXPECT_EQ(j["pointers"][2].at("shape"), "[m,n]");
  EXPECT_EQ(j["pointers"][3].at("shape"), "[m]");
  EXPECT_EQ(j["pointers"][4], (json{{"name", "y"}, {"kind", "store"}, {"dtype", "f32"}, {"shape", "[m]"},
                                    {"output", true}, {"reduce", "sum"}}));
  EXPECT_EQ(j["pointers"][5], (json{{"name", "z"}, {"kind", "store"}, {"dtype", "f32"}, {"shape", "[m,n]"},
                                    {"output", true}}));
  ASSERT_EQ(j.at("scalars").size(), 2u);
  EXPECT_EQ(j["scalars"][0], (json{{"name", "a"}, {"kind", "scalar"}, {"dtype", "f32"}, {"shape", "scalar"},
                                   {"output", false}, {"by_pointer", false}}));
}

TEST(Signature, JsonOmitsCAndDWhenAbsent) {
  const json j = json::parse(signature("out total = sum(acc)").to_json());
  EXPECT_EQ(j.at("reads_c"), false);
  EXPECT_FALSE(j.contains("c_dtype"));
  EXPECT_EQ(j.at("d"), "");
  EXPECT_FALSE(j.contains("d_dtype"));
  EXPECT_EQ(j.at("scalars"), json::array());
  ASSERT_EQ(j.at("pointers").size(), 1u);
  EXPECT_EQ(j["pointers"][0].at("reduce"), "sum");
  EXPECT_EQ(j["pointers"][0].at("shape"), "scalar");
}

// --- KernelConfig names ----------------------------------------------------------------

// Which index an epilogue reads (the runtime refuses M or N above 2^24 for it); the JSON says
// so only where one is read, so that the signatures of other kernels are as they were.
TEST(Signature, RecordsTheIndicesItReadsAndIntegerOperands) {
  const KernelSignature both = signature("input t[m]: i32\nout D: bf16 = acc * (n == t[m]) + m");
  EXPECT_TRUE(both.reads_row_index);
  EXPECT_TRUE(both.reads_col_index);
  EXPECT_EQ(slot(both.pointers, "t").dtype, DType::i32);
  const json j = json::parse(both.to_json());
  EXPECT_EQ(j["index"], json::array({"m", "n"}));
  EXPECT_EQ(j["pointers"][0]["dtype"], "i32");
  const KernelSignature cols = signature("out D: bf16 = acc * (n < 8)");
  EXPECT_FALSE(cols.reads_row_index);
  EXPECT_TRUE(cols.reads_col_index);
  const KernelSignature none = signature("out D: bf16 = acc + bias[n]");
  EXPECT_FALSE(none.reads_row_index || none.reads_col_index);
  EXPECT_FALSE(json::parse(none.to_json()).contains("index"));
}

// Binding refuses a problem whose index an epilogue reads past f32's exact integers, before it
// looks at any device pointer.
TEST(Signature, BindingRefusesIndicesPastTwoToThe24) {
  const KernelSignature sig = signature("out D: bf16 = acc * (m < 8)");
  GemmDesc gemm;
  gemm.b_layout = Layout::row_major;
  runtime::PointerChecks pointers;
  auto bind = [&](int64_t m, int64_t n) {
    Arguments args;
    static char fake[1];
    args.a(TensorRef::matrix(fake, DType::bf16, m, 8));
    args.b(TensorRef::matrix(fake, DType::bf16, 8, n));
    try {
      runtime::bind_arguments(sig, gemm, args, pointers);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("(bound)");
  };
  EXPECT_EQ(bind(int64_t(1) << 25, 64),
            "M=33554432 is too large for the epilogue's row index 'm': indices are f32 values, exact up to 16777216 "
            "(2^24)");
  // N is not read as an index here: a wide N passes this check (and fails later, at the fake
  // pointers, not for its size).
  EXPECT_EQ(bind(64, int64_t(1) << 25).find("too large"), std::string::npos);
}

TEST(SignatureKernelConfig, DefaultName) {
  EXPECT_EQ(KernelConfig{}.name(), "coop_128x256x64_c2x1_persistent");
}

TEST(SignatureKernelConfig, NameAndParseRoundTrip) {
  std::vector<KernelConfig> configs;
  for (auto schedule : {MainloopSchedule::cooperative, MainloopSchedule::pingpong})
    for (auto scheduler : {TileSchedulerKind::persistent, TileSchedulerKind::stream_k})
      for (bool precise : {false, true}) {
        const int i = static_cast<int>(configs.size());
        KernelConfig c;
        c.tile_m = schedule == MainloopSchedule::cooperative ? 128 + 128 * (i % 2) : 64 << (i % 3);
        c.tile_n = 256 >> (i % 3);
        c.tile_k = precise ? 128 : 32;
        c.cluster_m = 1 + i % 2;
        c.cluster_n = 1 << (i % 3);
        if (schedule == MainloopSchedule::pingpong && scheduler == TileSchedulerKind::stream_k) continue;
        c.schedule = schedule;
        c.scheduler = scheduler;
        c.precise_math = precise;
        configs.push_back(c);
      }
  for (const KernelConfig& c : configs) {
    const auto parsed = KernelConfig::parse(c.name());
    ASSERT_TRUE(parsed.has_value()) << c.name();
    EXPECT_EQ(*parsed, c) << c.name();
    EXPECT_EQ(parsed->name(), c.name());
  }
  KernelConfig c;
  c.schedule = MainloopSchedule::pingpong;
  c.tile_m = 64;
  c.tile_n = 128;
  c.cluster_m = 1;
  c.scheduler = TileSchedulerKind::stream_k;
  c.precise_math = true;
  EXPECT_EQ(c.name(), "pingpong_64x128x64_c1x1_streamk_precise");
  // A name, but not a configuration CUTLASS's sm90 kernels can be built with.
  EXPECT_FALSE(KernelConfig::parse(c.name()).has_value());
}

TEST(SignatureKernelConfig, ParseRejectsConfigurationsCutlassCannotBuild) {
  for (const char* bad : {"pingpong_128x128x64_c1x1_streamk",     // ping-pong has no stream-K
                          "coop_64x256x64_c1x1_persistent",       // cooperative needs 128+ rows
                          "coop_0x0x0_c0x0_persistent", "coop_128x248x64_c1x1_persistent",
                          "coop_128x8x64_c1x1_persistent", "coop_128x272x64_c1x1_persistent",
                          "pingpong_64x128x64_c1x1_splitk2",       // nor split-K
                          "coop_128x128x64_c1x1_splitk1", "coop_128x128x64_c1x1_splitk17",
                          "coop_128x128x64_c1x1_splitk02",
                          "coop_128x256x64_c3x1_persistent", "coop_128x256x16_c1x1_persistent",
                          "coop_99999999999x256x64_c2x1_persistent"})
    EXPECT_FALSE(KernelConfig::parse(bad).has_value()) << bad;
  EXPECT_TRUE(KernelConfig::parse("coop_128x128x64_c1x2_streamk").has_value());
  EXPECT_TRUE(KernelConfig::parse("pingpong_64x128x64_c1x1_persistent").has_value());
  // 192 columns (a wgmma's N), but not 192 rows (two warp groups of 96).
  EXPECT_TRUE(KernelConfig::parse("pingpong_128x192x64_c2x1_persistent").has_value());
  EXPECT_TRUE(KernelConfig::parse("coop_256x192x64_c2x1_persistent").has_value());
  EXPECT_FALSE(KernelConfig::parse("coop_192x192x64_c2x1_persistent").has_value());
  // Any multiple of 16 columns up to 256 (so the last wave can be filled), and split-K.
  for (const char* good : {"pingpong_64x16x128_c1x1_persistent", "pingpong_64x48x128_c1x2_persistent",
                           "coop_128x240x64_c1x1_persistent", "coop_256x160x64_c2x1_persistent"})
    EXPECT_TRUE(KernelConfig::parse(good).has_value()) << good;
  const auto split = KernelConfig::parse("coop_128x128x64_c1x1_splitk4");
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(split->scheduler, TileSchedulerKind::stream_k);
  EXPECT_EQ(split->splits, 4);
  EXPECT_EQ(split->name(), "coop_128x128x64_c1x1_splitk4");
}

TEST(SignatureKernelConfig, ParseRejectsWhatIsNotAName) {
  for (const char* bad : {"", "coop", "default", "coop_128x256x64_c2x1", "coop_128x256x64_c2x1_persistent_",
                          "coop_128x256x64_c2x1_persistent_precise_precise", "Coop_128x256x64_c2x1_persistent",
                          "coop_128x256_c2x1_persistent", "coop_128x256x64x1_c2x1_persistent",
                          "coop_128x256x64_c2_persistent", "coop_128x256x64_c2x1_stream_k",
                          "cooperative_128x256x64_c2x1_persistent", " coop_128x256x64_c2x1_persistent",
                          "coop_128x256x64_c2x1_persistent\n", "coop_-128x256x64_c2x1_persistent",
                          "coop_128x256x64_c2x1_precise", "coop_abcx256x64_c2x1_persistent"})
    EXPECT_FALSE(KernelConfig::parse(bad).has_value()) << '"' << bad << '"';
}

}  // namespace
