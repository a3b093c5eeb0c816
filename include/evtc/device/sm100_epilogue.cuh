// sm_100a kernels without a main output D (only gated [m,n/2] outputs, reductions, or stores of
// the tree's own nodes).
//
// CUTLASS 4.2's sm100 TMA warp-specialized collective epilogue always stages the tree's result
// in shared memory and stores it to D with TMA; unlike the Hopper one it has no void-D form.
// This wrapper keeps that collective unchanged on the device and changes what D is on the host:
// its TMA descriptor describes a 1×1 tensor in a small sink at the end of the epilogue's
// workspace instead of the problem's M×N. A TMA store writes only the elements of its box that
// lie inside the tensor, so every subtile's store writes nothing, except the one at the tile
// origin, which writes the sink's single element: no global traffic beyond that, while the
// collective's pipelines, barriers and the shared-memory buffer its reductions use run as
// CUTLASS wrote them. What remains is the copy of each subtile into shared memory.
//
// The D pointer the caller passes is ignored (null for these kernels), and D's alignment rule
// does not apply; C's and the callbacks' still do.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cutlass/detail/layout.hpp>
#include <cutlass/epilogue/collective/sm100_epilogue_tma_warpspecialized.hpp>

namespace evtc::device {

template <class Collective>
struct Sm100EpilogueWithoutD : Collective {
  using Collective::Collective;
  using typename Collective::Arguments;
  using typename Collective::Params;
  using typename Collective::FusionCallbacks;

  // The sink's place in the workspace: after the callbacks' workspace, on its own 128 bytes.
  static constexpr size_t kSinkAlign = 128;
  static constexpr size_t kSinkBytes = 128;

  template <class ProblemShape>
  static size_t sink_offset(ProblemShape const& problem_shape, Arguments const& args) {
    const size_t fusion = FusionCallbacks::get_workspace_size(problem_shape, args.thread);
    return (fusion + kSinkAlign - 1) / kSinkAlign * kSinkAlign;
  }

  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const& problem_shape, Arguments const& args) {
    // The workspace pointer itself is only as aligned as its allocation: one alignment more.
    return sink_offset(problem_shape, args) + kSinkBytes + kSinkAlign;
  }

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args,
                                        void* workspace) {
    uintptr_t sink = reinterpret_cast<uintptr_t>(workspace) + sink_offset(problem_shape, args);
    sink = (sink + kSinkAlign - 1) / kSinkAlign * kSinkAlign;
    Arguments to_sink = args;
    to_sink.ptr_D = reinterpret_cast<decltype(to_sink.ptr_D)>(sink);
    // Every stride a multiple of 16 bytes, as TMA requires (the extent is 1 along each).
    using StrideD = typename Collective::StrideD;
    static_assert(cute::is_same_v<StrideD, cute::Stride<int64_t, cute::_1, int64_t>>,
                  "evtc's kernels store a row-major D");
    constexpr int64_t kPitch = 16 * 8 / cutlass::sizeof_bits<typename Collective::ElementD>::value;
    StrideD d{kPitch, cute::_1{}, kPitch};
    to_sink.dD = d;
    // The callbacks and C see the real problem; D's descriptor comes from a 1×1 problem.
    Params params = Collective::to_underlying_arguments(problem_shape, to_sink, workspace);
    auto mnkl = cute::append<4>(problem_shape, 1);
    auto one = cute::make_shape(1, 1, cute::get<2>(mnkl), 1);
    params.tma_store_d = Collective::to_underlying_arguments(one, to_sink, workspace).tma_store_d;
    return params;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto mnkl = cute::append<4>(problem_shape, 1);
    bool ok = FusionCallbacks::can_implement(problem_shape, args.thread);
    using ElementC = typename Collective::ElementC;
    if constexpr (!cute::is_void_v<ElementC>) {
      constexpr int kMinC = cutlass::detail::get_output_alignment_bits<ElementC>() /
                            cutlass::sizeof_bits<ElementC>::value;
      ok = ok && cutlass::detail::check_alignment<kMinC>(
                     cute::make_shape(cute::get<0>(mnkl), cute::get<1>(mnkl), cute::get<3>(mnkl)),
                     typename Collective::StrideC{});
    }
    return ok;
  }
};

}  // namespace evtc::device
