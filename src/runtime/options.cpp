#include "evtc/options.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "evtc/arch.hpp"
#include "evtc/error.hpp"

namespace evtc {

DType dtype_option(std::string_view value, std::string_view option) {
  if (auto d = parse_dtype(value); d && !is_integer(*d)) return *d;
  if (auto d = parse_dtype(value))
    throw UserError(fmt::format("{}: {} is an integer dtype, allowed only for [m] and [n] input vectors (declared "
                                "in the expression: `input t[m]: {}`); expected {}",
                                option, value, dtype_name(*d), or_list(float_dtype_names())));
  throw UserError(fmt::format("{}: unknown dtype '{}' (expected {})", option, value, or_list(float_dtype_names())));
}

Layout layout_option(std::string_view value, std::string_view option) {
  if (value == "row" || value == "row_major") return Layout::row_major;
  if (value == "col" || value == "col_major") return Layout::col_major;
  throw UserError(fmt::format("{}: unknown layout '{}' (expected 'row' or 'col')", option, value));
}

CompileOptions compile_options(const OptionText& o) {
  CompileOptions c;
  c.gemm.a_dtype = dtype_option(o.a_dtype, "a_dtype");
  c.gemm.b_dtype = dtype_option(o.b_dtype, "b_dtype");
  c.gemm.a_layout = layout_option(o.a_layout, "a_layout");
  c.gemm.b_layout = layout_option(o.b_layout, "b_layout");
  if (const auto mode = cast_mode_named(o.cast_mode)) c.cast_mode = *mode;
  else
    throw UserError(fmt::format("cast_mode: unknown mode '{}' (expected one of '{}')", o.cast_mode,
                                fmt::join(cast_mode_names(), "', '")));
  c.precise_math = o.precise_math;
  c.gemm.fp8_blockwise = o.fp8_blockwise;
  if (std::string why = fp8_blockwise_refusal(c.gemm); !why.empty()) throw UserError(why);
  c.disable_fusion = o.disable_fusion;
  c.wait_for_compile = o.wait_for_compile;
  if (o.arch) c.arch = parse_arch(*o.arch, "arch");
  if (o.config) {
    c.config = KernelConfig::parse(*o.config);
    if (!c.config)
      throw UserError(fmt::format("config: '{}' is not a kernel configuration name (e.g. "
                                  "coop_128x256x64_c2x1_persistent)",
                                  *o.config));
  }
  if (o.visit_order) {
    c.visit_order = VisitOrder::parse(*o.visit_order);
    if (!c.visit_order)
      throw UserError(fmt::format("visit_order: '{}' is not a tile visiting order ({})", *o.visit_order,
                                  VisitOrder::forms()));
  }
  return c;
}

GroupedOptions grouped_options(const OptionText& o) {
  const CompileOptions c = compile_options(o);
  if (c.gemm.a_layout != Layout::row_major)
    throw UserError("a_layout: a grouped kernel's token matrix x must be row-major ('row')");
  if (c.visit_order)
    throw UserError("visit_order: grouped kernels visit each group's tiles in CUTLASS's order; the option is for "
                    "dense kernels");
  GroupedOptions g;
  g.gemm = c.gemm;
  g.config = c.config;
  g.cast_mode = c.cast_mode;
  g.precise_math = c.precise_math;
  g.wait_for_compile = c.wait_for_compile;
  g.arch = c.arch;
  return g;
}

ParseOptions parse_options(const OptionText& o) {
  ParseOptions p;
  p.operand_dtype = dtype_option(o.operand_dtype, "operand_dtype");
  p.output_dtype = dtype_option(o.output_dtype, "output_dtype");
  return p;
}

OptionText option_text(const GemmDesc& gemm, CastMode cast_mode, bool precise_math,
                       const std::optional<KernelConfig>& config) {
  OptionText o;
  o.a_dtype = dtype_name(gemm.a_dtype);
  o.b_dtype = dtype_name(gemm.b_dtype);
  o.a_layout = gemm.a_layout == Layout::row_major ? "row" : "col";
  o.b_layout = gemm.b_layout == Layout::row_major ? "row" : "col";
  o.cast_mode = std::string(cast_mode_name(cast_mode));
  o.precise_math = precise_math;
  o.fp8_blockwise = gemm.fp8_blockwise;
  if (config) o.config = config->name();
  return o;
}

std::string option_text_json(const OptionText& o) {
  nlohmann::json j = {{"a_dtype", o.a_dtype},       {"b_dtype", o.b_dtype},
                      {"a_layout", o.a_layout},     {"b_layout", o.b_layout},
                      {"cast_mode", o.cast_mode},   {"precise_math", o.precise_math},
                      {"fp8_blockwise", o.fp8_blockwise},
                      {"disable_fusion", o.disable_fusion}, {"wait_for_compile", o.wait_for_compile},
                      {"operand_dtype", o.operand_dtype}, {"output_dtype", o.output_dtype}};
  j["config"] = o.config ? nlohmann::json(*o.config) : nlohmann::json(nullptr);
  j["arch"] = o.arch ? nlohmann::json(*o.arch) : nlohmann::json(nullptr);
  j["visit_order"] = o.visit_order ? nlohmann::json(*o.visit_order) : nlohmann::json(nullptr);
  return j.dump();
}

OptionText option_text_from_json(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(fmt::format("kernel options are not JSON: {}", e.what()));
  }
  if (!j.is_object()) throw UserError("kernel options must be a JSON object");
  OptionText o;
  for (const auto& [key, value] : j.items()) {
    auto text = [&](std::string& field) {
      if (!value.is_string()) throw UserError(fmt::format("option {}: expected a string, got {}", key, value.dump()));
      field = value.get<std::string>();
    };
    auto flag = [&](bool& field) {
      if (!value.is_boolean()) throw UserError(fmt::format("option {}: expected true or false, got {}", key, value.dump()));
      field = value.get<bool>();
    };
    if (key == "a_dtype") text(o.a_dtype);
    else if (key == "b_dtype") text(o.b_dtype);
    else if (key == "a_layout") text(o.a_layout);
    else if (key == "b_layout") text(o.b_layout);
    else if (key == "cast_mode") text(o.cast_mode);
    else if (key == "operand_dtype") text(o.operand_dtype);
    else if (key == "output_dtype") text(o.output_dtype);
    else if (key == "precise_math") flag(o.precise_math);
    else if (key == "fp8_blockwise") flag(o.fp8_blockwise);
    else if (key == "disable_fusion") flag(o.disable_fusion);
    else if (key == "wait_for_compile") flag(o.wait_for_compile);
    else if (key == "arch") {
      if (value.is_null()) o.arch.reset();
      else if (value.is_string()) o.arch = value.get<std::string>();
      else throw UserError(fmt::format("option arch: expected an architecture such as \"sm80\", got {}", value.dump()));
    } else if (key == "config") {
      if (value.is_null()) o.config.reset();
      else if (value.is_string()) o.config = value.get<std::string>();
      else throw UserError(fmt::format("option config: expected a configuration name, got {}", value.dump()));
    } else if (key == "visit_order") {
      if (value.is_null()) o.visit_order.reset();
      else if (value.is_string()) o.visit_order = value.get<std::string>();
      else throw UserError(fmt::format("option visit_order: expected a visiting order such as \"along_n_s8\", got {}",
                                       value.dump()));
    } else {
      throw UserError(fmt::format("unknown kernel option '{}' (known: a_dtype, b_dtype, a_layout, b_layout, "
                                  "cast_mode, precise_math, fp8_blockwise, disable_fusion, wait_for_compile, config, "
                                  "visit_order, arch, operand_dtype, output_dtype)",
                                  key));
    }
  }
  return o;
}

}  // namespace evtc
