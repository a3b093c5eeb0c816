// Ahead-of-time kernels (include/evtc/kernel_library.hpp): kernel lists, recording them,
// building libraries from them, and the public face of jit/kernel_library.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "evtc/arch.hpp"
#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/grouped.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/kernel_library.hpp"
#include "evtc/options.hpp"
#include "support/environment.hpp"
#include "jit/json_fields.hpp"
#include "jit/kernel_cache.hpp"
#include "jit/kernel_library.hpp"
#include "jit/toolchain.hpp"
#include "runtime/selection/candidates.hpp"
#include "runtime/selection/default_config.hpp"
#include "runtime/selection/shipped_table.hpp"
#include "runtime/selection/tuning_store.hpp"
#include "runtime/kernel_requests.hpp"
#include "target/device_info.hpp"
#include "support/logging.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace evtc {
namespace {

constexpr const char* kListFormat = "evtc-kernel-list";
constexpr int kListVersion = 1;

struct ListShape {
  int64_t m = 0, n = 0, k = 0;
  std::optional<std::string> config;
};

struct ListItem {
  bool grouped = false;
  std::string ir, expr;
  json options = json::object();
  std::vector<ListShape> shapes;
};

json list_of(json kernels) {
  return {{"format", kListFormat}, {"format_version", kListVersion}, {"kernels", std::move(kernels)}};
}

// A kernel list's entries; UserError naming the entry (1-based) and what is wrong.
std::vector<ListItem> parse_kernel_list(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw UserError(fmt::format("kernel list: not valid JSON: {}", e.what()));
  }
  namespace jf = jit::json_fields;
  const json* format = j.is_object() ? jf::find(j, "format") : nullptr;
  if (!format || !format->is_string() || *format != kListFormat)
    throw UserError(fmt::format("kernel list: not an evtc kernel list (its \"format\" must be \"{}\")", kListFormat));
  const json* version = jf::find(j, "format_version");
  if (!version || !version->is_number_integer() || *version != kListVersion)
    throw UserError(fmt::format("kernel list: format version {}, this evtc reads version {}",
                                version ? jf::shown(*version) : "(none)", kListVersion));
  if (!j.contains("kernels") || !j["kernels"].is_array())
    throw UserError("kernel list: \"kernels\" must be an array");
  std::vector<ListItem> items;
  size_t index = 0;
  for (const json& k : j["kernels"]) {
    ++index;
    auto bad = [&](const std::string& what) { return UserError(fmt::format("kernel list entry {}: {}", index, what)); };
    if (!k.is_object()) throw bad("must be an object");
    ListItem item;
    try {
      item.grouped = jf::bool_field(k, "grouped", bad, false);
      item.ir = jf::string_field(k, "ir", bad, "");
      item.expr = jf::string_field(k, "expr", bad, "");
      if (k.contains("options")) item.options = k["options"];
      if (!item.options.is_object()) throw bad("\"options\" must be an object");
      if (item.ir.empty() == item.expr.empty()) throw bad("needs one of \"expr\" (an expression) or \"ir\" (IR text)");
      if (k.contains("shapes")) {
        if (!k["shapes"].is_array()) throw bad("\"shapes\" must be an array");
        size_t shape_index = 0;
        for (const json& s : k["shapes"]) {
          ++shape_index;
          auto bad_shape = [&](const std::string& what) { return bad(fmt::format("shape {}: {}", shape_index, what)); };
          if (!s.is_object()) throw bad("each shape must be an object like {\"m\": 8192, \"n\": 4096, \"k\": 4096}");
          // Problem sizes are ints on the device.
          constexpr int64_t most = std::numeric_limits<int32_t>::max();
          ListShape shape{jf::integer_field(s, "m", bad_shape, 0, 0, most), jf::integer_field(s, "n", bad_shape, 0, 0, most),
                          jf::integer_field(s, "k", bad_shape, 0, 0, most), std::nullopt};
          if (const json* config = jf::find(s, "config", true)) shape.config = jf::string_of(*config, "config", bad_shape);
          item.shapes.push_back(shape);
        }
      }
    } catch (const json::exception& e) {
      throw bad(fmt::format("a field has the wrong type: {}", e.what()));
    }
    if (item.shapes.empty()) item.shapes.push_back({});
    items.push_back(std::move(item));
  }
  return items;
}

// The options that decide the code, as a list entry spells them (defaults left out of nothing:
// every such field is written, so an entry means the same under later defaults).
json code_options(const OptionText& o) {
  json j = json::parse(option_text_json(o));
  for (const char* k : {"disable_fusion", "wait_for_compile", "operand_dtype", "output_dtype", "arch"}) j.erase(k);
  if (j["config"].is_null()) j.erase("config");
  return j;
}

// --- recording ---------------------------------------------------------------------------

struct Recorder {
  std::mutex mu;
  bool env_read = false;
  std::string path;
  json kernels = json::array();
  std::map<std::string, size_t> index;  // entry identity -> position in kernels
  std::set<std::string> shapes;         // entry identity + shape + config
  std::set<std::string> said;

  void say(const std::string& m) {
    if (said.insert(m).second) log_warning("{}", m);
  }

  static std::string identity(const json& k) {
    return fmt::format("{}\n{}\n{}", k.value("grouped", false), k.value("ir", ""), k["options"].dump());
  }
  static std::string shape_id(const std::string& id, const json& s) {
    return fmt::format("{}\n{},{},{},{}", id, s.value("m", 0), s.value("n", 0), s.value("k", 0),
                       s.contains("config") ? s["config"].dump() : "");
  }

  // Starts recording into `p`, keeping the entries already there. Throws for a file that is
  // not a kernel list (so that it is not overwritten).
  void start(const std::string& p) {
    path = p;
    kernels = json::array();
    index.clear();
    shapes.clear();
    std::error_code ec;
    if (p.empty() || !fs::exists(p, ec)) return;
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    try {
      parse_kernel_list(ss.str());  // validates
      // A named document: the loop's range refers into it (a member of a temporary would be
      // destroyed before the loop runs).
      const json recorded = json::parse(ss.str());
      for (json k : recorded.at("kernels")) {
        if (!k.contains("options")) k["options"] = json::object();
        const std::string id = identity(k);
        json entry_shapes = k.value("shapes", json::array());
        k["shapes"] = json::array();
        auto [it, fresh] = index.emplace(id, kernels.size());
        if (fresh) kernels.push_back(k);
        for (const json& s : entry_shapes)
          if (shapes.insert(shape_id(id, s)).second) kernels[it->second]["shapes"].push_back(s);
      }
    } catch (const Error& e) {
      path.clear();
      throw UserError(fmt::format("cannot record kernels into {}: it is not a kernel list ({})", p, e.what()));
    }
  }

  void add(const json& entry, const json& shape) {
    const std::string id = identity(entry);
    auto [it, fresh] = index.emplace(id, kernels.size());
    const bool new_shape = shapes.insert(shape_id(id, shape)).second;
    if (!fresh && !new_shape) return;
    if (fresh) {
      json e = entry;
      e["shapes"] = json::array();
      kernels.push_back(e);
    }
    if (new_shape) kernels[it->second]["shapes"].push_back(shape);
    jit::write_file_atomically(path, list_of(kernels).dump(1) + "\n");
  }
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

void read_record_env(Recorder& r) {
  if (r.env_read) return;
  r.env_read = true;
  const auto p = env_text(Env::record_kernels);
  if (!p) return;
  try {
    r.start(*p);
  } catch (const Error& e) {
    r.say(fmt::format("{}: {}", env_name(Env::record_kernels), e.what()));
  }
}

KernelLibraryInfo info_of(const std::string& dir, const jit::LibraryManifest& m) {
  KernelLibraryInfo info;
  info.dir = dir;
  info.arch = m.identity.arch;
  info.cutlass = m.identity.cutlass;
  info.nvcc = m.identity.nvcc;
  info.evtc = m.identity.evtc;
  info.created = m.created;
  for (const auto& e : m.kernels) info.kernels.push_back({e.key, e.file, e.label, e.kind, e.bytes, e.origin_json});
  return info;
}

}  // namespace

namespace runtime {

void record_kernel(const Graph& graph, const OptionText& options, bool grouped, int64_t m, int64_t n, int64_t k,
                   const KernelConfig& config) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  read_record_env(r);
  if (r.path.empty()) return;
  try {
    json entry = {{"ir", print(graph)}, {"options", code_options(options)}};
    json shape = json::object();
    if (grouped) {
      entry["grouped"] = true;
    } else {
      shape = {{"m", m}, {"n", n}, {"k", k}, {"config", config.name()}};
    }
    r.add(entry, shape);
  } catch (const std::exception& e) {
    r.say(fmt::format("cannot record kernels into {}: {}", r.path, e.what()));
  }
}

}  // namespace runtime

void record_kernels(const std::string& path) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mu);
  r.env_read = true;  // an explicit choice replaces EVTC_RECORD_KERNELS
  r.start(path);
}

// --- building ----------------------------------------------------------------------------

std::vector<std::string> kernel_library_gpus() { return selection::gpu_classes(); }

std::string kernel_library_gpu() {
  const std::optional<DeviceInfo> dev = current_device();
  if (!dev) return "";
  const std::string here = selection::gpu_class_of(dev->name);
  const std::vector<std::string> classes = kernel_library_gpus();
  return std::find(classes.begin(), classes.end(), here) != classes.end() ? here : "";
}

LibraryBuildResult build_kernel_library(const std::string& list_json, const std::string& dir,
                                        const ProgressFn& progress, const std::string& gpu) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<ListItem> items = parse_kernel_list(list_json);

  struct Job {
    jit::CompileRequest request;
    std::string kind, label;
    json origin;
    std::shared_future<std::string> future;
  };
  std::vector<Job> jobs;
  std::set<std::string> sources;
  auto add_job = [&](jit::CompileRequest req, std::string kind, std::string label, json origin) {
    if (!sources.insert(req.source).second) return;
    req.label = label;
    jobs.push_back({std::move(req), std::move(kind), std::move(label), std::move(origin), {}});
  };
  // One architecture per library: EVTC_ARCH, else the current GPU's, else sm_90a.
  const int arch = target_arch();
  // The GPU whose choices the kernels without a configuration take (see the header).
  std::optional<DeviceInfo> assumed;
  if (!gpu.empty()) {
    assumed = selection::device_of_class(gpu);
    if (!assumed)
      throw UserError(fmt::format("gpu '{}': evtc has selection tables for {}, not for that class", gpu,
                                  fmt::join(selection::gpu_classes(), ", ")));
    if (assumed->arch != arch)
      throw UserError(fmt::format("gpu '{}': its kernels are {}, and this library is for {} (EVTC_ARCH, or the GPU's)",
                                  gpu, arch_name(assumed->arch, true), arch_name(arch, true)));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const ListItem& item = items[i];
    try {
      const OptionText ot = option_text_from_json(item.options.dump());
      const Graph g = item.ir.empty() ? parse_expression(item.expr, parse_options(ot)) : parse_canonical(item.ir);
      if (item.grouped) {
        if (arch != kVerifiedArch)
          throw UserError(fmt::format("grouped kernels are built for sm_90a only, and this library is for {} "
                                      "(EVTC_ARCH, or the GPU's)",
                                      arch_name(arch, true)));
        const GroupedOptions go = grouped_options(ot);
        const GroupedKernel gk(g, go);
        json origin = {{"ir", print(gk.graph())},
                       {"options", code_options(option_text(go.gemm, go.cast_mode, go.precise_math, gk.config()))}};
        add_job(runtime::grouped_request(gk.graph(), go, gk.config()), "grouped", "grouped " + gk.config().name(),
                origin);
        continue;
      }
      const CompileOptions co = compile_options(ot);
      const Kernel kernel(g, co);
      if (kernel.options().gemm.sm != arch)
        throw UserError(fmt::format("it asks for {} kernels, and this library is for {} (EVTC_ARCH, or the GPU's)",
                                    arch_name(kernel.options().gemm.sm, true), arch_name(arch, true)));
      const json opts = code_options(option_text(co.gemm, co.cast_mode, co.precise_math));
      for (const ListShape& s : item.shapes) {
        KernelConfig config;
        if (s.config) {
          const auto c = KernelConfig::parse(*s.config);
          if (!c) throw UserError(fmt::format("'{}' is not a kernel configuration name", *s.config));
          config = *c;
        } else if (assumed && !co.config) {
          GemmDesc shape = kernel.options().gemm;
          shape.m = s.m;
          shape.n = s.n;
          shape.k = s.k;
          config = selection::with_kernel_options(selection::default_config_on(kernel.graph(), shape, assumed),
                                                  kernel.options());
        } else {
          config = kernel.config_for(s.m, s.n, s.k);
        }
        const std::string label =
            s.m || s.n || s.k ? fmt::format("{} for {}x{}x{}", config.name(), s.m, s.n, s.k) : config.name();
        add_job(runtime::fused_request(kernel.graph(), kernel.options(), config), "fused", label,
                {{"ir", print(kernel.graph())}, {"options", opts}, {"m", s.m}, {"n", s.n}, {"k", s.k},
                 {"config", config.name()}});
      }
      add_job(runtime::fallback_request(kernel.graph(), kernel.signature(), arch, &kernel.options().gemm), "plain",
              "plain epilogue",
              {{"ir", print(kernel.graph())}, {"options", opts}});
    } catch (const UserError& e) {
      throw UserError(fmt::format("kernel list entry {}: {}", i + 1, e.what()));
    }
  }

  // The library: a new one, or one built by this toolchain (its keys use one nvcc version).
  const jit::LibraryIdentity here = jit::current_identity(arch);
  if (here.nvcc == "none")
    throw RuntimeError("building a kernel library needs nvcc: install the CUDA toolkit, or set CUDACXX");
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "kernels", ec);
  if (ec) throw RuntimeError(fmt::format("cannot create the library folder {}: {}", dir, ec.message()));
  jit::LibraryManifest manifest;
  manifest.identity = here;
  if (fs::exists(fs::path(dir) / "manifest.json")) {
    manifest = jit::read_manifest(dir);
    std::string why = jit::identity_mismatch(manifest.identity, here);
    if (why.empty() && manifest.identity.nvcc != here.nvcc)
      why = fmt::format("it was built with nvcc {}, this is nvcc {}", manifest.identity.nvcc, here.nvcc);
    if (!why.empty())
      throw UserError(fmt::format("cannot add to the kernel library {}: {}; build into a new folder", dir, why));
  }
  std::set<std::string> present;
  for (const auto& e : manifest.kernels) present.insert(e.key);

  LibraryBuildResult result;
  result.dir = dir;
  const size_t runs_before = jit::compiler_runs();
  for (Job& j : jobs) j.future = jit::compile_in_background(j.request);
  int done = 0;
  if (progress) progress("compiling", 0, int(jobs.size()));
  for (Job& j : jobs) {
    std::string built;
    try {
      built = j.future.get();
    } catch (const std::exception& e) {
      std::string first = e.what();
      first = first.substr(0, first.find('\n'));
      result.errors.push_back(fmt::format("{}: {}", j.label, first));
    }
    if (progress) progress("compiling", ++done, int(jobs.size()));
    if (built.empty()) continue;
    const std::string key = jit::cache_key(j.request);
    if (present.count(key)) continue;
    const std::string file = "kernels/" + key + ".so";
    const fs::path target = fs::path(dir) / file;
    if (fs::weakly_canonical(built, ec) != fs::weakly_canonical(target, ec)) {
      const fs::path tmp = target.string() + fmt::format(".tmp-{}", long(getpid()));
      fs::copy_file(built, tmp, fs::copy_options::overwrite_existing, ec);
      if (!ec) fs::rename(tmp, target, ec);
      if (ec) {
        fs::remove(tmp, ec);
        throw RuntimeError(fmt::format("cannot copy {} into {}: {}", built, target.string(), ec.message()));
      }
    }
    jit::LibraryEntry e;
    e.key = key;
    e.file = file;
    e.label = j.label;
    e.kind = j.kind;
    e.bytes = fs::file_size(target);
    e.xxh3 = jit::file_checksum(target.string()).value_or("");
    e.origin_json = j.origin.dump();
    manifest.kernels.push_back(std::move(e));
    present.insert(key);
    ++result.added;
  }
  manifest.created = tuning::utc_now();
  jit::write_manifest(dir, manifest);
  result.kernels = manifest.kernels.size();
  result.compiled = jit::compiler_runs() - runs_before;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

std::string kernel_list_of(const std::string& kernels_json) {
  json kernels;
  try {
    kernels = json::parse(kernels_json);
  } catch (const json::exception& e) {
    throw UserError(fmt::format("kernel list entries: not valid JSON: {}", e.what()));
  }
  if (!kernels.is_array()) throw UserError("kernel list entries must be a JSON array");
  return list_of(std::move(kernels)).dump(1) + "\n";
}

std::vector<std::string> kernel_list_presets() { return {"transformer"}; }

std::string preset_kernel_list(const std::string& name, const std::vector<std::array<int64_t, 3>>& shapes) {
  if (name != "transformer")
    throw UserError(fmt::format("unknown kernel list preset '{}' (known: transformer)", name));
  // Linear layers: weights N×K (K-major), bf16; the gated forms over interleaved (gate, up) rows.
  const json bf16 = {{"a_dtype", "bf16"}, {"b_dtype", "bf16"}, {"a_layout", "row"}, {"b_layout", "col"}};
  const json fp8 = {{"a_dtype", "f8e4m3"}, {"b_dtype", "f8e4m3"}, {"a_layout", "row"}, {"b_layout", "col"}};
  const std::vector<std::pair<std::string, json>> exprs = {
      {"out D = acc + bias[n]", bf16},
      {"out D = gelu(acc + bias[n])", bf16},
      {"out D = gelu_tanh(acc + bias[n])", bf16},
      {"out D = silu(acc)", bf16},
      {"out D = relu_square(acc)", bf16},
      {"out D = acc + residual[m,n]", bf16},
      {"out D = acc + bias[n] + residual[m,n]", bf16},
      {"out D = swiglu(acc)", bf16},
      {"out D = geglu(acc)", bf16},
      {"input sa[m]: f32\ninput sb[n]: f32\nout D: bf16 = acc * sa[m] * sb[n]", fp8},
  };
  json list = list_of(json::array());
  for (const auto& [expr, options] : exprs) {
    json s = json::array();
    for (const auto& [m, n, k] : shapes) s.push_back({{"m", m}, {"n", n}, {"k", k}});
    json entry = {{"expr", expr}, {"options", options}};
    if (!s.empty()) entry["shapes"] = s;
    list["kernels"].push_back(entry);
  }
  return list.dump(1) + "\n";
}

// --- loading -------------------------------------------------------------------------------

KernelLibraryInfo add_kernel_library(const std::string& dir) {
  const jit::LibraryManifest m = jit::add_library(dir);
  return info_of(dir, m);
}

std::vector<std::string> kernel_libraries() { return jit::libraries(); }

KernelLibraryInfo read_kernel_library(const std::string& dir) { return info_of(dir, jit::read_manifest(dir)); }

size_t compiler_runs() { return jit::compiler_runs(); }

std::vector<CompileEvent> compile_events() { return jit::compile_events(); }

bool compiler_available() { return jit::compiler_available(); }

void set_cutlass_dir(const std::string& dir) { jit::set_cutlass_dir(dir); }
void set_cutlass_fallback_dir(const std::string& dir) { jit::set_cutlass_fallback_dir(dir); }

ToolchainInfo toolchain_info() {
  const jit::Toolchain& tc = jit::toolchain(true);
  return {tc.nvcc, tc.nvcc_version, tc.cutlass_include, tc.cutlass_version, tc.evtc_include};
}

}  // namespace evtc
