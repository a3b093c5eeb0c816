// Kernel options as text: the one spelling of evtc's options that every front end shares
// (the Python package's keyword arguments, the PyTorch ops' specs). Each front end fills an
// OptionText; these functions turn it into the C++ option structs, with a UserError naming
// the option for a value they do not know.
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "evtc/expression.hpp"
#include "evtc/grouped.hpp"
#include "evtc/runtime.hpp"

namespace evtc {

struct OptionText {
  std::string a_dtype = "bf16", b_dtype = "bf16";  // f32, f16, bf16, f8e4m3, f8e5m2
  std::string a_layout = "row", b_layout = "col";  // row | col (row_major | col_major)
  std::string cast_mode = "eager";                 // eager | fast
  bool precise_math = false;
  bool fp8_blockwise = false;                      // see GemmDesc::fp8_blockwise
  bool disable_fusion = false;
  bool wait_for_compile = true;                    // see CompileOptions::wait_for_compile
  std::optional<std::string> config;               // a KernelConfig name
  std::optional<std::string> visit_order;          // a VisitOrder name (e.g. along_n_s8)
  std::optional<std::string> arch;                 // sm80, sm90, ... (evtc/arch.hpp); unset: the device's
  std::string operand_dtype = "bf16", output_dtype = "bf16";
};

DType dtype_option(std::string_view value, std::string_view option);
Layout layout_option(std::string_view value, std::string_view option);

CompileOptions compile_options(const OptionText& o);
// Grouped kernels take the same options; A must stay row-major.
GroupedOptions grouped_options(const OptionText& o);
ParseOptions parse_options(const OptionText& o);

// The options that decide a kernel's code, spelled as OptionText (the inverse of
// compile_options for dtypes, layouts, fp8 block scales, cast mode, precise math and a fixed
// configuration).
OptionText option_text(const GemmDesc& gemm, CastMode cast_mode, bool precise_math,
                       const std::optional<KernelConfig>& config = std::nullopt);
// `o` as the JSON object option_text_from_json reads (every field).
std::string option_text_json(const OptionText& o);

// From a JSON object such as {"a_dtype": "bf16", "b_layout": "col", "cast_mode": "eager"};
// an unknown key or a value of the wrong type is a UserError naming it.
OptionText option_text_from_json(std::string_view json_object);

}  // namespace evtc
