"""evtc's FX passes, in the order they run (like the C++ pass pipeline):

1. ``merge_gated``: two GEMMs that share A and meet in a gated activation (LLaMA's gate and up
   projections), or one GEMM whose halves do (a fused gate_up projection split with chunk),
   become one gated GEMM over interleaved weights with its epilogue;
2. ``fuse_chains``: every other GEMM and its pointwise consumers become one fused op;
3. ``stack_siblings``: GEMMs left alone that read one input through weights stacked in one
   buffer (attention's q, k and v after ``evtc.torch.merge_projections``) become one GEMM.

Each fusion is made only where the cost model (``profitability``) expects it to be faster
than cuBLAS plus Inductor's kernels, and a GEMM with nothing to fuse runs in evtc's kernel only
where that kernel was measured faster than cuBLAS's; the decision and its numbers go into the
FusionReport.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from torch import fx

from .._fusion import Fusion, stable_topological_sort
from . import fuse_chains, merge_gated, stack_siblings
from .stack_siblings import Stacked


# The values of Settings.residual_sums.
RESIDUAL_SUMS = ("rounded", "f32", "recomputed")


@dataclass(frozen=True)
class Settings:
    """The FX pass's settings, with their one set of defaults: fuse_gemm_epilogues' keywords,
    PostGradPass's, and (``evtc.<name>``, all but ``compile``) torch.compile's options
    (evtc.torch.EVTC_OPTIONS)."""

    # "compile": round as Inductor's kernels would, which the fused op replaces (the GEMM's own
    # result, which cuBLAS writes, addmm's bias and _scaled_mm's scales included, and the outputs;
    # 16-bit roundings between ops elided, as Inductor elides them); "eager": round where eager
    # rounds; "fast": round only at outputs.
    cast_mode: str = "compile"
    # Full-precision transcendental math in fused epilogues (tanhf, expf, erff and IEEE
    # division, the kernel option precise_math), as Inductor's Triton kernels compute tanh and
    # erf; False takes the GPU's fast forms (include/evtc/device/math.cuh gives their errors).
    precise_math: bool = False
    # Start each new kernel's nvcc compile in the background (the FX pass alone may not).
    compile: bool = True
    # Merge GEMMs that share their input and meet in a gated activation (LLaMA's gate/up
    # projections) into one gated GEMM over interleaved weights (passes/merge_gated.py).
    merge_gated: bool = True
    # Fuse only chains the cost model expects to be faster than cuBLAS + Inductor's kernel.
    profitability: bool = True
    # Run a GEMM with nothing to fuse in evtc's kernel where the selection table measured that
    # kernel faster than cuBLAS's at or near its shape and the cost model agrees (decode-sized
    # problems, mostly); False leaves every such GEMM to cuBLAS (passes/profitability.py).
    bare_gemms: bool = True
    # False: a fused op whose kernel is still compiling runs unfused (cuBLASLt + a plain
    # epilogue) until it is ready; True: its first call waits for the compile (benchmarks).
    # EVTC_WAIT_FOR_COMPILE=1 makes every kernel wait.
    wait_for_compile: bool = False
    # Run GEMMs left unfused that read one input through weights stacked in one buffer (q, k, v
    # after evtc.torch.merge_projections) as one GEMM over that buffer (passes/stack_siblings.py).
    stack_siblings: bool = True
    # A residual sum that a fused GEMM's epilogue computes (``x + proj``) and that kernels other
    # than GEMMs read (a norm, the next residual add):
    # - "rounded": stored in the sum's own dtype, one rounding more than plain torch.compile,
    #   which computes the sum again in f32 inside each kernel that reads it (eager's rounding);
    # - "f32": stored unrounded in f32 where a reader takes it in f32 (a norm, a later epilogue
    #   that adds it), so those read what plain torch.compile computes; other readers get it
    #   rounded to its dtype (with cast_mode "eager", as "rounded");
    # - "recomputed": left out of the GEMM before it, and computed again from its two terms in
    #   the epilogue of a later GEMM that adds it, as Inductor does (the earlier GEMM's epilogue
    #   then no longer takes the add).
    # passes/fuse_chains.py; docs/python.md, "Residual sums".
    residual_sums: str = "rounded"

    def __post_init__(self):
        if self.residual_sums not in RESIDUAL_SUMS:
            raise ValueError(f"evtc setting residual_sums: unknown value {self.residual_sums!r}; "
                             f"choose one of {', '.join(RESIDUAL_SUMS)}")

    @classmethod
    def of(cls, **settings: Any) -> "Settings":
        """The settings named (the others at their defaults); a name that is not a field raises
        TypeError naming the fields."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(settings) - set(names))
        if unknown:
            raise TypeError(f"unknown evtc setting(s) {', '.join(unknown)}; the settings are {', '.join(names)}")
        return cls(**settings)

    @classmethod
    def flags(cls) -> list[str]:
        """The names of the settings that are True or False."""
        return [f.name for f in dataclasses.fields(cls) if f.type == "bool"]


@dataclass
class FusionReport:
    fused: list[Fusion] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (GEMM node, reason)
    stacked: list[Stacked] = field(default_factory=list)  # sibling GEMMs run as one (not fused)

    @property
    def fused_gemms(self) -> int:
        """GEMMs fused (a merged op counts the GEMMs it replaced)."""
        return sum(max(len(f.merged), 1) for f in self.fused)

    def _unfused(self) -> set[str]:
        """The GEMMs left unfused: each once, however many candidates it was refused in."""
        fused = {g for f in self.fused for g in (f.merged or [f.gemm])}
        return {name for name, _ in self.refused} - fused

    @property
    def gemms(self) -> int:
        """GEMMs in the graph: fused and left unfused (stacked ones included)."""
        return self.fused_gemms + len(self._unfused())

    def summary(self) -> str:
        stacked = {g for s in self.stacked for g in s.gemms}
        reasons = Counter(r for name, r in self.refused if name not in stacked)
        text = f"fused {self.fused_gemms} of {self.gemms} GEMMs"
        if self.stacked:
            text += f"; {len(stacked)} unfused ones run as {len(self.stacked)} stacked GEMM(s)"
        for reason, count in reasons.most_common():
            text += f"\n  refused x{count}: {reason}"
        for f in self.fused:
            what = f"{' + '.join(f.merged)} (merged)" if f.merged else f.gemm
            cost = ""
            if f.estimate:
                e = f.estimate
                cost = (f"; {e['fused_us']:.1f} us fused vs {e['cublas_us']:.1f} + {e['epilogue_us']:.1f} us "
                        f"unfused ({e['basis']})")
            text += f"\n  fused {what} -> {', '.join(f.outputs)} (graph {f.hash}{cost})"
        for s in self.stacked:
            text += f"\n  stacked {s.describe()}"
        return text


PIPELINE = (merge_gated.run, fuse_chains.run, stack_siblings.run)


def run(graph: fx.Graph, settings: Settings) -> FusionReport:
    report = FusionReport()
    for p in PIPELINE:
        p(graph, settings, report)
    if report.fused or report.stacked:
        stable_topological_sort(graph)
        graph.lint()
    return report
