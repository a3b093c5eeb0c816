#include "testing/grouped_harness.hpp"

#include <fmt/format.h>

#include <cmath>
#include <numeric>
#include <random>

#include "evtc/error.hpp"
#include "testing/host_convert.hpp"

namespace evtc::runtime {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw RuntimeError(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

// Normal variates through Box-Muller over std::mt19937_64 (portable, unlike
// std::normal_distribution), rounded to `dtype`.
std::vector<double> normals(std::mt19937_64& rng, size_t count, double stddev, DType dtype) {
  std::vector<double> v(count);
  const double two_pi = 6.283185307179586;
  for (size_t i = 0; i < count; ++i) {
    const double u1 = (double(rng() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = double(rng() >> 11) * 0x1.0p-53;
    v[i] = round_to(dtype, stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(two_pi * u2));
  }
  return v;
}

}  // namespace

GroupedReferenceInputs random_grouped_inputs(const GroupedKernel& kernel, const std::vector<int64_t>& rows,
                                             int64_t n, int64_t k, uint64_t seed,
                                             const std::map<std::string, double>& scalar_values) {
  std::mt19937_64 rng(seed);
  GroupedReferenceInputs in;
  in.n = n;
  in.k = k;
  in.rows = rows;
  const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t(0));
  const double s = std::pow(double(k), -0.25);
  const size_t groups = rows.size();
  const GemmDesc& gemm = kernel.gemm();
  in.x = normals(rng, size_t(total * k), s, gemm.a_dtype);
  in.w = normals(rng, groups * size_t(n * k), s, gemm.b_dtype);
  if (gemm.fp8_blockwise) {  // the dense reference's block scales (add_random_block_scales)
    in.scale_a = random_block_scales(seed, "grouped:scale_a", size_t(total * fp8_scale_blocks(k)));
    in.scale_b = random_block_scales(seed, "grouped:scale_b", groups * size_t(fp8_scale_blocks(n) * fp8_scale_blocks(k)));
  }
  for (const OperandSlot& slot : kernel.signature().pointers) {
    if (slot.is_output) continue;  // a gated output
    const size_t per = slot.kind == NodeKind::row_vec ? size_t(n) : 1;
    in.operands[slot.name] = normals(rng, groups * per, 1.0, slot.dtype);
  }
  for (const OperandSlot& slot : kernel.signature().scalars) {
    auto it = scalar_values.find(slot.name);
    in.operands[slot.name] = {it == scalar_values.end() ? 1.5 : it->second};
  }
  return in;
}

GroupedDeviceProblem::GroupedDeviceProblem(const GroupedKernel& kernel, const GroupedReferenceInputs& in,
                                           int64_t capacity, const std::map<std::string, double>& scalar_values)
    : kernel_(kernel), capacity_(capacity) {
  const size_t groups = in.rows.size();
  const int64_t total = std::accumulate(in.rows.begin(), in.rows.end(), int64_t(0));
  if (capacity < total) throw UserError("grouped problem: capacity below the rows of the groups");
  const DType xt = kernel.gemm().a_dtype, wt = kernel.gemm().b_dtype;
  auto upload = [&](const std::string& key, DType t, const std::vector<double>& values) {
    const auto bytes = encode(t, values);
    DeviceBuffer buf(bytes.size());
    check(cudaMemcpy(buf.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), "upload");
    void* p = buf.get();
    buffers_[key] = std::move(buf);
    return p;
  };
  std::vector<double> x = in.x;
  std::mt19937_64 rng(12345);
  const auto tail = normals(rng, size_t((capacity - total) * in.k), 1.0, xt);
  x.insert(x.end(), tail.begin(), tail.end());
  args_.x(TensorRef::matrix(upload("x", xt, x), xt, capacity, in.k));
  args_.weights(BatchedTensorRef::contiguous(upload("w", wt, in.w), wt, int64_t(groups), in.n, in.k));
  if (kernel.gemm().fp8_blockwise) {
    // scale_a with M adjacent (the dense kernels' layout, which the kernel copies into its own),
    // capacity rows; scale_b G × ceil(N/128) × ceil(K/128) row-major (read in place).
    const int64_t kb = fp8_scale_blocks(in.k), nb = fp8_scale_blocks(in.n);
    std::vector<double> sa(size_t(capacity * kb), 1.0);
    for (int64_t r = 0; r < total; ++r)
      for (int64_t l = 0; l < kb; ++l) sa[size_t(l * capacity + r)] = in.scale_a[size_t(r * kb + l)];
    args_.scale_a(TensorRef{upload("scale_a", DType::f32, sa), DType::f32, capacity, kb, 1, capacity});
    args_.scale_b(BatchedTensorRef::contiguous(upload("scale_b", DType::f32, in.scale_b), DType::f32,
                                               int64_t(groups), nb, kb));
  }
  for (const OperandSlot& slot : kernel.signature().pointers) {
    if (slot.is_output) continue;  // a gated output: Y below
    const auto& values = in.operands.at(slot.name);
    void* p = upload(slot.name, slot.dtype, values);
    if (slot.kind == NodeKind::row_vec)
      args_.set(slot.name, TensorRef::matrix(p, slot.dtype, int64_t(groups), in.n));
    else
      args_.set(slot.name, TensorRef::vector(p, slot.dtype, int64_t(values.size())));
  }
  for (const OperandSlot& slot : kernel.signature().scalars) {
    auto it = scalar_values.find(slot.name);
    args_.set(slot.name, it == scalar_values.end() ? 1.5 : it->second);
  }
  const std::string& d = kernel.output_name();
  const DType dt = kernel.output_dtype();
  y_cols_ = kernel.gated() ? in.n / 2 : in.n;
  DeviceBuffer y(size_t(capacity * y_cols_) * size_t(dtype_bytes(dt)));
  args_.set(d, TensorRef::matrix(y.get(), dt, capacity, y_cols_));
  buffers_["y"] = std::move(y);
  DeviceBuffer offsets(groups * sizeof(int32_t));
  args_.offsets(static_cast<const int32_t*>(offsets.get()), int64_t(groups));
  buffers_["offsets"] = std::move(offsets);
  set_rows(in.rows, nullptr);
  check(cudaDeviceSynchronize(), "grouped problem upload");
}

void GroupedDeviceProblem::set_rows(const std::vector<int64_t>& rows, cudaStream_t stream) {
  host_offsets_.resize(rows.size());
  int64_t end = 0;
  for (size_t g = 0; g < rows.size(); ++g) host_offsets_[g] = int32_t(end += rows[g]);
  if (end > capacity_) throw UserError("grouped problem: the groups' rows exceed the capacity");
  check(cudaMemcpyAsync(buffers_.at("offsets").get(), host_offsets_.data(), rows.size() * sizeof(int32_t),
                        cudaMemcpyHostToDevice, stream),
        "offsets upload");
  check(cudaStreamSynchronize(stream), "offsets upload");
}

void GroupedDeviceProblem::poison_output(cudaStream_t stream) const {
  const auto& y = buffers_.at("y");
  check(cudaMemsetAsync(y.get(), 0xff, y.bytes(), stream), "poison");
}

std::vector<double> GroupedDeviceProblem::read_output(int64_t rows, cudaStream_t stream) const {
  const DType dt = kernel_.output_dtype();
  std::vector<uint8_t> bytes(size_t(rows * y_cols_) * size_t(dtype_bytes(dt)));
  check(cudaStreamSynchronize(stream), "grouped run");
  check(cudaMemcpy(bytes.data(), buffers_.at("y").get(), bytes.size(), cudaMemcpyDeviceToHost), "download");
  return decode(dt, bytes.data(), size_t(rows * y_cols_));
}

Comparison check_grouped_output(const GroupedKernel& kernel, const std::vector<double>& got,
                                const ReferenceOutputs& want) {
  const DType dt = kernel.output_dtype();
  Tolerance t = tolerance_for(dt);
  if (dt == DType::f32) {  // fast device math forms (see output_tolerance)
    t.rtol = std::max(t.rtol, std::ldexp(1.0, -9));
    t.max_rel_l2 = std::max(t.max_rel_l2, std::ldexp(1.0, -10));
  }
  return compare_outputs(got, want.at(kernel.output_name()), t);
}

}  // namespace evtc::runtime
