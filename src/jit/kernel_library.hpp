// Kernel libraries: folders of kernels compiled ahead of time (`evtc aot build`), loaded
// where no nvcc exists (docs/backend.md, "Kernel libraries").
//
// A library folder holds
//   manifest.json        what built it (architecture, CUTLASS, CUDA and evtc versions, the
//                        digest of evtc's device headers, the ABI version) and one entry per
//                        kernel: its cache key, file, size, XXH3 checksum and what it was
//                        built from (IR text, options, shape, configuration)
//   kernels/<key>.so     the kernels, named by the cache key they had where they were built
// A request's key is worked out as the JIT's cache key with the library's nvcc version, so a
// lookup needs no toolchain. A library whose architecture, CUTLASS version, device-header
// digest, ABI or format differs from this evtc's is refused as a whole, never loaded; a
// kernel file whose size or checksum differs from its entry is refused alone (the JIT, or
// the unfused path, runs instead) with one message.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "jit/kernel_cache.hpp"

namespace evtc::jit {

inline constexpr int kLibraryFormatVersion = 1;

// What a kernel depends on besides its source and flags; equal identities are required.
struct LibraryIdentity {
  int sm = 90;
  std::string arch;            // "sm_90a"
  std::string cutlass;         // "4.2.0"
  std::string device_headers;  // device_headers_digest()
  int abi = 0;                 // EVTC_ABI_VERSION
  // Where it was built (recorded, not required to match): nvcc and evtc versions.
  std::string nvcc, evtc;
};

// This process's identity for kernels of `sm` (nvcc's version when a toolchain is found).
LibraryIdentity current_identity(int sm);

struct LibraryEntry {
  std::string key, file, label, kind;  // kind: fused, plain, grouped
  size_t bytes = 0;
  std::string xxh3;                    // 16 hex digits of the file's XXH3-64
  std::string origin_json;             // what it was built from (a JSON object)
};

struct LibraryManifest {
  LibraryIdentity identity;
  std::string created;  // UTC, ISO 8601
  std::vector<LibraryEntry> kernels;
};

// Reads dir/manifest.json; UserError naming the folder and what is wrong with it.
LibraryManifest read_manifest(const std::string& dir);
// Writes dir/manifest.json atomically (a temporary file renamed over it).
void write_manifest(const std::string& dir, const LibraryManifest& manifest);
// Why a library with this identity cannot be used here (empty when it can).
std::string identity_mismatch(const LibraryIdentity& library, const LibraryIdentity& here);

// The cache key of a request compiled with `nvcc_version` (the JIT's key when that is the
// local nvcc's).
std::string cache_key_for(const CompileRequest& request, const std::string& nvcc_version);
// XXH3-64 of a file's bytes, 16 hex digits; nullopt when it cannot be read.
std::optional<std::string> file_checksum(const std::string& path);

// Verifies and registers a library folder (searched before the JIT's cache, first added
// first); returns its manifest. UserError when it is refused, saying why.
LibraryManifest add_library(const std::string& dir);
// The registered folders, EVTC_KERNEL_LIBRARY's included (read at the first lookup).
std::vector<std::string> libraries();
// Forgets every registered library (tests; a later lookup reads EVTC_KERNEL_LIBRARY again).
void clear_libraries();
// The path of the request's kernel in a registered library, verified; nullopt when none
// has it (said once per kernel on stderr at log level warning when libraries are registered).
std::optional<std::string> library_kernel(const CompileRequest& request);

}  // namespace evtc::jit
