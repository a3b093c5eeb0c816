// The fixed parts of a generated dense kernel library that every backend writes alike: the
// banner, the two-part compile's prelude, the kernel image and its loader, and the launch of
// the reductions' final stage. (What they call at run time is a real header:
// include/evtc/device/kernel_host.h.)
#pragma once
#include <string>

#include "evtc/graph.hpp"

namespace evtc::backend {

// "//   <line>" for each line of the graph's text form.
std::string commented_graph(const Graph& g);
// The file's first lines: what it builds (`what`), the graph's hash, `details` and the graph.
std::string source_banner(const std::string& what, const Graph& g, const std::string& details);
// Opens the file's body, which the host part's device pass skips (closed by run_end): follows
// the banner. Not skipped where the host part launches kernels of its own (the reductions'
// finish, `host_launches_kernels`): their device code must be in the host part's image, or
// their launches fail with "invalid device function".
std::string host_part_device_pass_begin(bool host_launches_kernels);
// EVTC_PART: 0 compiles the file whole; 1 the kernel alone into a cubin; 2 the host part.
std::string parts_prelude();
// The host part's declaration of the device part's image (EVTC_PART 2).
std::string kernel_image_declaration();
// `function`(error): the kernel `kernel` (an extern "C" __global__ function, possibly qualified by
// its namespace) as the launch APIs take it, with the library's handle cache `which` (0 for the
// GEMM, 1 for a second kernel: evtc/device/kernel_host.h).
std::string kernel_loader(const std::string& function = "gemm_kernel", const std::string& kernel = "evtc_gemm_kernel",
                          int which = 0);
// The end of the host part's anonymous namespace and the start of its C exports: the ABI
// version and the kernel's signature (KernelSignature::c_export).
std::string exports_begin(const std::string& signature_export);
// The start of evtc_run: the kernel's handle (`kernel`; EVTC_ERROR_LAUNCH with the reason when
// it does not load) and the stream `s`.
std::string run_begin();
// The end of evtc_run after the GEMM's launch, and of the file: the reductions' final stage over
// the scratch at `scratch` (a char* expression), returning EVTC_ERROR_LAUNCH with the reason if
// it fails, else EVTC_OK.
std::string run_end(const std::string& scratch);

}  // namespace evtc::backend
