#include "passes/legality.hpp"

#include <fmt/format.h>

#include "evtc/arch.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/kernel_config.hpp"

namespace evtc {
namespace {

constexpr int kAccessBytes = 16;  // TMA and vectorised epilogue accesses move 16 bytes
// [m,n] outputs each stage their tiles in shared memory (TMA stores); reductions need none
// beyond a few registers, so they are counted apart.
constexpr size_t kMaxMatrixOutputs = 8;
constexpr size_t kMaxReductions = 16;

int elements_per_access(DType t) { return kAccessBytes / dtype_bytes(t); }

class LegalityChecker {
 public:
  LegalityChecker(const Graph& g, const GemmDesc& gemm) : g_(g), gemm_(gemm) {}

  Legality run(const std::map<std::string, OperandView>& views) {
    check_target();
    check_operand_types();
    check_main_loop_alignment('A', gemm_.a_dtype, gemm_.a_layout == Layout::row_major, 'M');
    check_main_loop_alignment('B', gemm_.b_dtype, gemm_.b_layout == Layout::col_major, 'N');
    check_epilogue(views);
    return std::move(result_);
  }

 private:
  void refuse(std::string reason) { result_.reasons.push_back(std::move(reason)); }

  int64_t extent(char dim) const {
    return dim == 'M' ? gemm_.m : dim == 'N' ? gemm_.n : gemm_.k;
  }

  // `dim` (unknown when 0) must hold whole 16-byte accesses of `dtype`.
  void check_multiple(char dim, DType dtype, const std::string& needs) {
    const int64_t size = extent(dim);
    const int per_access = elements_per_access(dtype);
    if (size != 0 && size % per_access != 0)
      refuse(fmt::format("{}={} is not a multiple of {} ({})", dim, size, per_access, needs));
  }

  void check_target() {
    if (std::string why = arch_refusal(gemm_.sm); !why.empty()) {
      refuse(std::move(why));
      return;
    }
    // What this architecture's backend cannot fuse (evtc/arch.hpp's table).
    const DType a = gemm_.a_dtype;
    const ArchFeatures& f = backend_features(gemm_.sm, a);
    const auto arch_lacks = [&](int arch, std::string_view what) { return evtc::arch_lacks(arch, what, a); };
    if ((a == DType::bf16 || a == DType::f16) && !f.sixteen_bit)
      refuse(arch_lacks(gemm_.sm, fmt::format("{} A and B (CUTLASS 4.2's kernels for it multiply fp8, fp6 and fp4 "
                                              "only)",
                                              dtype_name(a))));
    if (is_fp8(a) && !f.fp8) refuse(arch_lacks(gemm_.sm, "fp8 A and B"));
    if (gemm_.fp8_blockwise && !f.fp8_blockwise) refuse(arch_lacks(gemm_.sm, "block-scaled fp8 (fp8_blockwise)"));
    // The store CUTLASS's collective epilogue writes as D (KernelSignature::d_name).
    const std::string main_output = f.aux_tensors ? "" : make_signature(g_).d_name;
    for (NodeId id : canonical_order(g_)) {
      const Node& n = g_.node(id);
      if (n.kind == NodeKind::store && n.shape == Shape::half && !f.gated)
        refuse(arch_lacks(gemm_.sm, fmt::format("gated [m,n/2] outputs ('{}': evtc's half-width store node "
                                                "is not built for this backend's epilogue)",
                                                n.name)));
      if (n.kind == NodeKind::store && g_.node(n.inputs[0]).kind == NodeKind::reduce && !f.reductions)
        refuse(arch_lacks(gemm_.sm, fmt::format("reductions ('{}': evtc's partial-result nodes are not built "
                                                "for this backend's epilogue)",
                                                n.name)));
      if (n.kind == NodeKind::index && !f.indices)
        refuse(arch_lacks(gemm_.sm, fmt::format("the index '{}' (evtc's index node is not built for this backend's "
                                                "epilogue)",
                                                index_axis_name(n.index_axis))));
      if ((n.kind == NodeKind::row_vec || n.kind == NodeKind::col_vec) && is_integer(n.dtype) && !f.indices)
        refuse(arch_lacks(gemm_.sm, fmt::format("integer operands ('{}' is {}{})", n.name, dtype_name(n.dtype),
                                                shape_name(n.shape))));
      if (n.kind == NodeKind::aux && !f.aux_tensors)
        refuse(arch_lacks(gemm_.sm, fmt::format("[m,n] operands ('{}')", n.name)));
      if (n.kind == NodeKind::aux && f.aux_tensors && !f.column_major_mn && n.layout == Layout::col_major)
        refuse(arch_lacks(gemm_.sm, fmt::format("column-major [m,n] operands ('{}': its epilogue reads them in "
                                                "16-byte vectors along N; pass it row-major)",
                                                n.name)));
      if (n.kind == NodeKind::store && n.shape == Shape::full && g_.node(n.inputs[0]).kind != NodeKind::reduce &&
          !f.aux_tensors && n.name != main_output)
        refuse(arch_lacks(gemm_.sm, fmt::format("[m,n] outputs besides the main one ('{}')", n.name)));
    }
  }


  void check_operand_types() {
    const DType a = gemm_.a_dtype, b = gemm_.b_dtype;
    for (auto [name, t] : {std::pair{'A', a}, std::pair{'B', b}})
      if (!is_tensor_core_input(t))
        refuse(fmt::format("{} is {}, which sm90 tensor cores do not take (A and B must be {})", name,
                           dtype_name(t), or_list(tensor_core_input_names())));
    if (!is_tensor_core_input(a) || !is_tensor_core_input(b)) return;
    if (dtype_bits(a) != dtype_bits(b))
      refuse(fmt::format("A is {} ({}-bit) and B is {} ({}-bit): A and B must have the same "
                         "width",
                         dtype_name(a), dtype_bits(a), dtype_name(b), dtype_bits(b)));
    else if (dtype_bits(a) == 16 && a != b)
      refuse(fmt::format("A is {} and B is {}: 16-bit A and B must be the same type",
                         dtype_name(a), dtype_name(b)));
    if (is_fp8(a) || is_fp8(b)) {
      if (gemm_.a_layout != Layout::row_major)
        refuse("fp8 A and B must both be K-major (A row-major, B column-major), but A is "
               "column-major");
      if (gemm_.b_layout != Layout::col_major)
        refuse("fp8 A and B must both be K-major (A row-major, B column-major), but B is "
               "row-major");
    }
  }

  // A K-major operand's contiguous dimension is K; otherwise it is M (for A) or N (for B).
  void check_main_loop_alignment(char name, DType dtype, bool k_major, char other_dim) {
    if (!is_tensor_core_input(dtype)) return;
    if (k_major)
      check_multiple('K', dtype,
                     fmt::format("{} {} needs 16-byte {}", dtype_name(dtype), name,
                                 name == 'A' ? "rows" : "columns"));
    else
      check_multiple(other_dim, dtype,
                     fmt::format("{} {} is {} and needs 16-byte {}", dtype_name(dtype), name,
                                 name == 'A' ? "column-major" : "row-major",
                                 name == 'A' ? "columns" : "rows"));
  }

  // A full M×N access: N must hold whole accesses for row-major, M for column-major.
  void check_matrix_alignment(DType dtype, Layout layout, const std::string& what) {
    if (layout == Layout::row_major)
      check_multiple('N', dtype, fmt::format("{} {} needs 16-byte rows", dtype_name(dtype), what));
    else
      check_multiple('M', dtype, fmt::format("column-major {} {} needs 16-byte columns",
                                             dtype_name(dtype), what));
  }

  void check_epilogue(const std::map<std::string, OperandView>& views) {
    size_t matrices = 0, reductions = 0;
    for (NodeId id : g_.outputs())
      ++(g_.node(g_.node(id).inputs[0]).kind == NodeKind::reduce ? reductions : matrices);
    if (matrices > kMaxMatrixOutputs)
      refuse(fmt::format("the epilogue has {} [m,n] outputs; at most {} can be fused",
                         matrices, kMaxMatrixOutputs));
    if (reductions > kMaxReductions)
      refuse(fmt::format("the epilogue has {} reduction outputs; at most {} can be fused",
                         reductions, kMaxReductions));
    if (std::string why = depth_refusal(g_); !why.empty()) refuse(std::move(why));
    // Canonical order, so the reasons do not depend on the order the graph was built in.
    for (NodeId id : canonical_order(g_)) {
      const Node& n = g_.node(id);
      switch (n.kind) {
        case NodeKind::store:
          if (g_.node(n.inputs[0]).kind == NodeKind::reduce) break;
          if (n.shape == Shape::half) {
            // Written element by element from registers (evtc's Sm90HalfStore): no access
            // width to align, but the (gate, up) pairs must be whole.
            if (gemm_.n % 2 != 0)
              refuse(fmt::format("N={} is odd, but the gated output '{}' needs whole "
                                 "(gate, up) column pairs",
                                 gemm_.n, n.name));
            break;
          }
          check_matrix_alignment(n.dtype, n.layout, fmt::format("output '{}'", n.name));
          if (n.layout == Layout::col_major)
            refuse(fmt::format("output '{}' is column-major, and evtc's fused kernels store "
                               "row-major outputs only",
                               n.name));
          break;
        case NodeKind::row_vec:
          check_multiple('N', n.dtype, fmt::format("{} row vector '{}' needs 16-byte alignment",
                                                   dtype_name(n.dtype), n.name));
          break;
        case NodeKind::col_vec:
          check_multiple('M', n.dtype,
                         fmt::format("{} column vector '{}' needs 16-byte alignment",
                                     dtype_name(n.dtype), n.name));
          break;
        case NodeKind::aux: {
          check_matrix_alignment(n.dtype, n.layout, fmt::format("operand '{}'", n.name));
          auto view = views.find(n.name);
          std::string why;
          if (view != views.end() &&
              classify_view(view->second, gemm_.m, gemm_.n, &why) == LoadClass::not_fusable)
            refuse(fmt::format("operand '{}' cannot be fused: {}", n.name, why));
          break;
        }
        case NodeKind::source:
          check_matrix_alignment(n.dtype, Layout::row_major, "source C");
          break;
        default: break;
      }
    }
  }

  const Graph& g_;
  const GemmDesc& gemm_;
  Legality result_;
};

}  // namespace

size_t epilogue_depth(const Graph& g) {
  // Inputs have lower ids than their users, so one pass in id order sees inputs first.
  std::vector<size_t> depth(g.size(), 0);
  size_t deepest = 0;
  for (NodeId id = 0; id < g.size(); ++id) {
    const Node& n = g.node(id);
    size_t d = 0;
    for (NodeId in : n.inputs) d = std::max(d, depth[in]);
    depth[id] = n.inputs.empty() || n.kind == NodeKind::store ? d : d + 1;
    deepest = std::max(deepest, depth[id]);
  }
  return deepest;
}

std::string depth_refusal(const Graph& g) {
  const size_t d = epilogue_depth(g);
  if (d <= kMaxEpilogueDepth) return "";
  return fmt::format("the epilogue chains {} operations from an input to an output; at most {} nest in one "
                     "fused kernel (deeper visitor trees exceed nvcc's template limits)",
                     d, kMaxEpilogueDepth);
}

Legality check_legality(const Graph& g, const GemmDesc& gemm,
                        const std::map<std::string, OperandView>& views) {
  return LegalityChecker(g, gemm).run(views);
}

Legality check_legality(const Graph& g, const GemmDesc& gemm) { return check_legality(g, gemm, {}); }

namespace passes {

Graph legality(const Graph& g, const PipelineOptions& options) {
  if (options.legality) *options.legality = check_legality(g, options.gemm, options.views);
  return g;
}

}  // namespace passes
}  // namespace evtc
