#include "evtc/arch.hpp"
#include "jit/toolchain.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>

#include "evtc/error.hpp"
#include "jit/process.hpp"
#include "support/environment.hpp"

namespace fs = std::filesystem;

namespace evtc::jit {
namespace {

std::string env(Env e) { return env_text(e).value_or(""); }

bool is_executable(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0;
}

std::string find_nvcc() {
  if (auto v = env(Env::cudacxx); !v.empty()) {
    if (is_executable(v)) return v;
    throw RuntimeError(fmt::format("{}={} is not an executable nvcc", env_name(Env::cudacxx), v));
  }
  for (Env var : {Env::cuda_home, Env::cuda_path})
    if (auto v = env(var); !v.empty() && is_executable(fs::path(v) / "bin" / "nvcc"))
      return (fs::path(v) / "bin" / "nvcc").string();
  std::stringstream path(env(Env::path));
  for (std::string dir; std::getline(path, dir, ':');)
    if (!dir.empty() && is_executable(fs::path(dir) / "nvcc")) return (fs::path(dir) / "nvcc").string();
  if (is_executable(fs::path(EVTC_CUDA_BIN_DIR) / "nvcc"))
    return (fs::path(EVTC_CUDA_BIN_DIR) / "nvcc").string();
  throw RuntimeError(
      "nvcc not found: install the CUDA toolkit, or set CUDACXX to nvcc's path (or CUDA_HOME to "
      "the toolkit folder)");
}

// The folder of the binary that holds this code (libevtc.so, or a program linked with it
// statically): installed files are found relative to it.
fs::path library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&library_dir), &info) == 0 || !info.dli_fname) return {};
  std::error_code ec;
  const fs::path p = fs::canonical(info.dli_fname, ec);
  return ec ? fs::path(info.dli_fname).parent_path() : p.parent_path();
}

// In a build tree, CMake writes beside the library the source tree's include folder and the
// CUTLASS folder it was configured with (evtc-build-tree.txt: "include=..." and "cutlass=..."
// lines). Installed copies have no such file, so they carry no path of the build machine.
std::string build_tree_path(const std::string& what) {
  std::ifstream f(library_dir() / "evtc-build-tree.txt");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(what + "=", 0) == 0) return line.substr(what.size() + 1);
  return "";
}

std::mutex& cutlass_dir_mutex() {
  static std::mutex mu;
  return mu;
}

std::string& configured_cutlass_dir() {
  static std::string dir;
  return dir;
}

std::string& fallback_cutlass_dir() {
  static std::string dir;
  return dir;
}

// major.minor of a version "4.2.0".
std::string series(const std::string& version) {
  const size_t first = version.find('.');
  const size_t second = first == std::string::npos ? first : version.find('.', first + 1);
  return version.substr(0, second);
}

std::string cutlass_version(const std::string& include);

std::string find_cutlass_unchecked() {
  std::vector<std::string> tried;
  auto ok = [&](const fs::path& root) -> std::string {
    tried.push_back(root.string());
    for (const fs::path& inc : {root / "include", root})
      if (fs::exists(inc / "cutlass" / "cutlass.h")) return inc.string();
    return "";
  };
  for (Env var : {Env::cutlass_dir, Env::cutlass_dir_plain})
    if (auto v = env(var); !v.empty()) {
      if (auto inc = ok(v); !inc.empty()) return inc;
      throw RuntimeError(fmt::format(
          "{}={} holds no CUTLASS headers (expected include/cutlass/cutlass.h under it)", env_name(var), v));
    }
  std::string set;
  {
    std::lock_guard lock(cutlass_dir_mutex());
    set = configured_cutlass_dir();
  }
  if (!set.empty())
    if (auto inc = ok(set); !inc.empty()) return inc;
  const fs::path lib = library_dir();
  // The Python package (evtc/cutlass beside the library), an install (<prefix>/<libdir>/libevtc.so,
  // CUTLASS in <prefix>/<datadir>/evtc/cutlass), then the build tree's CUTLASS folder.
  if (!lib.empty()) {
    if (auto inc = ok(lib / "cutlass"); !inc.empty()) return inc;
    if (auto inc = ok((lib / EVTC_LIBDIR_TO_DATADIR / "evtc" / "cutlass").lexically_normal()); !inc.empty())
      return inc;
  }
  if (const std::string built = build_tree_path("cutlass"); !built.empty())
    if (auto inc = ok(built); !inc.empty()) return inc;
  std::string fallback;
  {
    std::lock_guard lock(cutlass_dir_mutex());
    fallback = fallback_cutlass_dir();
  }
  if (!fallback.empty())
    if (auto inc = ok(fallback); !inc.empty()) return inc;
  throw RuntimeError(fmt::format(
      "CUTLASS {} headers not found (looked in {}): set EVTC_CUTLASS_DIR to a CUTLASS folder holding "
      "include/cutlass, or `pip install nvidia-cutlass=={}.0.0` for the Python package, or run scripts/setup.sh "
      "in a source tree",
      EVTC_CUTLASS_SERIES, fmt::join(tried, ", "), EVTC_CUTLASS_SERIES));
}

// find_cutlass_unchecked, refusing headers of another CUTLASS release than the generated
// kernels are written for (their templates' names and arguments change between releases).
std::string find_cutlass() {
  const std::string include = find_cutlass_unchecked();
  const std::string version = cutlass_version(include);
  if (series(version) != EVTC_CUTLASS_SERIES)
    throw RuntimeError(fmt::format(
        "the CUTLASS headers in {} are version {}, but evtc's kernels are written for CUTLASS {}.x: set "
        "EVTC_CUTLASS_DIR to a CUTLASS {} folder (`pip install nvidia-cutlass=={}.0.0` has one)",
        include, version, EVTC_CUTLASS_SERIES, EVTC_CUTLASS_SERIES, EVTC_CUTLASS_SERIES));
  return include;
}

// The oldest nvcc that compiles sm_90a code (wgmma, setmaxnreg).
constexpr int kMinNvccMajor = 12, kMinNvccMinor = 0;

std::string cutlass_version(const std::string& include) {
  std::ifstream f(fs::path(include) / "cutlass" / "version.h");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  auto macro = [&](const char* name) {
    std::smatch m;
    std::regex re(std::string("#define ") + name + R"(\s+(\d+))");
    return std::regex_search(text, m, re) ? m[1].str() : std::string("?");
  };
  return macro("CUTLASS_MAJOR") + "." + macro("CUTLASS_MINOR") + "." + macro("CUTLASS_PATCH");
}

std::string find_evtc_include() {
  const fs::path lib = library_dir();
  std::vector<std::string> candidates = {env(Env::include_dir)};
  if (!lib.empty()) {
    candidates.push_back((lib / "include").string());  // the Python package: evtc/include beside the library
    candidates.push_back((lib / EVTC_LIBDIR_TO_INCLUDEDIR).lexically_normal().string());  // an install
  }
  candidates.push_back(build_tree_path("include"));
  std::vector<std::string> tried;
  for (const std::string& dir : candidates) {
    if (dir.empty()) continue;
    if (fs::exists(fs::path(dir) / "evtc" / "device" / "ops.cuh")) return dir;
    tried.push_back(dir);
  }
  throw RuntimeError(fmt::format(
      "evtc's device headers (evtc/device/ops.cuh) not found (looked in {}): set EVTC_INCLUDE_DIR to the "
      "folder that holds evtc/device",
      tried.empty() ? std::string("no folder") : fmt::format("{}", fmt::join(tried, ", "))));
}

// nvcc's version ("13.0.88") from `nvcc --version`; RuntimeError for one too old for sm_90a.
std::string nvcc_version_of(const std::string& nvcc) {
  int status = 0;
  const std::string text = capture_process({nvcc, "--version"}, &status);
  std::smatch m;
  static const std::regex re(R"(V(\d+)\.(\d+)\.(\d+))");
  if (status != 0 || !std::regex_search(text, m, re))
    throw RuntimeError(fmt::format("{} --version failed (exit {}) or printed no version: is it nvcc?\n{}", nvcc,
                                   status, text.substr(0, 400)));
  const int major = std::stoi(m[1].str()), minor = std::stoi(m[2].str());
  if (major < kMinNvccMajor || (major == kMinNvccMajor && minor < kMinNvccMinor))
    throw RuntimeError(fmt::format("{} is CUDA {}.{}; evtc's kernels need nvcc {}.{} or newer (sm_90a, CUTLASS {}): "
                                   "set CUDACXX or CUDA_HOME to a newer toolkit",
                                   nvcc, major, minor, kMinNvccMajor, kMinNvccMinor, EVTC_CUTLASS_SERIES));
  return m[1].str() + "." + m[2].str() + "." + m[3].str();
}

}  // namespace

const Toolchain& toolchain(bool need_cutlass) {
  static std::mutex mu;
  static Toolchain tc;
  static bool have_base = false, have_cutlass = false;
  std::lock_guard lock(mu);
  if (!have_base) {
    tc.nvcc = find_nvcc();
    tc.nvcc_version = nvcc_version_of(tc.nvcc);
    tc.evtc_include = find_evtc_include();
    have_base = true;
  }
  if (need_cutlass && !have_cutlass) {
    tc.cutlass_include = find_cutlass();
    tc.cutlass_version = cutlass_version(tc.cutlass_include);
    have_cutlass = true;
  }
  return tc;
}

namespace {

// CUTLASS's sm90 kernels need the architecture-specific target (wgmma, setmaxnreg), whose code
// runs on sm_90 only; so do its sm100 (tcgen05) and sm120 kernels on theirs (every architecture
// with fused kernels, evtc/arch.hpp). Other code carries its PTX beside the machine code, so that the driver
// compiles it for a newer GPU where it runs (machine code of one major architecture does not run
// on another: sm_80 code on a Hopper GPU, the unfused path of `arch=sm80`).
// The backend whose code a request holds: the one given, else `sm`'s own (evtc/arch.hpp).
int code_backend(int sm, int backend) { return backend ? backend : arch_features(sm).backend; }

std::string gencode_flag(int sm, bool need_cutlass, int backend) {
  // Fused kernels: the architecture-specific target of each backend (sm_90a, sm_100a, sm_120a);
  // the sm_80 backend's machine code for the GPU's architecture, with compute_80 PTX beside it.
  const int b = code_backend(sm, backend);
  if (need_cutlass && b == 80) return fmt::format("-gencode=arch=compute_80,code=[sm_{},compute_80]", sm);
  if (need_cutlass && b) return fmt::format("-gencode=arch=compute_{0}a,code=sm_{0}a", sm);
  return fmt::format("-gencode=arch=compute_{0},code=[sm_{0},compute_{0}]", sm);
}

}  // namespace

std::vector<std::string> code_flags(int sm, bool need_cutlass, int backend) {
  // -DNDEBUG matters: without it CUTLASS's asserts serialise the wgmma pipeline.
  std::vector<std::string> f = {"-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr",
                                "-Xcompiler=-fPIC", "-shared", "-lineinfo"};
  f.push_back(gencode_flag(sm, need_cutlass, backend));
  return f;
}

namespace {

// CUTLASS builds TMA descriptors through the driver API: link the driver (its stub at build
// time) so the library resolves those symbols itself when it is loaded.
void add_driver_library(std::vector<std::string>& f) {
  const fs::path stubs = fs::path(toolchain(false).nvcc).parent_path().parent_path() / "lib64" / "stubs";
  if (fs::exists(stubs / "libcuda.so")) f.push_back("-L" + stubs.string());
  f.push_back("-lcuda");
}

// code_flags without the ones that make a shared library.
std::vector<std::string> compile_only_flags(int sm, int backend) {
  std::vector<std::string> f;
  for (const std::string& flag : code_flags(sm, true, backend))
    if (flag != "-shared") f.push_back(flag);
  return f;
}

}  // namespace

std::vector<std::string> kernel_flags(int sm, bool need_cutlass, int backend) {
  std::vector<std::string> f = code_flags(sm, need_cutlass, backend);
  if (need_cutlass) add_driver_library(f);
  return f;
}

std::vector<std::string> device_part_flags(int sm, int backend) {
  std::vector<std::string> f = compile_only_flags(sm, backend);
  // The sm_80 backend's image carries compute_80 PTX beside its machine code (a fat binary),
  // which the driver compiles for newer GPUs; the others' are one architecture's cubin.
  f.push_back(code_backend(sm, backend) == 80 ? "-fatbin" : "-cubin");
  f.push_back("-DEVTC_PART=1");
  return f;
}

std::vector<std::string> host_part_flags(int sm, int backend) {
  std::vector<std::string> f = compile_only_flags(sm, backend);
  f.push_back("-c");
  f.push_back("-DEVTC_PART=2");
  return f;
}

std::vector<std::string> link_parts_flags(int sm, int backend) {
  std::vector<std::string> f = {"-Xcompiler=-fPIC", "-shared", gencode_flag(sm, true, backend)};
  add_driver_library(f);
  return f;
}

}  // namespace evtc::jit

namespace evtc::jit {

void set_cutlass_dir(const std::string& dir) {
  std::lock_guard lock(cutlass_dir_mutex());
  configured_cutlass_dir() = dir;
}

void set_cutlass_fallback_dir(const std::string& dir) {
  std::lock_guard lock(cutlass_dir_mutex());
  fallback_cutlass_dir() = dir;
}

std::string cutlass_version_in_use() {
  try {
    return cutlass_version(find_cutlass_unchecked());
  } catch (const Error&) {
    return EVTC_BUILT_CUTLASS_VERSION;
  }
}

std::string device_headers_digest() {
  std::string include;
  try {
    include = find_evtc_include();
  } catch (const Error&) {
    return "none";
  }
  const fs::path dir = fs::path(include) / "evtc" / "device";
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file(ec)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string name = f.filename().string() + "\n", text = ss.str();
    XXH3_64bits_update(state, name.data(), name.size());
    XXH3_64bits_update(state, text.data(), text.size());
  }
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return fmt::format("{:016x}", h);
}

bool compiler_available() {
  try {
    toolchain(false);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace evtc::jit
