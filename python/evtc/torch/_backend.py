"""torch.compile integration: Inductor with evtc's FX pass as its post-grad pass."""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from ._fx_pass import fuse_gemm_epilogues


class PostGradPass(CustomGraphPass):
    """evtc's fusion as an Inductor post-grad pass:

        torch._inductor.config.post_grad_custom_post_pass = evtc.torch.PostGradPass()

    It runs on every graph Inductor compiles: inference, and the forward and backward graphs
    of training (where tensors saved for backward become extra outputs of fused ops).
    """

    def __init__(self, cast_mode: str = "eager"):
        self.cast_mode = cast_mode

    def __call__(self, graph: torch.fx.Graph) -> None:
        fuse_gemm_epilogues(graph, cast_mode=self.cast_mode)

    def uuid(self) -> bytes:
        # Inductor's graph cache key: the pass's own source and its options.
        h = hashlib.sha256(self.cast_mode.encode())
        for f in sorted(Path(__file__).parent.glob("*.py")):
            h.update(f.read_bytes())
        return h.digest()


def backend(gm: torch.fx.GraphModule, example_inputs, *, cast_mode: str = "eager"):
    """A torch.compile backend: Inductor, with GEMM epilogues fused by evtc.

        model = torch.compile(model, backend=evtc.torch.backend)
    """
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs,
                      config_patches={"post_grad_custom_post_pass": PostGradPass(cast_mode)})
