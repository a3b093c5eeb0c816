// Tests of kernel libraries and kernel lists (src/jit/kernel_library, src/runtime/aot.cpp)
// that need no GPU and no nvcc run: the libraries here are written by hand, holding files
// that stand in for kernels (nothing is loaded), so lookups, verification, refusals and
// recording are checked without a compile. `evtc aot build` with real kernels is checked by
// the nvcc test (tests/nvcc/compile_kernels.sh).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "evtc/arch.hpp"
#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/kernel_library.hpp"
#include "evtc/options.hpp"
#include "golden_files.hpp"
#include "jit/kernel_cache.hpp"
#include "jit/kernel_library.hpp"
#include "runtime/kernel_requests.hpp"
#include "scoped_env.hpp"
#include "target/device_info.hpp"

namespace fs = std::filesystem;
using namespace evtc;
using evtc::test::read_file;
using evtc::test::ScopedEnv;
using nlohmann::json;

namespace {

class KernelLibrary : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / fmt::format("evtc-library-test-{}-{:08x}", getpid(), rd());
    fs::create_directories(dir_);
    cache_.emplace("EVTC_CACHE_DIR", (dir_ / "cache").string());
    env_.emplace("EVTC_KERNEL_LIBRARY", std::nullopt);
    quiet_.emplace("EVTC_LOG", "warning");
    jit::clear_libraries();
  }
  void TearDown() override {
    jit::clear_libraries();
    record_kernels("");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // A library in dir_/name holding a stand-in file for each request.
  fs::path make_library(const std::string& name, const std::vector<jit::CompileRequest>& requests,
                        const jit::LibraryIdentity& identity) {
    const fs::path lib = dir_ / name;
    fs::create_directories(lib / "kernels");
    jit::LibraryManifest m;
    m.identity = identity;
    for (const auto& req : requests) {
      jit::LibraryEntry e;
      e.key = jit::cache_key_for(req, identity.nvcc);
      e.file = "kernels/" + e.key + ".so";
      std::ofstream(lib / e.file, std::ios::binary) << "stand-in for " << req.label << "\n";
      e.bytes = fs::file_size(lib / e.file);
      e.xxh3 = *jit::file_checksum((lib / e.file).string());
      e.label = req.label;
      e.kind = "plain";
      m.kernels.push_back(e);
    }
    jit::write_manifest(lib.string(), m);
    return lib;
  }

  static jit::LibraryIdentity identity() {
    jit::LibraryIdentity id = jit::current_identity(90);
    id.nvcc = "12.9.41";  // where it was built: need not be this machine's
    return id;
  }

  static jit::CompileRequest request(const std::string& tag) {
    return {"// not CUDA: nvcc would fail on this\n" + tag, "test " + tag, "", false, 90};
  }

  fs::path dir_;
  std::optional<ScopedEnv> cache_, env_, quiet_;
};

TEST_F(KernelLibrary, KernelsComeFromTheLibraryWithoutACompile) {
  const auto req = request("a");
  const fs::path lib = make_library("lib", {req}, identity());
  EXPECT_FALSE(jit::library_kernel(req).has_value());  // not registered yet
  const KernelLibraryInfo info = add_kernel_library(lib.string());
  EXPECT_EQ(info.kernels.size(), 1u);
  EXPECT_EQ(info.nvcc, "12.9.41");
  const size_t runs = jit::compiler_runs();
  const std::string path = jit::compile_cached(req);  // would fail if nvcc ran on it
  EXPECT_EQ(fs::path(path).parent_path().parent_path(), fs::weakly_canonical(lib));
  EXPECT_EQ(jit::compile_in_background(req).get(), path);
  EXPECT_EQ(jit::compiler_runs(), runs);
  EXPECT_FALSE(jit::library_kernel(request("other")).has_value());
  EXPECT_EQ(kernel_libraries(), std::vector<std::string>{fs::weakly_canonical(lib).string()});
}

TEST_F(KernelLibrary, EnvironmentVariableAddsLibraries) {
  const auto a = request("env-a"), b = request("env-b");
  const fs::path l1 = make_library("l1", {a}, identity());
  const fs::path l2 = make_library("l2", {b}, identity());
  ScopedEnv env("EVTC_KERNEL_LIBRARY", l1.string() + ":" + l2.string());
  jit::clear_libraries();
  EXPECT_TRUE(jit::library_kernel(a).has_value());
  EXPECT_TRUE(jit::library_kernel(b).has_value());
  EXPECT_EQ(kernel_libraries().size(), 2u);
}

TEST_F(KernelLibrary, LibrariesBuiltForSomethingElseAreRefused) {
  struct Case {
    const char* what;
    std::function<void(jit::LibraryIdentity&)> change;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"cutlass", [](auto& id) { id.cutlass = "3.9.0"; }, "built with CUTLASS 3.9.0"},
      {"arch", [](auto& id) { id.arch = "sm_100a"; id.sm = 100; }, "built for sm_100a"},
      {"abi", [](auto& id) { id.abi = 1; }, "kernel ABI version 1"},
      {"headers", [](auto& id) { id.device_headers = "0123456789abcdef"; }, "other evtc device headers"},
  };
  for (const Case& c : cases) {
    jit::LibraryIdentity id = identity();
    c.change(id);
    const fs::path lib = make_library(std::string("bad-") + c.what, {request(c.what)}, id);
    try {
      add_kernel_library(lib.string());
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("is refused"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
    EXPECT_TRUE(kernel_libraries().empty()) << c.what;
  }
}

TEST_F(KernelLibrary, DamagedKernelFilesAreNotUsed) {
  const auto req = request("damaged"), other = request("intact");
  const fs::path lib = make_library("lib", {req, other}, identity());
  // Same size, other bytes: only the checksum tells.
  const fs::path file = lib / "kernels" / (jit::cache_key_for(req, "12.9.41") + ".so");
  std::string bytes = read_file(file);
  bytes[0] ^= 1;
  std::ofstream(file, std::ios::binary) << bytes;
  add_kernel_library(lib.string());
  EXPECT_FALSE(jit::library_kernel(req).has_value());
  EXPECT_TRUE(jit::library_kernel(other).has_value());
  // A missing file is not used either.
  fs::remove(lib / "kernels" / (jit::cache_key_for(other, "12.9.41") + ".so"));
  jit::clear_libraries();
  add_kernel_library(lib.string());
  EXPECT_FALSE(jit::library_kernel(other).has_value());
}

TEST_F(KernelLibrary, MalformedManifestsSayWhat) {
  auto expect_refused = [&](const fs::path& lib, const std::string& part) {
    try {
      add_kernel_library(lib.string());
      ADD_FAILURE() << lib << " accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_refused(dir_ / "missing", "not a folder");
  fs::create_directories(dir_ / "empty");
  expect_refused(dir_ / "empty", "no manifest.json");
  fs::create_directories(dir_ / "garbage");
  std::ofstream(dir_ / "garbage" / "manifest.json") << "{not json";
  expect_refused(dir_ / "garbage", "not valid JSON");
  fs::create_directories(dir_ / "other");
  std::ofstream(dir_ / "other" / "manifest.json") << R"J({"format": "something-else"})J";
  expect_refused(dir_ / "other", "not an evtc kernel library manifest");
  const fs::path lib = make_library("escape", {request("x")}, identity());
  json m = json::parse(read_file(lib / "manifest.json"));
  m["kernels"][0]["file"] = "../../etc/passwd";
  std::ofstream(lib / "manifest.json") << m.dump();
  expect_refused(lib, "outside the library");
  m["kernels"][0]["file"] = "kernels/x.so";
  m["kernels"][0].erase("xxh3");
  std::ofstream(lib / "manifest.json") << m.dump();
  expect_refused(lib, fmt::format("kernel library {}: manifest.json is missing a field: kernel 1 has no \"xxh3\"",
                                  lib.string()));
  // Fields of the wrong type are named, with the value found (a raw "type_error.302" before).
  const json good = json::parse(read_file(lib / "manifest.json"));
  const std::pair<std::function<void(json&)>, std::string> wrong[] = {
      {[](json& j) { j["sm"] = "90"; }, "manifest.json: \"sm\" must be a whole number from 0 to 2147483647, not \"90\""},
      {[](json& j) { j["arch"] = 90; }, "manifest.json: \"arch\" must be a string, not 90"},
      {[](json& j) { j["kernels"][0]["bytes"] = "12"; },
       "manifest.json: kernel 1: \"bytes\" must be a whole number, not \"12\""},
      {[](json& j) { j["kernels"][0]["bytes"] = -12; },
       "manifest.json: kernel 1: \"bytes\" must be a whole number, not -12"},
      {[](json& j) { j["kernels"] = "all"; }, "manifest.json: \"kernels\" must be an array, not \"all\""},
      {[](json& j) { j["format"] = 5; }, "manifest.json is not an evtc kernel library manifest"},
      {[](json& j) { j["format_version"] = "1"; }, "manifest.json has format version \"1\", this evtc reads version"},
  };
  for (const auto& [change, want] : wrong) {
    json m2 = good;
    m2["kernels"][0]["xxh3"] = "0";
    change(m2);
    std::ofstream(lib / "manifest.json") << m2.dump();
    expect_refused(lib, fmt::format("kernel library {}: {}", lib.string(), want));
  }
  // A manifest.json that is a folder (basic_filebuf::underflow error before).
  fs::create_directories(dir_ / "folder" / "manifest.json");
  expect_refused(dir_ / "folder", fmt::format("kernel library {0}: {0}/manifest.json is a folder, not a file",
                                              (dir_ / "folder").string()));
}

// The kernels a process compiles are recorded as a kernel list; rebuilt from the list (IR text
// and options), each kernel's code is the same, so its key finds the same library entry.
TEST_F(KernelLibrary, RecordedKernelsRebuildToTheSameCode) {
  const fs::path list = dir_ / "kernels.json";
  record_kernels(list.string());
  CompileOptions options;
  options.gemm.b_layout = Layout::col_major;
  options.cast_mode = CastMode::fast;
  const Kernel kernel(parse_expression("f = acc * s[m] + bias[n]; out D: bf16 = gelu_tanh(f); out r = row_sum(f)"),
                      options);
  const KernelConfig config = kernel.config_for(1000, 4096, 2048);
  const jit::CompileRequest fused = runtime::fused_request(kernel.graph(), options, config);
  const jit::CompileRequest plain = runtime::fallback_request(kernel.graph(), kernel.signature(), kVerifiedArch);
  add_kernel_library(make_library("lib", {fused, plain}, identity()).string());
  ASSERT_TRUE(kernel.in_library(1000, 4096, 2048));
  const size_t runs = jit::compiler_runs();
  const_cast<Kernel&>(kernel).compile(1000, 4096, 2048);  // from the library, recorded
  EXPECT_EQ(jit::compiler_runs(), runs);

  const json recorded = json::parse(read_file(list));
  EXPECT_EQ(recorded["format"], "evtc-kernel-list");
  ASSERT_EQ(recorded["kernels"].size(), 1u);
  const json& entry = recorded["kernels"][0];
  ASSERT_EQ(entry["shapes"].size(), 1u);
  EXPECT_EQ(entry["shapes"][0]["m"], 1000);
  EXPECT_EQ(entry["shapes"][0]["config"], config.name());
  EXPECT_EQ(entry["options"]["cast_mode"], "fast");

  const CompileOptions again = compile_options(option_text_from_json(entry["options"].dump()));
  const Kernel rebuilt(parse_canonical(entry["ir"].get<std::string>()), again);
  EXPECT_EQ(runtime::fused_request(rebuilt.graph(), again, config).source, fused.source);
  EXPECT_EQ(runtime::fallback_request(rebuilt.graph(), rebuilt.signature(), kVerifiedArch).source, plain.source);

  // A second shape adds to the entry; the same one again does not; a new process (here: a new
  // recording of the same file) keeps what is there.
  const_cast<Kernel&>(kernel).compile(1000, 4096, 2048);
  record_kernels(list.string());
  EXPECT_EQ(json::parse(read_file(list))["kernels"][0]["shapes"].size(), 1u);
}

// The pipeline's result is in canonical node order, so an epilogue's code does not depend on the
// order it was written in: the PyTorch path's spec kernels (operands declared first, names in
// graph order) and kernels rebuilt from a kernel list's IR text find the same library entries
// for their plain epilogues too.
TEST_F(KernelLibrary, EqualEpiloguesWrittenInAnotherOrderHaveTheSameCode) {
  const CompileOptions options;
  const Kernel a(parse_expression("input x0[n]: bf16\ninput x1[m,n]: bf16\nv0 = bf16(acc + x0)\n"
                                  "v1 = bf16(x1 + v0)\nout D: bf16 = v1\n"),
                 options);
  const Kernel b(parse_canonical(print(a.graph())), options);
  const Kernel c(parse_expression("input x1[m,n]: bf16\ninput x0[n]: bf16\nout D: bf16 = bf16(x1 + bf16(acc + x0))"),
                 options);
  const KernelConfig config = a.config_for(0, 0, 0);
  for (const Kernel* other : {&b, &c}) {
    EXPECT_EQ(runtime::fallback_request(other->graph(), other->signature(), kVerifiedArch).source,
              runtime::fallback_request(a.graph(), a.signature(), kVerifiedArch).source);
    EXPECT_EQ(runtime::fused_request(other->graph(), options, config).source,
              runtime::fused_request(a.graph(), options, config).source);
  }
}

TEST_F(KernelLibrary, RecordingRefusesToOverwriteOtherFiles) {
  const fs::path other = dir_ / "notes.json";
  std::ofstream(other) << R"J({"my": "data"})J";
  EXPECT_THROW(record_kernels(other.string()), UserError);
  EXPECT_EQ(read_file(other), R"J({"my": "data"})J");
}

TEST_F(KernelLibrary, MalformedKernelListsNameTheEntry) {
  auto expect_error = [&](const std::string& list, const std::string& part) {
    try {
      build_kernel_library(list, (dir_ / "out").string());
      ADD_FAILURE() << "accepted: " << list;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  const std::string head = R"J({"format": "evtc-kernel-list", "format_version": 1, "kernels": )J";
  expect_error("[]", "not an evtc kernel list");
  expect_error(head + "{}}", "\"kernels\" must be an array");
  expect_error(head + R"J([{"expr": "out D = acc"}, {"options": {}}]})J", "kernel list entry 2: needs one of");
  // Fields of the wrong type are named, with the value found (a raw "type_error.302" before); a
  // size is a whole number in int's range (4.5 was accepted, 1e300 became a negative size).
  expect_error(R"J({"format": 5})J", "kernel list: not an evtc kernel list");
  expect_error(R"J({"format": "evtc-kernel-list", "format_version": "1", "kernels": []})J",
               "kernel list: format version \"1\", this evtc reads version 1");
  expect_error(head + R"J([{"expr": 5}]})J", "kernel list entry 1: \"expr\" must be a string, not 5");
  expect_error(head + R"J([{"expr": "out D = acc", "grouped": "yes"}]})J",
               "kernel list entry 1: \"grouped\" must be true or false, not \"yes\"");
  for (const char* m : {"-1", "4.5", "1e+300", "\"8\"", "2147483648"})
    expect_error(head + R"J([{"expr": "out D = acc", "shapes": [{"n": 8}, {"m": )J" + m + "}]}]}",
                 fmt::format("kernel list entry 1: shape 2: \"m\" must be a whole number from 0 to 2147483647, not {}", m));
  expect_error(head + R"J([{"expr": "out D = acc", "shapes": [{"config": 5}]}]})J",
               "kernel list entry 1: shape 1: \"config\" must be a string, not 5");
  expect_error(head + R"J([{"expr": "out D = acc", "shapes": [{"config": "fastest"}]}]})J",
               "kernel list entry 1: 'fastest' is not a kernel configuration name");
  expect_error(head + R"J([{"expr": "out D = acc", "options": {"a_dtype": "int3"}}]})J",
               "kernel list entry 1: a_dtype: unknown dtype 'int3'");
  expect_error(head + R"J([{"expr": "out D = frobnicate(acc)"}]})J", "kernel list entry 1:");
  EXPECT_FALSE(fs::exists(dir_ / "out" / "manifest.json"));
}

TEST_F(KernelLibrary, OneArchitecturePerLibrary) {
  // A library holds kernels of one architecture (EVTC_ARCH, else the GPU's, else sm_90a): an entry
  // asking for another, or a grouped entry in a library not for sm_90a, is refused by name.
  ScopedEnv arch("EVTC_ARCH", std::nullopt);
  const std::string other = kernel_list_of(R"J([{"expr": "out D = relu(acc)", "options": {"arch": "sm100"}}])J");
  const auto expect_error = [&](const std::string& list, const std::string& part) {
    try {
      build_kernel_library(list, (dir_ / "out").string());
      ADD_FAILURE() << "accepted: " << list;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  if (target_arch() == 90)
    expect_error(other, "kernel list entry 1: it asks for sm_100a kernels, and this library is for sm_90a");
  ScopedEnv ampere("EVTC_ARCH", "sm80");
  expect_error(kernel_list_of(R"J([{"expr": "out y: bf16 = swiglu(acc)", "grouped": true}])J"),
               "kernel list entry 1: grouped kernels are built for sm_90a only, and this library is for sm_80");
  EXPECT_FALSE(fs::exists(dir_ / "out" / "manifest.json"));
}

TEST_F(KernelLibrary, AGpuClassMustHaveTablesAndTheLibrarysArchitecture) {
  // `evtc aot build --gpu CLASS`: the kernels take the choices of a GPU of that class (a machine
  // without one chooses by the rules, and its library would miss the table's kernels).
  EXPECT_EQ(kernel_library_gpus(), (std::vector<std::string>{"h100", "h200"}));
  // This machine's class: one of those on an H100 or H200, none without a GPU.
  const std::string here = kernel_library_gpu();
  if (!current_device()) EXPECT_EQ(here, "");
  const std::vector<std::string> classes = kernel_library_gpus();
  if (!here.empty()) EXPECT_NE(std::ranges::find(classes, here), classes.end()) << here;
  const std::string list = kernel_list_of(R"J([{"expr": "out D: bf16 = acc", "shapes": [{"m": 48, "n": 2048, "k": 8192}]}])J");
  const auto expect_error = [&](const std::string& gpu, const std::string& part) {
    try {
      build_kernel_library(list, (dir_ / "out").string(), {}, gpu);
      ADD_FAILURE() << "accepted: " << gpu;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_error("h300", "gpu 'h300': evtc has selection tables for h100, h200, not for that class");
  ScopedEnv ampere("EVTC_ARCH", "sm80");
  expect_error("h200", "gpu 'h200': its kernels are sm_90a, and this library is for sm_80");
  EXPECT_FALSE(fs::exists(dir_ / "out" / "manifest.json"));
}

TEST_F(KernelLibrary, LibrariesOfAnotherToolchainAreNotAddedTo) {
  jit::LibraryIdentity other = identity();
  other.cutlass = "3.9.0";
  const fs::path lib = make_library("other", {request("o")}, other);
  const std::string list = kernel_list_of(R"J([{"expr": "out D = relu(acc)"}])J");
  try {
    build_kernel_library(list, lib.string());
    ADD_FAILURE() << "added to";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot add to the kernel library"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("built with CUTLASS 3.9.0"), std::string::npos) << e.what();
  }
  try {
    kernel_list_of(R"J({"expr": "out D = acc"})J");
    ADD_FAILURE() << "an object taken as entries";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("must be a JSON array"), std::string::npos) << e.what();
  }
}

TEST_F(KernelLibrary, PresetListsParse) {
  const std::string list = preset_kernel_list("transformer", {{8192, 4096, 4096}, {128, 11008, 4096}});
  const json j = json::parse(list);
  EXPECT_GE(j["kernels"].size(), 8u);
  for (const json& k : j["kernels"]) {
    EXPECT_EQ(k["shapes"].size(), 2u);
    const OptionText o = option_text_from_json(k["options"].dump());
    EXPECT_NO_THROW(Kernel(parse_expression(k["expr"].get<std::string>(), parse_options(o)), compile_options(o)))
        << k["expr"];
  }
  EXPECT_THROW(preset_kernel_list("llama", {}), UserError);
}

}  // namespace
