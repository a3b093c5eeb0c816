#include "testing/random_epilogue.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "evtc/ops.hpp"
#include "frontend/functions.hpp"

namespace evtc::testing {

const char* kernel_kind_name(KernelKind k) {
  switch (k) {
    case KernelKind::dense: return "dense";
    case KernelKind::gated: return "gated";
    case KernelKind::fp8: return "fp8";
  }
  return "?";
}

namespace {
// The integer operands the generator uses, as they are written in expressions and declared.
constexpr std::pair<const char*, const char*> kIntegerOperands[] = {{"t0[m]", "input t0[m]: i32"},
                                                                    {"t1[n]", "input t1[n]: i64"}};

// The declarations of the integer operands `text` reads (undeclared, they would take the
// kernel's floating operand dtype).
std::vector<std::string> integer_declarations(std::string_view text) {
  std::vector<std::string> out;
  for (const auto& [use, declaration] : kIntegerOperands)
    if (text.find(use) != std::string_view::npos) out.emplace_back(declaration);
  return out;
}
}  // namespace

std::string RandomKernel::text() const {
  std::string t;
  for (const std::string& d : declarations) t += d + "\n";
  for (const RandomOutput& o : outputs) t += o.statement + "\n";
  return t;
}

std::string RandomKernel::text_of(size_t i) const {
  const std::string& statement = outputs.at(i).statement;
  std::string t;
  for (const std::string& d : integer_declarations(statement)) t += d + "\n";
  return t + statement + "\n";
}

std::string RandomKernel::cli_options() const {
  std::string o = fmt::format("--dtype {}", dtype_name(gemm.a_dtype));
  if (gemm.b_dtype != gemm.a_dtype) o += fmt::format(" --dtype-b {}", dtype_name(gemm.b_dtype));
  o += fmt::format(" --layout-a {} --layout-b {}", gemm.a_layout == Layout::row_major ? "r" : "c",
                   gemm.b_layout == Layout::row_major ? "r" : "c");
  return o;
}

EpilogueGenerator::EpilogueGenerator(uint64_t seed, GeneratorOptions options) : rng_(seed), options_(options) {}

std::string EpilogueGenerator::leaf(bool fp8) {
  (void)fp8;
  static const char* kConstants[] = {"0.5", "-1.25", "2", "0.75", "-3", "1.5"};
  static const char* kIntegers[] = {"1", "-1", "2", "-2", "3", "-3"};
  switch (uniform(0, 9)) {
    case 0: case 1: case 2: return "acc";
    case 3: return fmt::format("r{}[n]", uniform(0, 2));
    case 4: return fmt::format("c{}[m]", uniform(0, 1));
    case 5: return fmt::format("x{}[m,n]", uniform(0, 1));
    case 6: return fmt::format("s{}", uniform(0, 1));
    case 7: return options_.integers ? kIntegers[uniform(0, 5)] : kConstants[uniform(0, 5)];
    case 8: return index_leaf();
    default: return "acc";
  }
}

std::string EpilogueGenerator::index_comparison() {
  static const std::vector<std::string_view> kComparisons = [] {
    std::vector<std::string_view> ops;
    for (const OpInfo& o : op_table())
      if (o.comparison) ops.push_back(o.infix);
    return ops;
  }();
  // Half of them equalities: `n == t0[m]` is the one-hot mask of a row's label.
  const std::string_view op = coin(0.5) ? "==" : kComparisons[size_t(uniform(0, int(kComparisons.size()) - 1))];
  switch (uniform(0, 4)) {
    case 0: return fmt::format("(n {} t0[m])", op);
    case 1: return fmt::format("(m {} t1[n])", op);
    case 2: return fmt::format("(m {} n)", op);       // triangular masks
    case 3: return fmt::format("(n {} {})", op, uniform(0, 40));
    default: return fmt::format("(m {} {})", op, uniform(0, 40));
  }
}

std::string EpilogueGenerator::index_leaf() {
  if (options_.integers || coin(0.6)) return index_comparison();
  // Indices reach the hundreds: scaled, their products and exponentials stay in f32's range.
  static const char* kScaled[] = {"(m * 0.01)", "(n * 0.01)", "(t0[m] * 0.01)", "(t1[n] * 0.01)"};
  return kScaled[uniform(0, 3)];
}

// A value in an op argument's domain (evtc::Domain).
std::string EpilogueGenerator::guarded(int depth, bool fp8, uint8_t domain, bool comparison) {
  if (Domain(domain) == Domain::condition) {
    // Input values only (and acc, as where's condition, which is 0 almost nowhere): a computed
    // value near a comparison's threshold can land on either side in f32 and in fp64. Where's
    // condition is a comparison half the time.
    static const char* kInputs[] = {"x0[m,n]", "r0[n]", "c0[m]", "x1[m,n]"};
    if (!comparison) {
      if (coin(0.25)) return index_comparison();  // where(n == t0[m], ...): exact on both sides
      if (coin(0.5)) return uniform(0, 4) == 0 ? "acc" : kInputs[uniform(0, 3)];
      // The op table's comparison operators, in its order.
      static const std::vector<std::string_view> kComparisons = [] {
        std::vector<std::string_view> ops;
        for (const OpInfo& o : op_table())
          if (o.comparison) ops.push_back(o.infix);
        return ops;
      }();
      const char* rhs_const = options_.integers ? "1" : "0.5";
      return fmt::format("({} {} {})", kInputs[uniform(0, 3)], kComparisons[size_t(uniform(0, int(kComparisons.size()) - 1))],
                         coin(0.5) ? rhs_const : kInputs[uniform(0, 3)]);
    }
    return kInputs[uniform(0, 3)];
  }
  const std::string v = value(depth, fp8);
  switch (Domain(domain)) {
    case Domain::positive:
    case Domain::nonzero: return fmt::format("(abs({}) + 0.25)", v);
    case Domain::bounded: return fmt::format("(tanh({}) * 2)", v);
    case Domain::any:
    case Domain::condition: break;
  }
  return v;
}

std::string EpilogueGenerator::value(int depth, bool fp8) {
  if (depth <= 0 || coin(0.25)) return leaf(fp8);
  std::vector<const OpInfo*> ops;
  for (const OpInfo& o : op_table())
    if (!options_.integers || o.exact_on_integers) ops.push_back(&o);
  const OpInfo& op = *ops[size_t(uniform(0, int(ops.size()) - 1))];
  std::vector<std::string> args;
  for (int i = 0; i < op.arity; ++i)
    args.push_back(guarded(depth - 1, fp8, uint8_t(op.domains[size_t(i)]), op.comparison));
  std::string v;
  switch (op.op) {
    case Op::add: v = fmt::format("({} + {})", args[0], args[1]); break;
    case Op::sub: v = fmt::format("({} - {})", args[0], args[1]); break;
    case Op::mul: v = fmt::format("({} * {})", args[0], args[1]); break;
    case Op::div: v = fmt::format("({} / {})", args[0], args[1]); break;
    case Op::leaky_relu:
      v = coin(0.5) ? fmt::format("leaky_relu({})", args[0]) : fmt::format("leaky_relu({}, 0.2)", args[0]);
      break;
    default: {
      if (op.comparison) {  // written with its operator
        v = fmt::format("({} {} {})", args[0], op.infix, args[1]);
        break;
      }
      v = std::string(op.name) + "(";
      for (size_t i = 0; i < args.size(); ++i) v += (i ? ", " : "") + args[i];
      v += ")";
    }
  }
  // An intermediate rounding now and then (what a PyTorch graph's casts become).
  if (coin(0.08)) v = fmt::format("bf16({})", v);
  return v;
}

std::string EpilogueGenerator::output_dtype() {
  const int r = uniform(0, 9);
  return r < 7 ? "bf16" : r < 9 ? "f32" : "f16";
}

RandomKernel EpilogueGenerator::next() {
  RandomKernel k;
  const double pick = std::uniform_real_distribution<double>(0, 1)(rng_);
  k.kind = pick < options_.gated_share ? KernelKind::gated
           : pick < options_.gated_share + options_.fp8_share ? KernelKind::fp8
                                                              : KernelKind::dense;
  const bool fp8 = k.kind == KernelKind::fp8;
  auto with_acc = [](const std::string& v) { return v.find("acc") == std::string::npos ? "(" + v + ") + acc" : v; };
  if (k.kind == KernelKind::fp8) {
    k.gemm.a_dtype = k.gemm.b_dtype = DType::f8e4m3;
    k.gemm.a_layout = Layout::row_major;
    k.gemm.b_layout = Layout::col_major;
  } else {
    k.gemm.a_dtype = k.gemm.b_dtype = coin(0.8) ? DType::bf16 : DType::f16;
    k.gemm.a_layout = coin(0.85) ? Layout::row_major : Layout::col_major;
    k.gemm.b_layout = coin(0.5) ? Layout::row_major : Layout::col_major;
  }
  if (k.kind == KernelKind::gated) {
    // Not gate/up alone, except where only those and reglu are exact on integers.
    std::vector<const frontend::GatedFunctionInfo*> table;
    for (const auto& g : frontend::gated_function_table())
      if (options_.integers ? g.exact_on_integers
                            : g.fn != frontend::GatedFunction::gate && g.fn != frontend::GatedFunction::up)
        table.push_back(&g);
    const frontend::GatedFunctionInfo& f = *table[size_t(uniform(0, int(table.size()) - 1))];
    std::string call = fmt::format("{}({}", f.name, with_acc(value(uniform(0, options_.max_depth - 1), false)));
    if (!f.params.empty() && coin(0.5)) call += fmt::format(", alpha={}, limit={}", coin(0.5) ? 1.5 : 1.0, coin(0.5) ? 5 : 3);
    call += ")";
    k.outputs.push_back({"y", fmt::format("out y: {} = {}", output_dtype(), call), false});
    k.declarations = integer_declarations(k.text());
    return k;
  }
  const int outputs = uniform(std::clamp(options_.min_outputs, 1, std::max(1, options_.max_outputs)),
                              std::max(1, options_.max_outputs));
  for (int i = 0; i < outputs; ++i) {
    const std::string name = fmt::format("o{}", i);
    k.outputs.push_back(
        {name, fmt::format("out {}: {} = {}", name, output_dtype(), with_acc(value(uniform(1, options_.max_depth), fp8))),
         false});
  }
  if (!fp8 && coin(options_.reduction_share)) {
    // Every reduction of the reduction table over every axis.
    static const std::vector<std::string> reductions = [] {
      std::vector<std::string> names;
      for (ReduceAxis axis : {ReduceAxis::row, ReduceAxis::col, ReduceAxis::all})
        for (const ReduceOpInfo& r : reduce_op_table()) names.push_back(reduction_name(axis, r.op));
      return names;
    }();
    const int count = uniform(1, 2);
    for (int i = 0; i < count; ++i) {
      const std::string name = fmt::format("q{}", i);
      k.outputs.push_back({name,
                           fmt::format("out {} = {}({})", name, reductions[size_t(uniform(0, int(reductions.size()) - 1))],
                                       with_acc(value(uniform(0, 2), false))),
                           true});
    }
  }
  k.declarations = integer_declarations(k.text());
  return k;
}

}  // namespace evtc::testing
