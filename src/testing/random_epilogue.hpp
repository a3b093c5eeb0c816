// Random epilogues for differential testing (`evtc fuzz`, the property tests): expression text,
// so that every case is reproducible as one line, built from the op table (names, arities and
// each argument's domain), the reductions and the gated functions.
//
// A RandomKernel packs several independent random outputs into one kernel (up to the fused
// output limit), so that one nvcc compile tests many expressions; each output also has a
// standalone expression that reproduces it alone.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "evtc/gemm.hpp"

namespace evtc::testing {

enum class KernelKind : uint8_t {
  dense,  // bf16/f16 A and B, [m,n] outputs and reductions
  gated,  // one gated output (N -> N/2) over a random [m,n] value
  fp8,    // e4m3 A and B (K-major), f32 operands, [m,n] outputs
};
const char* kernel_kind_name(KernelKind k);

struct RandomOutput {
  std::string name;
  std::string statement;  // "out o3: bf16 = silu(acc + r0[n]) * s1"
  bool reduction = false;
};

struct RandomKernel {
  KernelKind kind = KernelKind::dense;
  GemmDesc gemm;  // dtypes and layouts (sizes 0)
  std::vector<RandomOutput> outputs;
  // `input` declarations of the integer operands the outputs read ("input t0[m]: i32").
  std::vector<std::string> declarations;
  // The whole epilogue: the declarations, then every output's statement, one per line.
  std::string text() const;
  // The epilogue of output i alone (with the declarations it needs).
  std::string text_of(size_t i) const;
  // `evtc run` options for its dtypes and layouts ("--dtype f8e4m3 --layout-b c").
  std::string cli_options() const;
};

struct GeneratorOptions {
  int min_outputs = 1, max_outputs = 8;  // [m,n] outputs per dense kernel (1..8)
  int max_depth = 4;       // nesting of ops in one output
  double gated_share = 0.15, fp8_share = 0.1, reduction_share = 0.15;
  // Only ops and gated functions that are exact on integers (the op table's column), and
  // integer constants: with integer-valued inputs (random_integer_inputs) every value is an
  // integer the device computes exactly, so results must match the reference bit for bit.
  bool integers = false;
};

class EpilogueGenerator {
 public:
  explicit EpilogueGenerator(uint64_t seed, GeneratorOptions options = {});
  RandomKernel next();

 private:
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool coin(double p) { return std::bernoulli_distribution(p)(rng_); }
  std::string leaf(bool fp8);
  // An index term: a comparison of the indices m and n with each other, with an integer operand
  // (t0[m]: i32, a column per row; t1[n]: i64, a row per column) or with a constant.
  std::string index_comparison();
  // A leaf made of the indices: a 0/1 mask (index_comparison) or, with non-integer inputs, an
  // index or integer operand scaled to about unit size.
  std::string index_leaf();
  std::string value(int depth, bool fp8);
  std::string guarded(int depth, bool fp8, uint8_t domain, bool comparison = false);
  std::string output_dtype();

  std::mt19937_64 rng_;
  GeneratorOptions options_;
};

}  // namespace evtc::testing
