// The evtc Python extension (evtc._evtc): the expression parser, explain, and Kernel.
// The Python package (python/evtc) wraps these in a friendlier API; this module stays a thin
// layer over include/evtc.
#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "evtc/error.hpp"
#include "evtc/expression.hpp"
#include "evtc/gated.hpp"
#include "evtc/grouped.hpp"
#include "evtc/ir_text.hpp"
#include "evtc/kernel_library.hpp"
#include "evtc/log.hpp"
#include "evtc/ops.hpp"
#include "evtc/options.hpp"
#include "evtc/passes.hpp"
#include "evtc/runtime.hpp"
#include "tensor_args.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace evtc::python {
namespace {

std::string_view shape_word(Shape s) {
  switch (s) {
    case Shape::scalar: return "scalar";
    case Shape::row: return "row";
    case Shape::col: return "col";
    case Shape::full: return "full";
    case Shape::half: return "half";
  }
  return "?";
}

Graph parse(const std::string& expr, const std::string& operand_dtype,
            const std::string& output_dtype) {
  OptionText o;
  o.operand_dtype = operand_dtype;
  o.output_dtype = output_dtype;
  return parse_expression(expr, parse_options(o));
}

// The Python keyword options are OptionText (evtc/options.hpp), the spelling every front end shares.
using KernelOptions = OptionText;

// One slot of the kernel's signature, D included, as a Python dict.
nb::dict slot_dict(const std::string& name, DType dtype, Shape shape, Layout layout, bool output,
                   std::string_view kind) {
  nb::dict d;
  d["name"] = name;
  d["dtype"] = std::string(dtype_name(dtype));
  d["shape"] = std::string(shape_word(shape));
  d["layout"] = layout == Layout::row_major ? "row" : "col";
  d["output"] = output;
  d["kind"] = std::string(kind);
  return d;
}

nb::list signature_list(const KernelSignature& sig) {
  nb::list out;
  if (sig.reads_c) out.append(slot_dict("C", sig.c_dtype, Shape::full, Layout::row_major, false, "source"));
  for (const OperandSlot& s : sig.pointers)
    out.append(slot_dict(s.name, s.dtype, s.shape, s.layout, s.is_output,
                         s.is_output ? (s.is_reduction ? "reduction" : "store") : node_kind_name(s.kind)));
  for (const OperandSlot& s : sig.scalars)
    out.append(slot_dict(s.name, s.dtype, Shape::scalar, Layout::row_major, false, "scalar_value"));
  if (!sig.d_name.empty())
    out.append(slot_dict(sig.d_name, sig.d_dtype, Shape::full, Layout::row_major, true, "store"));
  return out;
}

// The dtype given for an array passed as uint8 bytes (fp8), if any.
std::optional<std::string> dtype_of(const std::map<std::string, std::string>& dtypes,
                                    const std::string& name) {
  auto it = dtypes.find(name);
  return it == dtypes.end() ? std::nullopt : std::optional(it->second);
}

// Runs the kernel. `tensors` maps operand and output names (and "C") to arrays; `dtypes`
// gives the dtype of fp8 arrays passed as uint8; `scalars` holds by-value parameters.
std::string run_kernel(const Kernel& kernel, const nb::ndarray<>& a, const nb::ndarray<>& b,
                       const std::map<std::string, nb::ndarray<>>& tensors,
                       const std::map<std::string, std::string>& dtypes,
                       const std::map<std::string, double>& scalars, uintptr_t stream) {
  Arguments args;
  args.a(tensor_ref(a, "operand A", dtype_of(dtypes, "A")));
  args.b(tensor_ref(b, "operand B", dtype_of(dtypes, "B")));
  for (const auto& [name, array] : tensors) {
    const TensorRef t = tensor_ref(array, name[0] == '@' ? name.substr(1) : fmt::format("'{}'", name),
                                   dtype_of(dtypes, name));
    // "@scale_a"/"@scale_b": fp8 block scales (not identifiers, so no operand can take the names).
    if (name == "C") args.c(t);
    else if (name == "@scale_a") args.scale_a(t);
    else if (name == "@scale_b") args.scale_b(t);
    else args.set(name, t);
  }
  for (const auto& [name, value] : scalars) args.set(name, value);
  nb::gil_scoped_release release;  // a first call may compile for a minute
  const ExecutionPath path = kernel.run(args, reinterpret_cast<cudaStream_t>(stream));
  return path == ExecutionPath::fused ? "fused" : "fallback";
}

// Runs a grouped kernel: x (sum of M_g × K), w (G × K × N as torch._grouped_mm takes it),
// offsets (G int32 end offsets on the device); `tensors` holds the epilogue's operands and
// the output by name; `k_major`: the kernel was built for K-major weights (b_layout 'col').
std::string run_grouped(const GroupedKernel& kernel, const nb::ndarray<>& x, const nb::ndarray<>& w,
                 const nb::ndarray<>& offsets, const std::map<std::string, nb::ndarray<>>& tensors,
                 const std::map<std::string, std::string>& dtypes,
                 const std::map<std::string, double>& scalars, bool k_major, uintptr_t stream) {
  const nb::dlpack::dtype ot = offsets.dtype();
  if (offsets.device_type() != nb::device::cuda::value || offsets.ndim() != 1 ||
      ot.code != uint8_t(nb::dlpack::dtype_code::Int) || ot.bits != 32 || ot.lanes != 1 ||
      (offsets.shape(0) > 1 && offsets.stride(0) != 1))
    throw UserError("offsets must be a contiguous 1-D int32 CUDA array (the groups' end offsets)");
  GroupedArguments args;
  args.x(tensor_ref(x, "x", dtype_of(dtypes, "x")));
  args.weights(batched_tensor_ref(w, "weights", k_major));
  args.offsets(static_cast<const int32_t*>(offsets.data()), int64_t(offsets.shape(0)));
  for (const auto& [name, array] : tensors) {
    // "@scale_a"/"@scale_b": fp8 block scales; scale_b is G × ceil(K/128) × ceil(N/128), oriented
    // like w, and read as the G × ceil(N/128) × ceil(K/128) blocks of the weights.
    if (name == "@scale_a") args.scale_a(tensor_ref(array, "scale_a", dtype_of(dtypes, name)));
    else if (name == "@scale_b") args.scale_b(batched_tensor_ref(array, "scale_b", true));
    else args.set(name, tensor_ref(array, fmt::format("'{}'", name), dtype_of(dtypes, name)));
  }
  for (const auto& [name, value] : scalars) args.set(name, value);
  nb::gil_scoped_release release;  // a first call may compile for a minute
  const ExecutionPath path = kernel.run(args, reinterpret_cast<cudaStream_t>(stream));
  return path == ExecutionPath::fused ? "fused" : "fallback";
}

nb::dict explain(const std::string& expr, const std::string& dtype, bool passes) {
  Graph g = parse(expr, dtype, dtype);
  nb::dict out;
  out["parsed"] = print(g);
  nb::list steps;
  if (passes) {
    g = run_pipeline(g, PipelineOptions{}, [&](const PassInfo& pass, const Graph& after, bool changed) {
      nb::dict step;
      step["name"] = std::string(pass.name);
      step["summary"] = std::string(pass.summary);
      step["changed"] = changed;
      step["ir"] = print(after);
      steps.append(step);
    });
  }
  const Legality legality = check_legality(g, GemmDesc{});
  out["ir"] = print(g);
  out["hash"] = graph_hash_hex(g);
  out["passes"] = steps;
  out["fusable"] = legality.fusable();
  out["reasons"] = legality.reasons;
  return out;
}

nb::dict library_dict(const KernelLibraryInfo& info) {
  nb::dict d;
  d["dir"] = info.dir;
  d["arch"] = info.arch;
  d["cutlass"] = info.cutlass;
  d["nvcc"] = info.nvcc;
  d["evtc"] = info.evtc;
  d["created"] = info.created;
  nb::list kernels;
  for (const auto& k : info.kernels) {
    nb::dict e;
    e["key"] = k.key;
    e["file"] = k.file;
    e["label"] = k.label;
    e["kind"] = k.kind;
    e["bytes"] = k.bytes;
    e["origin"] = k.origin_json;
    kernels.append(e);
  }
  d["kernels"] = kernels;
  return d;
}

// ParseError keeps its line and column as attributes of the Python exception.
void register_exceptions(nb::module_& m) {
  static nb::exception<Error> error(m, "Error", PyExc_RuntimeError);
  static nb::exception<RuntimeError> runtime_error(m, "EvtcRuntimeError", error.ptr());
  static nb::exception<InternalError> internal_error(m, "InternalError", error.ptr());
  // Bad input is also a ValueError (ParseError with it), so `except ValueError` catches it too.
  static nb::object user_bases = nb::make_tuple(nb::handle(error.ptr()), nb::handle(PyExc_ValueError));
  static nb::exception<UserError> user_error(m, "UserError", user_bases);
  // An argument of the wrong Python type (raised by the Python package): also a TypeError.
  m.attr("ArgumentTypeError") = nb::steal(PyErr_NewException(
      "evtc._evtc.ArgumentTypeError", nb::make_tuple(nb::handle(user_error.ptr()), nb::handle(PyExc_TypeError)).ptr(),
      nullptr));
  static nb::object parse_error_type = [&] {
    nb::object type = nb::steal(PyErr_NewException("evtc._evtc.ParseError", user_error.ptr(), nullptr));
    m.attr("ParseError") = type;
    return type;
  }();
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ParseError& e) {
      nb::object exc = parse_error_type(nb::str(e.what()));
      exc.attr("line") = e.line();
      exc.attr("column") = e.column();
      PyErr_SetObject(parse_error_type.ptr(), exc.ptr());
    }
  });
}

}  // namespace
}  // namespace evtc::python

NB_MODULE(_evtc, m) {
  using namespace evtc;
  using namespace evtc::python;
  m.doc() = "evtc: fused GEMM epilogues for Hopper GPUs (native module)";
  // Kernels live in process-wide caches (evtc.torch's spec cache) until exit, so nanobind's
  // report of instances still alive at interpreter shutdown would only be noise.
  nb::set_leak_warnings(false);
  register_exceptions(m);
  // The K (and N) extent of an fp8 block scale (GemmDesc::fp8_blockwise).
  m.attr("FP8_SCALE_BLOCK") = kFp8ScaleBlock;

  nb::class_<KernelOptions>(m, "KernelOptions")
      .def(nb::init<>())
      .def_rw("a_dtype", &KernelOptions::a_dtype)
      .def_rw("arch", &KernelOptions::arch)
      .def_rw("b_dtype", &KernelOptions::b_dtype)
      .def_rw("a_layout", &KernelOptions::a_layout)
      .def_rw("b_layout", &KernelOptions::b_layout)
      .def_rw("cast_mode", &KernelOptions::cast_mode)
      .def_rw("precise_math", &KernelOptions::precise_math)
      .def_rw("fp8_blockwise", &KernelOptions::fp8_blockwise)
      .def_rw("disable_fusion", &KernelOptions::disable_fusion)
      .def_rw("wait_for_compile", &KernelOptions::wait_for_compile)
      .def_rw("config", &KernelOptions::config, nb::arg().none())
      .def_rw("visit_order", &KernelOptions::visit_order, nb::arg().none())
      .def_rw("operand_dtype", &KernelOptions::operand_dtype)
      .def_rw("output_dtype", &KernelOptions::output_dtype);

  nb::class_<UnfusedWork>(m, "UnfusedWork")
      .def(nb::init<>())
      .def_rw("saved_bytes", &UnfusedWork::saved_bytes)
      .def_rw("kernels", &UnfusedWork::kernels)
      .def_rw("gemms", &UnfusedWork::gemms);

  nb::class_<FusionEstimate>(m, "FusionEstimate")
      .def_ro("m", &FusionEstimate::m)
      .def_ro("n", &FusionEstimate::n)
      .def_ro("k", &FusionEstimate::k)
      .def_ro("cublas_us", &FusionEstimate::cublas_us)
      .def_ro("epilogue_us", &FusionEstimate::epilogue_us)
      .def_ro("fused_us", &FusionEstimate::fused_us)
      .def_ro("saved_bytes", &FusionEstimate::saved_bytes)
      .def_ro("config", &FusionEstimate::config)
      .def_ro("basis", &FusionEstimate::basis)
      .def_ro("measured", &FusionEstimate::measured)
      .def_prop_ro("profitable", &FusionEstimate::profitable)
      .def("describe", &FusionEstimate::describe);

  nb::class_<Kernel>(m, "Kernel")
      .def("__init__",
           [](Kernel* self, const std::string& expr, const KernelOptions& o) {
             new (self) Kernel(parse(expr, o.operand_dtype, o.output_dtype), compile_options(o));
           },
           "expr"_a, "options"_a)
      .def_prop_ro("ir", [](const Kernel& k) { return print(k.graph()); })
      .def_prop_ro("hash", [](const Kernel& k) { return graph_hash_hex(k.graph()); })
      .def_prop_ro("signature", [](const Kernel& k) { return signature_list(k.signature()); })
      .def_prop_ro("library_path", &Kernel::library_path)
      .def("compile", &Kernel::compile, "m"_a = 0, "n"_a = 0, "k"_a = 0,
           nb::call_guard<nb::gil_scoped_release>())
      .def("compile_fallback", &Kernel::compile_fallback, nb::call_guard<nb::gil_scoped_release>())
      .def("config_for", [](const Kernel& k, int64_t m, int64_t n, int64_t kk) {
             return k.config_for(m, n, kk).name();
           }, "m"_a, "n"_a, "k"_a)
      .def("config_source", [](const Kernel& k, int64_t m, int64_t n, int64_t kk) {
             return k.config_choice(m, n, kk).describe();
           }, "m"_a, "n"_a, "k"_a)
      .def("visit_order_for", [](const Kernel& k, int64_t m, int64_t n, int64_t kk) {
             return k.config_choice(m, n, kk).order.name();
           }, "m"_a, "n"_a, "k"_a)
      .def("fallback_reason", &Kernel::fallback_reason, "m"_a, "n"_a, "k"_a)
      .def("in_library", &Kernel::in_library, "m"_a, "n"_a, "k"_a)
      .def("estimate", &Kernel::estimate, "m"_a, "n"_a, "k"_a, "unfused"_a)
      .def("run", &run_kernel, "a"_a, "b"_a, "tensors"_a, "dtypes"_a, "scalars"_a, "stream"_a);

  nb::class_<GroupedKernel>(m, "GroupedKernel")
      .def("__init__",
           [](GroupedKernel* self, const std::string& expr, const KernelOptions& o) {
             new (self) GroupedKernel(parse(expr, o.operand_dtype, o.output_dtype), grouped_options(o));
           },
           "expr"_a, "options"_a)
      .def_prop_ro("ir", [](const GroupedKernel& k) { return print(k.graph()); })
      .def_prop_ro("hash", [](const GroupedKernel& k) { return graph_hash_hex(k.graph()); })
      .def_prop_ro("signature", [](const GroupedKernel& k) { return signature_list(k.signature()); })
      .def_prop_ro("config", [](const GroupedKernel& k) { return k.config().name(); })
      .def_prop_ro("output_name", &GroupedKernel::output_name)
      .def_prop_ro("output_dtype", [](const GroupedKernel& k) { return std::string(dtype_name(k.output_dtype())); })
      .def_prop_ro("gated", &GroupedKernel::gated)
      .def_prop_ro("source", &GroupedKernel::source)
      .def("shape_reason", &GroupedKernel::shape_reason, "n"_a, "k"_a)
      .def("estimate", &GroupedKernel::estimate, "total_m"_a, "n"_a, "k"_a, "groups"_a, "unfused"_a)
      .def("compile", &GroupedKernel::compile, nb::call_guard<nb::gil_scoped_release>())
      .def("compile_fallback", &GroupedKernel::compile_fallback, nb::call_guard<nb::gil_scoped_release>())
      .def("in_library", &GroupedKernel::in_library)
      .def("run", &run_grouped, "x"_a, "w"_a, "offsets"_a, "tensors"_a, "dtypes"_a, "scalars"_a, "k_major"_a, "stream"_a);

  // The rules the PyTorch layer applies to framework tensors, from the one C++ source.
  m.def("place_operand",
        [](const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, const std::vector<int64_t>& full) {
          const OperandPlacement p = place_operand(sizes, strides, full);
          return nb::make_tuple(std::string(load_class_name(p.load)), p.needs_copy, p.why);
        },
        "sizes"_a, "strides"_a, "full"_a);
  m.def("matrix_layout",
        [](int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) -> std::optional<std::string> {
          const auto l = matrix_layout(rows, cols, row_stride, col_stride);
          if (!l) return std::nullopt;
          return std::string(*l == Layout::row_major ? "row" : "col");
        },
        "rows"_a, "cols"_a, "row_stride"_a, "col_stride"_a);
  m.def("interleaved_strides",
        [](const std::vector<int64_t>& sizes, const std::vector<int64_t>& gate_strides, int64_t gate_offset,
           const std::vector<int64_t>& up_strides, int64_t up_offset, int64_t dim) {
          return interleaved_strides(sizes, gate_strides, gate_offset, up_strides, up_offset, dim);
        },
        "sizes"_a, "gate_strides"_a, "gate_offset"_a, "up_strides"_a, "up_offset"_a, "dim"_a);
  m.def("parse", [](const std::string& expr, const std::string& dtype) {
          return print(parse(expr, dtype, dtype));
        }, "expr"_a, "dtype"_a = "bf16");
  m.def("device_refusal", &python::device_refusal, "device_type"_a, "what"_a);
  m.def("explain", &explain, "expr"_a, "dtype"_a = "bf16", "passes"_a = false);
  // Kernel libraries (evtc/kernel_library.hpp).
  m.def("add_kernel_library", [](const std::string& dir) { return library_dict(add_kernel_library(dir)); }, "dir"_a);
  m.def("read_kernel_library", [](const std::string& dir) { return library_dict(read_kernel_library(dir)); }, "dir"_a);
  m.def("kernel_libraries", &kernel_libraries);
  m.def("record_kernels", &record_kernels, "path"_a);
  m.def("kernel_library_gpus", &kernel_library_gpus);
  m.def("kernel_library_gpu", &kernel_library_gpu);
  m.def("build_kernel_library",
        [](const std::string& list, const std::string& dir, const std::string& gpu) {
          LibraryBuildResult r;
          {
            nb::gil_scoped_release release;
            r = build_kernel_library(list, dir, {}, gpu);
          }
          nb::dict d;
          d["dir"] = r.dir;
          d["kernels"] = r.kernels;
          d["added"] = r.added;
          d["compiled"] = r.compiled;
          d["seconds"] = r.seconds;
          d["errors"] = r.errors;
          return d;
        },
        "kernel_list"_a, "dir"_a, "gpu"_a = "");
  m.def("preset_kernel_list", &preset_kernel_list, "name"_a, "shapes"_a);
  m.def("kernel_list_of", &kernel_list_of, "kernels_json"_a);
  m.def("compiler_runs", &compiler_runs);
  m.def("compiler_available", &compiler_available);
  m.def("set_cutlass_dir", &set_cutlass_dir, "dir"_a);
  m.def("set_cutlass_fallback_dir", &set_cutlass_fallback_dir, "dir"_a);
  m.def("toolchain", [] {
    const ToolchainInfo t = toolchain_info();
    nb::dict d;
    d["nvcc"] = t.nvcc;
    d["nvcc_version"] = t.nvcc_version;
    d["cutlass_include"] = t.cutlass_include;
    d["cutlass_version"] = t.cutlass_version;
    d["device_headers"] = t.device_headers;
    return d;
  });
  m.def("compile_events", [] {
    nb::list out;
    for (const CompileEvent& e : compile_events()) {
      nb::dict d;
      d["key"] = e.key;
      d["label"] = e.label;
      d["what"] = e.what;
      d["seconds"] = e.seconds;
      out.append(d);
    }
    return out;
  });
  m.def("log_level", [] { return std::string(log_level_name(log_level())); });
  m.def("set_log_level", [](const std::string& name) {
    const auto level = parse_log_level(name);
    if (!level) throw UserError(fmt::format("log level '{}': expected one of {}", name, fmt::join(log_level_names(), ", ")));
    set_log_level(*level);
  });
  m.def("log_level_names", &log_level_names);
  m.def("dtype_names", &dtype_names);
  // The tile visiting orders the tuner tries (CUTLASS's first) and the margin by which another is
  // kept (evtc/kernel_config.hpp): the table's sweep, bench/gemm_shapes.py, uses the same.
  m.def("visit_orders", [] {
    std::vector<std::string> names;
    for (const VisitOrder& o : VisitOrder::all()) names.push_back(o.name());
    return names;
  });
  m.attr("VISIT_ORDER_MARGIN") = VisitOrder::keep_margin;
  // A and B of fused kernels (evtc/types.hpp): the FX pass's GEMM operand dtypes.
  m.def("tensor_core_input_dtypes", &tensor_core_input_names);
  m.def("torch_dtype_names", [] {
    std::map<std::string, std::string> names;
    for (const std::string& name : dtype_names()) names[name] = std::string(torch_dtype_name(*parse_dtype(name)));
    return names;
  });
  // The comparisons' IR names (which are also their ATen names) and operators, from the op table.
  m.def("comparison_operators", [] {
    std::map<std::string, std::string> ops;
    for (const OpInfo& info : op_table())
      if (info.comparison) ops[std::string(info.name)] = std::string(info.infix);
    return ops;
  });
  m.def("version", [] { return std::string(version()); });
  m.def("pass_names", [] {
    std::vector<std::string> names;
    for (const PassInfo& p : pipeline_passes()) names.emplace_back(p.name);
    return names;
  });
}
