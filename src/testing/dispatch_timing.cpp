#include "testing/dispatch_timing.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <utility>
#include <vector>

#include "evtc/device/abi.h"
#include "evtc/error.hpp"
#include "runtime/bind.hpp"
#include "runtime/cublaslt_gemm.hpp"
#include "testing/harness.hpp"

namespace evtc::runtime {
namespace {

// Median host time of `call` in microseconds. The stream is drained every 50 calls (outside
// the timed region) so that a full launch queue never blocks a timed call.
double median_host_us(const std::function<void()>& call, cudaStream_t stream) {
  constexpr int kWarmup = 20, kCalls = 200;
  for (int i = 0; i < kWarmup; ++i) call();
  cudaStreamSynchronize(stream);
  std::vector<double> us;
  us.reserve(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    if (i % 50 == 0) cudaStreamSynchronize(stream);
    const auto t0 = std::chrono::steady_clock::now();
    call();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  cudaStreamSynchronize(stream);
  std::nth_element(us.begin(), us.begin() + kCalls / 2, us.end());
  return us[kCalls / 2];
}

// The library's own entry point, opened again (dlopen shares the loaded copy).
struct LibraryEntry {
  void* handle = nullptr;
  evtc_run_fn run = nullptr;
  evtc_workspace_size_fn workspace_size = nullptr;
  explicit LibraryEntry(const std::string& path) {
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) throw RuntimeError(fmt::format("cannot open {}: {}", path, dlerror()));
    run = reinterpret_cast<evtc_run_fn>(dlsym(handle, "evtc_run"));
    workspace_size = reinterpret_cast<evtc_workspace_size_fn>(dlsym(handle, "evtc_workspace_size"));
    if (!run || !workspace_size) throw RuntimeError(fmt::format("{} lacks evtc_run", path));
  }
  ~LibraryEntry() { dlclose(handle); }
};

// A and B of a bound call as cuBLASLt's GEMM reads them.
std::pair<MatrixOperand, MatrixOperand> cublas_operands(const BoundCall& call, const Arguments& args) {
  return {MatrixOperand{call.a, args.a()->dtype, call.a_layout == Layout::row_major, call.lda},
          MatrixOperand{call.b, args.b()->dtype, call.b_layout == Layout::row_major, call.ldb}};
}

}  // namespace

DispatchTimes measure_dispatch(const Kernel& kernel, const Arguments& args, cudaStream_t stream) {
  DispatchTimes t;
  t.run_us = median_host_us([&] { kernel.run(args, stream); }, stream);

  PointerChecks checks;
  const BoundCall call = bind_arguments(kernel.signature(), kernel.options().gemm, args, checks);
  const evtc_gemm_args abi = call.abi(kernel.config_for(call.m, call.n, call.k).swap_ab);
  LibraryEntry lib(kernel.library_path());
  const size_t workspace_bytes = std::max<size_t>(lib.workspace_size(&abi), 256);
  DeviceBuffer workspace(workspace_bytes);
  char why[256];
  t.library_us = median_host_us([&] { lib.run(&abi, workspace.get(), stream, why, sizeof why); }, stream);
  // One more workspace than the library's launch cache has entries: every call misses.
  std::vector<DeviceBuffer> rotating;
  for (int i = 0; i < 5; ++i) rotating.emplace_back(workspace_bytes);
  size_t turn = 0;
  t.library_new_args_us = median_host_us(
      [&] { lib.run(&abi, rotating[turn++ % rotating.size()].get(), stream, why, sizeof why); }, stream);

  DeviceBuffer d(size_t(call.m) * call.n * 4);
  const auto [a, b] = cublas_operands(call, args);
  t.cublas_us = median_host_us(
      [&] { cublaslt_matmul(a, b, d.get(), DType::bf16, call.m, call.n, call.k, stream); }, stream);
  return t;
}

double cublas_gemm_ms(const Kernel& kernel, const Arguments& args, DType d_dtype, cudaStream_t stream) {
  PointerChecks checks;
  const BoundCall call = bind_arguments(kernel.signature(), kernel.options().gemm, args, checks);
  DeviceBuffer d(size_t(call.m) * call.n * dtype_bytes(d_dtype));
  const auto [a, b] = cublas_operands(call, args);
  return median_ms([&] { cublaslt_matmul(a, b, d.get(), d_dtype, call.m, call.n, call.k, stream); }, stream);
}

}  // namespace evtc::runtime
