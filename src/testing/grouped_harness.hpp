// Device-side harness of grouped GEMMs, shared by `evtc grouped` and the GPU tests: random
// inputs for given group sizes, upload, poisoned outputs, a run, and the comparison with the
// fp64 reference of every group.
#pragma once
#include <cuda_runtime_api.h>

#include <map>
#include <string>
#include <vector>

#include "evtc/grouped.hpp"
#include "testing/harness.hpp"

namespace evtc::runtime {

// Fresh inputs: X and W with standard deviation K^(-1/4) (so acc is about N(0, 1)), per-group
// row vectors (G×N) and per-group scalars by pointer (G values), all N(0, 1) and rounded to
// their dtypes; scalars by value get `scalar_values` (1.5 when missing).
GroupedReferenceInputs random_grouped_inputs(const GroupedKernel& kernel, const std::vector<int64_t>& rows,
                                             int64_t n, int64_t k, uint64_t seed,
                                             const std::map<std::string, double>& scalar_values = {});

class GroupedDeviceProblem {
 public:
  // Uploads X (with `capacity` rows, at least sum(rows); extra rows are random too), W, the
  // operands and the end offsets; allocates Y (capacity × N, or capacity × N/2 when gated).
  GroupedDeviceProblem(const GroupedKernel& kernel, const GroupedReferenceInputs& inputs, int64_t capacity,
                       const std::map<std::string, double>& scalar_values = {});
  const GroupedArguments& arguments() const { return args_; }
  // Overwrites the device offsets with new group sizes (same group count, sum ≤ capacity),
  // stream-ordered; the host copy stays alive until the stream reaches it.
  void set_rows(const std::vector<int64_t>& rows, cudaStream_t stream);
  void poison_output(cudaStream_t stream) const;
  // The first `rows` rows of Y (synchronises the stream).
  std::vector<double> read_output(int64_t rows, cudaStream_t stream) const;
  int64_t capacity() const { return capacity_; }

 private:
  const GroupedKernel& kernel_;
  int64_t capacity_ = 0, y_cols_ = 0;
  std::map<std::string, DeviceBuffer> buffers_;
  std::vector<int32_t> host_offsets_;
  GroupedArguments args_;
};

// Compares Y with the reference (the output dtype's tolerance, widened like output_tolerance
// for f32 outputs); `rows` rows.
Comparison check_grouped_output(const GroupedKernel& kernel, const std::vector<double>& got,
                                const ReferenceOutputs& want);

}  // namespace evtc::runtime
