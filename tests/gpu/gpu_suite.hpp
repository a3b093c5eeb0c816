// Shared set-up of the GPU suite: the kernels under test, compiled once in parallel before
// the tests run, and a helper that runs a kernel on fresh random inputs and compares every
// output with the fp64 reference.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "evtc/reference.hpp"
#include "evtc/runtime.hpp"
#include "testing/harness.hpp"

namespace evtc::gpu_test {

// A kernel of the suite by name (see kSuite in gpu_suite.cpp).
Kernel& kernel(const std::string& name);

// Runs `k` on an m×n×k problem with random inputs drawn from `seed`, outputs poisoned
// first, and checks the path taken and every output against the reference.
void expect_matches_reference(const Kernel& k, int64_t m, int64_t n, int64_t kk, uint64_t seed,
                              ExecutionPath expected_path, cudaStream_t stream = nullptr);

}  // namespace evtc::gpu_test
