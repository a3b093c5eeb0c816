// Shrinking a failing random epilogue: smaller epilogues that still fail, found on the graph of
// its expression text and written back as text, so the case a differential run reports is as
// small as the failure allows (`evtc fuzz` prints it as one `evtc run ... --check` line).
//
// A step replaces one operation of the epilogue by one of its operands (`silu(acc + r[n]) * s`
// gives `acc + r[n]`, `silu(acc) * s`, `silu(r[n]) * s`, `silu(acc + r[n])`, ...). Every
// candidate parses, is smaller than the epilogue it came from, still reads the accumulator and
// is one the sm90 backend can fuse for the GEMM; the smallest come first. Shrinking keeps the
// first candidate of a batch that still fails and starts again from it, until no candidate
// fails or the rounds run out.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "evtc/expression.hpp"
#include "evtc/gemm.hpp"

namespace evtc::testing {

// The one-step simplifications of `text` (an epilogue with one or more outputs), smallest
// first, each as expression text; at most `limit`.
std::vector<std::string> shrink_candidates(const std::string& text, const ParseOptions& parse, const GemmDesc& gemm,
                                           size_t limit = 64);

struct ShrinkResult {
  std::string text;   // the smallest failing epilogue found (the input when none was smaller)
  int rounds = 0;     // batches tried
  int tried = 0;      // candidates tried
};

// `failing(batch)` runs a batch of candidates and returns the index of the first that still
// fails, or -1. Each round offers it the first `batch` candidates of the current epilogue.
ShrinkResult shrink(const std::string& text, const ParseOptions& parse, const GemmDesc& gemm,
                    const std::function<int(const std::vector<std::string>&)>& failing, int max_rounds,
                    size_t batch);

}  // namespace evtc::testing
