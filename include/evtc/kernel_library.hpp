// Kernel libraries: kernels compiled ahead of time into a folder, loaded where no nvcc exists
// (docs/backend.md, "Kernel libraries").
//
//   // Build machine (nvcc and CUTLASS): compile a kernel list into a library folder.
//   evtc::build_kernel_library(list_json, "model-kernels");   // or `evtc aot build`
//   // Deployment (no nvcc): search the library before compiling anything.
//   evtc::add_kernel_library("model-kernels");                  // or EVTC_KERNEL_LIBRARY=dir
//
// A kernel list names kernels to build, as JSON:
//   {"format": "evtc-kernel-list", "format_version": 1, "kernels": [
//     {"expr": "out D: bf16 = silu(acc + bias[n])", "options": {"b_layout": "col"},
//      "shapes": [{"m": 8192, "n": 4096, "k": 4096}]},
//     {"ir": "<canonical IR text>", "options": {...}, "shapes": [{"m": 0, "n": 4096, "k": 4096,
//      "config": "coop_128x256x64_c2x1_persistent"}]},
//     {"grouped": true, "expr": "out y: bf16 = gptoss_swiglu(acc + bias[n])", "options": {...}}]}
// "options" is spelled as evtc::OptionText's JSON (evtc/options.hpp); a shape without
// "config" gets the configuration Kernel::config_for picks for it (tuned or heuristic);
// shapes default to one of unknown size. Every dense kernel also gets its unfused path's
// plain epilogue. record_kernels writes such a list of what a process ran.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "evtc/runtime.hpp"

namespace evtc {

struct KernelLibraryEntry {
  std::string key;    // the cache key it was built under
  std::string file;   // relative to the library folder
  std::string label;  // e.g. "coop_128x256x64_c2x1_persistent for 8192x4096x4096"
  std::string kind;   // fused, plain or grouped
  size_t bytes = 0;
  std::string origin_json;  // what it was built from: {"ir", "options", "m", "n", "k", "config"}
};

struct KernelLibraryInfo {
  std::string dir;
  std::string arch, cutlass, nvcc, evtc, created;
  std::vector<KernelLibraryEntry> kernels;
};

// Verifies a library folder — its manifest, that its kernels are for this evtc's architecture
// and the current GPU's, its CUTLASS version, evtc's device headers and kernel ABI — and from
// now on looks every kernel this process needs up in it before the disk cache and nvcc. A
// kernel file whose size or checksum differs from the manifest is not loaded (the JIT, or the
// unfused path, runs instead). UserError saying why when the library is refused.
// EVTC_KERNEL_LIBRARY=dir[:dir...] adds libraries at the first kernel lookup.
KernelLibraryInfo add_kernel_library(const std::string& dir);
// The library folders in use, in search order.
std::vector<std::string> kernel_libraries();
// A library's manifest, read and checked for form but not for use here.
KernelLibraryInfo read_kernel_library(const std::string& dir);

// A kernel list (JSON text) holding `kernels_json`, a JSON array of entries as above; UserError
// when it is not an array.
std::string kernel_list_of(const std::string& kernels_json);

// Records every kernel this process compiles or loads (Kernel per problem shape and
// configuration, GroupedKernel) into the kernel list at `path`, adding to the list already
// there; the file is rewritten (atomically) as kernels are added. "" stops recording.
// EVTC_RECORD_KERNELS=path records from the start.
void record_kernels(const std::string& path);

struct LibraryBuildResult {
  std::string dir;
  size_t kernels = 0;   // in the library after the build
  size_t added = 0;     // of them, added by this build
  size_t compiled = 0;  // nvcc runs the build needed (others were in the disk cache)
  double seconds = 0;
  std::vector<std::string> errors;  // kernels that failed to build (left out), one line each
};

// Builds the kernels of a kernel list (JSON text) in parallel (EVTC_COMPILE_JOBS at a time)
// and adds them to the library in `dir` (created if missing; a library built by another
// toolchain is refused). Needs nvcc and CUTLASS, not a GPU. Progress: ("compiling", done,
// total). UserError for a malformed list, naming the entry and the field: a field of the wrong
// type, and a shape size that is not a whole number from 0 to 2^31 - 1 ("m": 4.5, 1e300), are
// refused with the value found.
//
// `gpu`: a GPU class of the shipped selection tables ("h100", "h200"; selection's gpu_classes).
// Each dense kernel without a configuration of its own then takes the one a process on such a
// GPU would choose (its table's, else the rules with its multiprocessors), as a library built
// on a machine without that GPU would otherwise miss: there the rules choose. "" (the default):
// the choice here, tuned choices included. UserError for a class without tables, or one whose
// kernels are not of the library's architecture.
LibraryBuildResult build_kernel_library(const std::string& kernel_list_json, const std::string& dir,
                                        const ProgressFn& progress = {}, const std::string& gpu = "");
// The GPU classes `gpu` takes.
std::vector<std::string> kernel_library_gpus();
// The class among kernel_library_gpus() of this process's GPU: what to pass as `gpu` when
// building, elsewhere, a library for GPUs like it. "" without a GPU, or for a GPU of no such class.
std::string kernel_library_gpu();

// Kernel lists of common transformer epilogues (bias, GELU/SiLU/ReLU², gated SwiGLU/GeGLU,
// residual add, fp8 rowwise scales) for the given M×N×K shapes (none: one kernel each for
// shapes of unknown size).
std::vector<std::string> kernel_list_presets();  // "transformer"
std::string preset_kernel_list(const std::string& name, const std::vector<std::array<int64_t, 3>>& shapes);

// How many nvcc processes this process has started (0 where every kernel came from a
// library or the disk cache).
size_t compiler_runs();

// A kernel this process needed that was not in a library or the disk cache: compiled here with
// nvcc ("compiled"), or compiled by another process (on this host or another sharing the cache
// folder) while this one waited for it ("waited"). `seconds` is the compile's or the wait's.
struct CompileEvent {
  std::string key;    // the cache key (the entry's folder name)
  std::string label;  // the kernel, as compile messages name it
  std::string what;   // "compiled" or "waited"
  double seconds = 0;
};
// This process's compile events, in the order they finished.
std::vector<CompileEvent> compile_events();
// The CUTLASS folder (holding include/cutlass) kernels compile against when EVTC_CUTLASS_DIR and
// CUTLASS_DIR are unset; call it before the first compile. Without it an install uses the
// headers installed with it (<datadir>/evtc/cutlass).
void set_cutlass_dir(const std::string& dir);
// A CUTLASS folder to use only when no other is found (after the environment, set_cutlass_dir's
// folder, the headers beside the library or installed with it, and the build tree's): the
// Python package passes the nvidia-cutlass package's. Before the first compile.
void set_cutlass_fallback_dir(const std::string& dir);
// What kernel compiles use here: nvcc and its version, the CUTLASS headers and their version,
// evtc's device headers. RuntimeError saying what is missing and what to set.
struct ToolchainInfo {
  std::string nvcc, nvcc_version, cutlass_include, cutlass_version, device_headers;
};
ToolchainInfo toolchain_info();
// Whether nvcc can be found here (CUDACXX, CUDA_HOME, PATH, the build's toolkit).
bool compiler_available();

}  // namespace evtc
