#include "evtc/arch.hpp"
#include "jit/kernel_library.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "evtc/device/abi.h"
#include "evtc/error.hpp"
#include "support/environment.hpp"
#include "jit/json_fields.hpp"
#include "jit/toolchain.hpp"
#include "target/device_info.hpp"
#include "support/logging.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace evtc::jit {
namespace {

constexpr const char* kFormatName = "evtc-kernel-library";

// A relative path with no "..", so an entry cannot name a file outside its library.
bool inside(const std::string& file) {
  const fs::path p(file);
  if (file.empty() || p.is_absolute()) return false;
  for (const auto& part : p)
    if (part == "..") return false;
  return true;
}

}  // namespace

LibraryIdentity current_identity(int sm) {
  LibraryIdentity id;
  id.sm = sm;
  id.arch = evtc::arch_name(sm, true);
  id.cutlass = cutlass_version_in_use();
  id.device_headers = device_headers_digest();
  id.abi = EVTC_ABI_VERSION;
  id.nvcc = compiler_available() ? toolchain(false).nvcc_version : "none";
  id.evtc = EVTC_VERSION;
  return id;
}

std::string identity_mismatch(const LibraryIdentity& lib, const LibraryIdentity& here) {
  if (lib.abi != here.abi)
    return fmt::format("its kernels have evtc's kernel ABI version {}, this evtc's is {}", lib.abi, here.abi);
  if (lib.sm != here.sm || lib.arch != here.arch)
    return fmt::format("it was built for {}, this evtc generates {} kernels", lib.arch, here.arch);
  if (lib.cutlass != here.cutlass)
    return fmt::format("it was built with CUTLASS {}, this evtc generates code for CUTLASS {}", lib.cutlass,
                       here.cutlass);
  if (lib.device_headers != here.device_headers)
    return fmt::format("it was built with other evtc device headers (digest {}, these are {}): rebuild it "
                       "with this evtc (it was built by evtc {})",
                       lib.device_headers, here.device_headers, lib.evtc);
  return "";
}

std::string cache_key_for(const CompileRequest& req, const std::string& nvcc_version) {
  std::string material = req.source;
  for (const auto& f : code_flags(req.sm, req.needs_cutlass, req.backend)) material += "\n" + f;
  if (req.in_parts) material += "\ncompiled in parts";
  static const std::string headers = device_headers_digest();
  static const std::string cutlass = cutlass_version_in_use();
  material += "\nnvcc " + nvcc_version + "\ncutlass " + (req.needs_cutlass ? cutlass : "none") +
              "\ndevice headers " + headers;
  return fmt::format("{:016x}", XXH3_64bits(material.data(), material.size()));
}

std::optional<std::string> file_checksum(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), std::streamsize(buf.size()));
    XXH3_64bits_update(state, buf.data(), size_t(f.gcount()));
  }
  const bool ok = f.eof();
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (!ok) return std::nullopt;
  return fmt::format("{:016x}", h);
}

LibraryManifest read_manifest(const std::string& dir) {
  const fs::path path = fs::path(dir) / "manifest.json";
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw UserError(fmt::format("kernel library {}: not a folder", dir));
  if (fs::is_directory(path, ec))
    throw UserError(fmt::format("kernel library {}: {} is a folder, not a file", dir, path.string()));
  std::ifstream f(path);
  if (!f) throw UserError(fmt::format("kernel library {}: no manifest.json (build one with `evtc aot build`)", dir));
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    throw UserError(fmt::format("kernel library {}: manifest.json is not valid JSON: {}", dir, e.what()));
  } catch (const std::exception& e) {  // a read error
    throw UserError(fmt::format("kernel library {}: cannot read {}: {}", dir, path.string(), e.what()));
  }
  auto bad = [&](const std::string& what) {
    return UserError(fmt::format("kernel library {}: manifest.json {}", dir, what));
  };
  // A field of the wrong type, or one missing ("has no ..."), named with where it is.
  auto bad_field = [&](const std::string& what) {
    return what.rfind("has no ", 0) == 0
               ? bad("is missing a field: the manifest " + what)
               : UserError(fmt::format("kernel library {}: manifest.json: {}", dir, what));
  };
  namespace jf = json_fields;
  const json* format = j.is_object() ? jf::find(j, "format") : nullptr;
  if (!format || !format->is_string() || *format != kFormatName)
    throw bad(fmt::format("is not an evtc kernel library manifest (its \"format\" must be \"{}\")", kFormatName));
  const json* version = jf::find(j, "format_version");
  if (!version || !version->is_number_integer() || *version != kLibraryFormatVersion)
    throw bad(fmt::format("has format version {}, this evtc reads version {}", version ? jf::shown(*version) : "(none)",
                          kLibraryFormatVersion));
  LibraryManifest m;
  try {
    LibraryIdentity& id = m.identity;
    id.sm = int(jf::integer_field(j, "sm", bad_field, std::nullopt, 0, std::numeric_limits<int>::max()));
    id.arch = jf::string_field(j, "arch", bad_field);
    id.cutlass = jf::string_field(j, "cutlass", bad_field);
    id.device_headers = jf::string_field(j, "device_headers", bad_field);
    id.abi = int(jf::integer_field(j, "abi", bad_field, std::nullopt, 0, std::numeric_limits<int>::max()));
    id.nvcc = jf::string_field(j, "nvcc", bad_field, "unknown");
    id.evtc = jf::string_field(j, "evtc", bad_field, "unknown");
    m.created = jf::string_field(j, "created", bad_field, "");
    const json& kernels = jf::required(j, "kernels", bad_field);
    if (!kernels.is_array()) throw bad_field(fmt::format("\"kernels\" must be an array, not {}", jf::shown(kernels)));
    size_t index = 0;
    for (const auto& k : kernels) {
      ++index;
      auto bad_kernel = [&](const std::string& what) {
        return what.rfind("has no ", 0) == 0 ? bad(fmt::format("is missing a field: kernel {} {}", index, what))
                                             : bad_field(fmt::format("kernel {}: {}", index, what));
      };
      if (!k.is_object()) throw bad_field(fmt::format("kernel {} must be an object, not {}", index, jf::shown(k)));
      LibraryEntry e;
      e.key = jf::string_field(k, "key", bad_kernel);
      e.file = jf::string_field(k, "file", bad_kernel);
      e.label = jf::string_field(k, "label", bad_kernel, "");
      e.kind = jf::string_field(k, "kind", bad_kernel, "");
      e.bytes = size_t(jf::integer_field(k, "bytes", bad_kernel));
      e.xxh3 = jf::string_field(k, "xxh3", bad_kernel);
      e.origin_json = k.contains("origin") ? k["origin"].dump() : "{}";
      if (!inside(e.file)) throw bad(fmt::format("names a kernel file outside the library: '{}'", e.file));
      m.kernels.push_back(std::move(e));
    }
  } catch (const json::exception& e) {
    throw bad(fmt::format("is missing a field or has one of the wrong type: {}", e.what()));
  }
  return m;
}

void write_manifest(const std::string& dir, const LibraryManifest& m) {
  json j;
  j["format"] = kFormatName;
  j["format_version"] = kLibraryFormatVersion;
  j["sm"] = m.identity.sm;
  j["arch"] = m.identity.arch;
  j["cutlass"] = m.identity.cutlass;
  j["device_headers"] = m.identity.device_headers;
  j["abi"] = m.identity.abi;
  j["nvcc"] = m.identity.nvcc;
  j["evtc"] = m.identity.evtc;
  j["created"] = m.created;
  json kernels = json::array();
  for (const LibraryEntry& e : m.kernels) {
    json k = {{"key", e.key}, {"file", e.file}, {"label", e.label}, {"kind", e.kind},
              {"bytes", e.bytes}, {"xxh3", e.xxh3}};
    k["origin"] = json::parse(e.origin_json.empty() ? "{}" : e.origin_json);
    kernels.push_back(std::move(k));
  }
  j["kernels"] = std::move(kernels);
  write_file_atomically((fs::path(dir) / "manifest.json").string(), j.dump(1) + "\n");
}

namespace {

struct Registered {
  std::string dir;
  LibraryManifest manifest;
  std::map<std::string, size_t> by_key;  // key -> index into manifest.kernels
  std::map<size_t, bool> verified;       // index -> the file matches its entry
};

struct Registry {
  std::mutex mu;
  std::vector<Registered> libs;
  bool env_read = false;
  std::set<std::string> said;  // messages already printed
};

Registry& registry() {
  static Registry r;
  return r;
}

void say_once(Registry& r, const std::string& message) {
  if (r.said.insert(message).second) log_warning("{}", message);
}

// add_library with the registry's lock held.
LibraryManifest add_locked(Registry& r, const std::string& dir_in) {
  std::error_code ec;
  const std::string dir = fs::weakly_canonical(fs::path(dir_in), ec).string();
  LibraryManifest m = read_manifest(dir.empty() ? dir_in : dir);
  const LibraryIdentity here = current_identity(target_arch());
  if (const std::string why = identity_mismatch(m.identity, here); !why.empty())
    throw UserError(fmt::format("kernel library {} is refused: {}", dir_in, why));
  if (const auto device = current_device(); device && !code_runs_on(m.identity.sm, device->arch))
    throw UserError(fmt::format("kernel library {} is refused: its kernels are {} code, which this GPU ({}, "
                                "compute capability {}.{}) cannot run",
                                dir_in, m.identity.arch, device->name, device->arch / 10, device->arch % 10));
  Registered reg;
  reg.dir = dir.empty() ? dir_in : dir;
  reg.manifest = m;
  for (size_t i = 0; i < m.kernels.size(); ++i) reg.by_key.emplace(m.kernels[i].key, i);
  std::erase_if(r.libs, [&](const Registered& x) { return x.dir == reg.dir; });
  r.libs.push_back(std::move(reg));
  return m;
}

void read_env_locked(Registry& r) {
  if (r.env_read) return;
  r.env_read = true;
  const auto v = env_text(Env::kernel_library);
  if (!v) return;
  std::stringstream dirs(*v);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) continue;
    try {
      add_locked(r, dir);
    } catch (const Error& e) {
      say_once(r, fmt::format("EVTC_KERNEL_LIBRARY: not using it: {}", e.what()));
    }
  }
}

}  // namespace

LibraryManifest add_library(const std::string& dir) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  read_env_locked(r);
  return add_locked(r, dir);
}

std::vector<std::string> libraries() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  read_env_locked(r);
  std::vector<std::string> out;
  for (const auto& l : r.libs) out.push_back(l.dir);
  return out;
}

void clear_libraries() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.libs.clear();
  r.said.clear();
  r.env_read = false;
}

std::optional<std::string> library_kernel(const CompileRequest& req) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  read_env_locked(r);
  if (r.libs.empty()) return std::nullopt;
  for (Registered& lib : r.libs) {
    if (lib.manifest.identity.sm != req.sm) continue;
    const std::string key = cache_key_for(req, lib.manifest.identity.nvcc);
    const auto it = lib.by_key.find(key);
    if (it == lib.by_key.end()) continue;
    const LibraryEntry& e = lib.manifest.kernels[it->second];
    const std::string path = (fs::path(lib.dir) / e.file).string();
    auto v = lib.verified.find(it->second);
    if (v == lib.verified.end()) {
      std::error_code ec;
      const auto size = fs::file_size(path, ec);
      bool ok = !ec && size == e.bytes;
      if (ok) ok = file_checksum(path) == e.xxh3;
      v = lib.verified.emplace(it->second, ok).first;
      if (!ok)
        say_once(r, fmt::format("kernel library {}: {} does not match its manifest entry ({}size or checksum "
                                "differs): not loaded",
                                lib.dir, e.file, ec ? "missing, or its " : ""));
    }
    if (v->second) return path;
  }
  say_once(r, fmt::format("no kernel library has a usable {} kernel for this epilogue ({}): {}", req.label,
                          cache_key_for(req, r.libs.front().manifest.identity.nvcc),
                          compiler_available() ? "compiling it" : "no nvcc here to compile it"));
  return std::nullopt;
}

}  // namespace evtc::jit
