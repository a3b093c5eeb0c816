// Where the tools and headers a kernel compile needs are, and their versions.
#pragma once
#include "evtc/jit.hpp"
#include <string>
#include <vector>

namespace evtc::jit {


// The nvcc flags that decide a kernel's code (part of its cache key; without -I, -L and -o).
// Needs no toolchain.
// `backend`: the fused kernel's backend (ArchFeatures::backend) when it is not `sm`'s own
// (sm_120's 16-bit kernels come from the sm_80 backend); 0 = `sm`'s own.
std::vector<std::string> code_flags(int sm, bool need_cutlass, int backend = 0);
// code_flags plus the link flags (the driver library for CUTLASS kernels) of this toolkit.
std::vector<std::string> kernel_flags(int sm, bool need_cutlass, int backend = 0);
// A CUTLASS kernel compiled in parts (CompileRequest::in_parts): the device part's flags (its
// kernel alone, into a cubin), the host part's (an object), and the link's (the host object
// and the cubin's image into the library). The code flags are code_flags' (one key for both).
std::vector<std::string> device_part_flags(int sm, int backend = 0);
std::vector<std::string> host_part_flags(int sm, int backend = 0);
std::vector<std::string> link_parts_flags(int sm, int backend = 0);

// The CUTLASS version kernels are generated for: that of the headers the JIT finds, else the
// one evtc was built with ("unknown" when neither is known). Needs no nvcc.
std::string cutlass_version_in_use();
// A digest of every file under evtc/device/ in evtc's device headers (sorted by name), the
// code every generated kernel includes; "none" when the headers are not found. Needs no nvcc.
std::string device_headers_digest();
// Whether nvcc can be found (see toolchain); never throws.
bool compiler_available();

}  // namespace evtc::jit
