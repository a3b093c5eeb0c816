// The fp64 reference interpreter: evaluates a Graph on the CPU, one whole array per node.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "evtc/error.hpp"
#include "evtc/gemm.hpp"
#include "evtc/reference.hpp"
#include "reference/gemm.hpp"
#include "reference/parallel.hpp"

namespace evtc {
namespace {

// A node's value: 1, n, m, m×n or m×n/2 doubles (row-major) for shapes scalar, row, col,
// full, half.
struct Array {
  Shape shape = Shape::scalar;
  std::vector<double> data;
};

struct Extent {
  int64_t m, n;
  int64_t rows(Shape s) const {
    return s == Shape::col || s == Shape::full || s == Shape::half ? m : 1;
  }
  int64_t cols(Shape s) const {
    return s == Shape::row || s == Shape::full ? n : s == Shape::half ? n / 2 : 1;
  }
  size_t size(Shape s) const { return static_cast<size_t>(rows(s) * cols(s)); }
};

// Where element (i, j) of a broadcast result lives in an operand of shape s: i * row + j * col.
struct Strides {
  int64_t row, col;
  Strides(Shape s, int64_t n)
      : row(s == Shape::full ? n : s == Shape::half ? n / 2 : s == Shape::col ? 1 : 0),
        col(s == Shape::row || s == Shape::full || s == Shape::half ? 1 : 0) {}
};

// --- input validation --------------------------------------------------------------------

std::string operand_signature(const Node& n) {
  return fmt::format("{} {}{}", node_kind_name(n.kind), dtype_name(n.dtype), shape_name(n.shape));
}

std::string expected_length_text(Shape s, const Extent& e) {
  switch (s) {
    case Shape::scalar: return "1 (a scalar)";
    case Shape::row: return fmt::format("n={}", e.n);
    case Shape::col: return fmt::format("m={}", e.m);
    case Shape::full: return fmt::format("m*n={}", e.m * e.n);
    case Shape::half: return fmt::format("m*n/2={}", e.m * (e.n / 2));
  }
  return "?";
}

bool reads_named_operand(const Node& n) {
  return n.is_load() && n.kind != NodeKind::source &&
         !(n.kind == NodeKind::scalar && n.scalar_kind == ScalarKind::constant);
}

// Nodes that some output depends on; only these are evaluated and need inputs.
std::vector<char> live_nodes(const Graph& g) {
  std::vector<char> live(g.size(), 0);
  std::vector<NodeId> stack(g.outputs().begin(), g.outputs().end());
  while (!stack.empty()) {
    const NodeId id = stack.back();
    stack.pop_back();
    if (live[id]) continue;
    live[id] = 1;
    for (NodeId in : g.node(id).inputs) stack.push_back(in);
  }
  return live;
}

void check_length(std::string_view what, size_t got, size_t expected, std::string_view expected_text) {
  if (got != expected)
    throw UserError(fmt::format("{} has {} value{}, expected {}", what, got, got == 1 ? "" : "s",
                                expected_text));
}

void check_inputs(const Graph& g, const std::vector<char>& live, const ReferenceInputs& in) {
  if (in.m <= 0 || in.n <= 0)
    throw UserError(fmt::format("problem size m={}, n={}: m and n must be positive", in.m, in.n));
  for (NodeId id = 0; id < g.size(); ++id)
    if (live[id] && g.node(id).kind == NodeKind::pair && in.n % 2 != 0)
      throw UserError(fmt::format(
          "problem size n={} is odd, but the epilogue takes interleaved (gate, up) column "
          "pairs ({})",
          in.n, g.describe(id)));
  const Extent e{in.m, in.n};
  const size_t mn = e.size(Shape::full);
  for (NodeId id = 0; id < g.size(); ++id) {
    if (!live[id]) continue;
    const Node& node = g.node(id);
    if (node.kind == NodeKind::accum) {
      if (!in.acc.empty()) {
        check_length("acc", in.acc.size(), mn, fmt::format("m*n={}", mn));
        continue;
      }
      if (in.k <= 0)
        throw UserError(fmt::format(
            "problem size k={}: k must be positive to compute A@B (or give acc)", in.k));
      check_length("A", in.a.size(), static_cast<size_t>(in.m * in.k),
                   fmt::format("m*k={}", in.m * in.k));
      check_length("B", in.b.size(), static_cast<size_t>(in.k * in.n),
                   fmt::format("k*n={}", in.k * in.n));
    } else if (node.kind == NodeKind::source) {
      if (in.c.empty())
        throw UserError(fmt::format("the graph reads C ({}) but C was not given",
                                    operand_signature(node)));
      check_length("C", in.c.size(), mn, fmt::format("m*n={}", mn));
    } else if (reads_named_operand(node)) {
      const auto it = in.operands.find(node.name);
      if (it == in.operands.end())
        throw UserError(fmt::format("operand '{}' ({}) was not given", node.name,
                                    operand_signature(node)));
      check_length(fmt::format("operand '{}'", node.name), it->second.size(), e.size(node.shape),
                   expected_length_text(node.shape, e));
    }
  }
}

// --- node evaluation ---------------------------------------------------------------------

Array rounded(Shape shape, std::span<const double> values, DType dtype) {
  Array r{shape, std::vector<double>(values.size())};
  for (size_t i = 0; i < values.size(); ++i) r.data[i] = round_to(dtype, values[i]);
  return r;
}

// A@B of fp8 block-scaled operands: every element of A and B times its block's scale (exact
// in fp64: an fp8 value times an f32 scale has at most 28 significant bits), then the product.
std::vector<double> block_scaled_gemm(const ReferenceInputs& in) {
  const int64_t m = in.m, n = in.n, k = in.k, kb = fp8_scale_blocks(k), nb = fp8_scale_blocks(n);
  if (in.scale_a.size() != size_t(m * kb) || in.scale_b.size() != size_t(kb * nb))
    throw UserError(fmt::format("block scales: scale_a has {} values and scale_b {}, expected {} (m × ceil(k/128)) "
                                "and {} (ceil(k/128) × ceil(n/128))",
                                in.scale_a.size(), in.scale_b.size(), m * kb, kb * nb));
  std::vector<double> a(in.a), b(in.b);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < k; ++l) a[i * k + l] *= in.scale_a[i * kb + l / kFp8ScaleBlock];
  for (int64_t l = 0; l < k; ++l)
    for (int64_t j = 0; j < n; ++j) b[l * n + j] *= in.scale_b[(l / kFp8ScaleBlock) * nb + j / kFp8ScaleBlock];
  return reference::gemm_f64(a, b, m, n, k);
}

Array load(const Node& node, const ReferenceInputs& in, const ReferenceOptions& options) {
  switch (node.kind) {
    case NodeKind::accum:
      if (!in.acc.empty())
        return options.round_compute ? rounded(Shape::full, in.acc, DType::f32)
                                     : Array{Shape::full, in.acc};
      {
        Array r{Shape::full, in.scale_a.empty() ? reference::gemm_f64(in.a, in.b, in.m, in.n, in.k)
                                                : block_scaled_gemm(in)};
        if (options.round_compute)
          for (double& v : r.data) v = round_to(DType::f32, v);
        return r;
      }
    case NodeKind::index: {
      // 0, 1, 2, ...: the row index down an [m] value, the column index along an [n] value.
      Array r{node.shape, std::vector<double>(Extent{in.m, in.n}.size(node.shape))};
      for (size_t i = 0; i < r.data.size(); ++i) r.data[i] = double(i);
      return r;
    }
    case NodeKind::source: return rounded(Shape::full, in.c, node.dtype);
    case NodeKind::scalar:
      if (node.scalar_kind == ScalarKind::constant) return Array{Shape::scalar, {node.value}};
      [[fallthrough]];
    default: {
      Array r = rounded(node.shape, in.operands.at(node.name), node.dtype);
      // An integer operand enters arithmetic as the f32 value nearest it, as on the device.
      if (is_integer(node.dtype))
        for (double& v : r.data) v = round_to(DType::f32, v);
      return r;
    }
  }
}

// ±1 for (seed, node, element): ReferenceOptions::perturb's signs.
double perturb_sign(uint64_t seed, NodeId node, size_t i) {
  uint64_t z = seed ^ (uint64_t(node) << 40) ^ uint64_t(i);  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (z ^ (z >> 31)) & 1 ? 1.0 : -1.0;
}

// perturb_sign, negated under ReferenceOptions::perturb_mirror.
double signed_perturbation(const ReferenceOptions& options, uint64_t seed, NodeId node, size_t i) {
  return options.perturb_mirror ? -perturb_sign(seed, node, i) : perturb_sign(seed, node, i);
}

void perturb(Array& a, NodeId node, const ReferenceOptions& options) {
  if (options.perturb == 0) return;
  for (size_t i = 0; i < a.data.size(); ++i)
    a.data[i] *= 1.0 + options.perturb * signed_perturbation(options, options.perturb_seed, node, i);
}

void perturb_accumulator(Array& a, NodeId node, const ReferenceOptions& options) {
  if (options.perturb_accumulator == 0) return;
  double sq = 0;
  for (double v : a.data) sq += std::isfinite(v) ? v * v : 0.0;
  const double step = options.perturb_accumulator * std::sqrt(sq / double(std::max<size_t>(1, a.data.size())));
  // Within a step of 0 the zero-ness flips (0 becomes ±step, a value within a step becomes 0):
  // a device sum that cancels may end exactly at 0 where fp64's does not, or the other way,
  // and a `where` on it then takes the other branch.
  // Away from 0 the step goes the way perturb() moved the value (v·(1 + perturb·s) moves by
  // sign(v)·s), so that the two models of the device's error add up rather than cancel on half
  // of the elements.
  for (size_t i = 0; i < a.data.size(); ++i) {
    double& v = a.data[i];
    const double s = signed_perturbation(options, options.perturb_seed ^ 0xacc, node, i);
    if (v == 0.0) v = step * s;
    else if (std::fabs(v) <= step) v = 0.0;
    else if (options.perturb != 0)
      v += step * std::copysign(1.0, v) * signed_perturbation(options, options.perturb_seed, node, i);
    else v += step * s;
  }
}

Array compute(const Node& node, std::span<const Array* const> args, const Extent& e,
              bool round_result) {
  const OpInfo& info = op_info(node.op);
  EVTC_INTERNAL_ASSERT(static_cast<int>(args.size()) == info.arity, "compute arity");
  std::array<Strides, 3> strides{Strides(Shape::scalar, e.n), Strides(Shape::scalar, e.n),
                                 Strides(Shape::scalar, e.n)};
  for (size_t a = 0; a < args.size(); ++a) strides[a] = Strides(args[a]->shape, e.n);
  const std::span<const double> attrs(node.attrs.data(), static_cast<size_t>(info.num_attrs));
  const int64_t cols = e.cols(node.shape);
  Array r{node.shape, std::vector<double>(e.size(node.shape))};
  reference::for_row_blocks(e.rows(node.shape), cols * info.cost, [&](int64_t i0, int64_t i1) {
    std::array<double, 3> x{};
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        for (size_t a = 0; a < args.size(); ++a)
          x[a] = args[a]->data[static_cast<size_t>(i * strides[a].row + j * strides[a].col)];
        const double v = info.cpu(std::span<const double>(x.data(), args.size()), attrs);
        r.data[static_cast<size_t>(i * cols + j)] = round_result ? round_to(node.dtype, v) : v;
      }
  });
  return r;
}

// The gate (even) or up (odd) columns of an m×n value.
Array select_pairs(const Node& node, const Array& x, const Extent& e) {
  EVTC_INTERNAL_ASSERT(x.shape == Shape::full, "gate/up of a value that is not [m,n]");
  const int64_t half = e.n / 2, first = node.part == PairPart::gate ? 0 : 1;
  Array r{Shape::half, std::vector<double>(static_cast<size_t>(e.m * half))};
  for (int64_t i = 0; i < e.m; ++i)
    for (int64_t j = 0; j < half; ++j) r.data[i * half + j] = x.data[i * e.n + 2 * j + first];
  return r;
}

// Reduces an m×n value in fp64; every output sums its inputs in increasing index order.
Array reduce(const Node& node, const Array& x, const Extent& e) {
  EVTC_INTERNAL_ASSERT(x.shape == Shape::full, "reduction of a broadcast value");
  Array r{node.shape, std::vector<double>(e.size(node.shape), reduce_op_info(node.reduce_op).identity)};
  const auto step = reduce_op_info(node.reduce_op).step;
  switch (node.axis) {
    case ReduceAxis::row:  // over n: one value per row
      for (int64_t i = 0; i < e.m; ++i)
        for (int64_t j = 0; j < e.n; ++j) r.data[i] = step(r.data[i], x.data[i * e.n + j]);
      break;
    case ReduceAxis::col:  // over m: one value per column, rows streamed in order
      for (int64_t i = 0; i < e.m; ++i)
        for (int64_t j = 0; j < e.n; ++j) r.data[j] = step(r.data[j], x.data[i * e.n + j]);
      break;
    case ReduceAxis::all:
      for (double v : x.data) r.data[0] = step(r.data[0], v);
      break;
  }
  return r;
}

}  // namespace

ReferenceOutputs evaluate_reference(const Graph& g, const ReferenceInputs& inputs,
                                    const ReferenceOptions& options) {
  const std::vector<char> live = live_nodes(g);
  check_inputs(g, live, inputs);
  const Extent e{inputs.m, inputs.n};

  // Intermediate arrays are released after their last use: an m×n fp64 array is 8·m·n bytes.
  std::vector<int> uses_left(g.size(), 0);
  for (NodeId id = 0; id < g.size(); ++id)
    if (live[id])
      for (NodeId in : g.node(id).inputs) ++uses_left[in];

  std::vector<Array> values(g.size());
  ReferenceOutputs outputs;
  // Node ids are a topological order: Graph::add accepts only operands that already exist.
  for (NodeId id = 0; id < g.size(); ++id) {
    if (!live[id]) continue;
    const Node& node = g.node(id);
    std::array<const Array*, 3> args{};
    for (size_t a = 0; a < node.inputs.size(); ++a) {
      EVTC_INTERNAL_ASSERT(node.inputs[a] < id, "graph is not in topological order");
      args[a] = &values[node.inputs[a]];
    }
    switch (node.kind) {
      case NodeKind::compute:
        values[id] = compute(node, std::span(args.data(), node.inputs.size()), e,
                             options.round_compute);
        perturb(values[id], id, options);
        break;
      case NodeKind::cast: values[id] = rounded(args[0]->shape, args[0]->data, node.dtype); break;
      case NodeKind::reduce: values[id] = reduce(node, *args[0], e); break;
      case NodeKind::pair: values[id] = select_pairs(node, *args[0], e); break;
      case NodeKind::store:
        outputs[node.name] = options.unrounded_outputs ? args[0]->data
                                                       : rounded(args[0]->shape, args[0]->data, node.dtype).data;
        break;
      default:
        values[id] = load(node, inputs, options);
        if (node.kind == NodeKind::accum) {
          perturb(values[id], id, options);
          perturb_accumulator(values[id], id, options);
        }
        break;
    }
    for (NodeId in : node.inputs)
      if (--uses_left[in] == 0) values[in] = Array{};
  }
  return outputs;
}

}  // namespace evtc
