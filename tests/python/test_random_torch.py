"""The FX pass on random PyTorch functions (tests/python/random_torch.py), without a GPU: each
traced over fake CUDA tensors must become one fused op with no GEMM left beside it, since every
generated chain is fusable. The GPU half (bench/fuzz_torch.py) runs them against float64."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the FX pass tests need torch")

import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import evtc.torch  # noqa: E402
from random_torch import generate, make_inputs  # noqa: E402

SEED = 20261124
COUNT = 120


def cast(t, dtype):
    return t.to(dtype)


def test_generation_is_reproducible():
    assert generate(SEED, 7).source == generate(SEED, 7).source
    assert generate(SEED, 7).source != generate(SEED, 8).source


@pytest.mark.parametrize("index", range(COUNT))
def test_random_function_fuses(index):
    f = generate(SEED, index)
    fn = f.function({"torch": torch, "F": F})
    with FakeTensorMode(allow_non_fake_inputs=True):
        inputs = make_inputs(f, torch, "cuda")
        gm = make_fx(lambda *a: fn(*a, cast))(*inputs)
    report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False)
    gm.recompile()
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert len(report.fused) == 1, f"{f.source}\n{report.summary()}"
    assert torch.ops.aten.mm.default not in ops and torch.ops.aten.addmm.default not in ops, f.source
