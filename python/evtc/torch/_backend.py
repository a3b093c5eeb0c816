"""torch.compile integration: Inductor with evtc's FX passes as its post-grad pass.

    torch.compile(model, backend=evtc.torch.backend)                       # or backend="evtc"
    torch.compile(model, backend="evtc", mode="reduce-overhead")           # CUDA graphs
    torch.compile(model, backend="evtc", options={"freezing": True})       # constant weights

``mode`` and ``options`` mean what they mean for Inductor: they are turned into Inductor
configuration by PyTorch's own wrapper (``torch._TorchCompileInductorWrapper``), so every mode
and option Inductor knows works the same way here (CUDA-graph trees for "reduce-overhead",
Inductor's autotuning of the GEMMs evtc leaves alone for "max-autotune", freezing, ...).
evtc's own options go in the same dictionary under the ``evtc.`` prefix (see
:data:`EVTC_OPTIONS`).
"""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any, Optional

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from ._cross_entropy import OPTION_VALUES as LCE_OPTION_VALUES
from ._cross_entropy import fuse_linear_cross_entropy, fuse_token_logprobs
from ._fx_pass import fuse_gemm_epilogues
from .passes import Settings
from .passes.weight_grads import WeightGradLayoutPass

# evtc's options in torch.compile's ``options`` dict, with their defaults: the FX pass's
# settings (evtc.torch.passes.Settings, where each is described) under the ``evtc.`` prefix;
# kernels always compile in the background here.
EVTC_OPTIONS = {f"evtc.{f.name}": f.default for f in dataclasses.fields(Settings) if f.name != "compile"}
# Rewrite an LM head and its cross_entropy into evtc.torch.linear_cross_entropy before AOT
# autograd traces the graph (evtc/torch/_cross_entropy.py): True (the logits saved or recomputed
# by their size), "save_logits", "recompute", or False (no rewrite).
EVTC_OPTIONS["evtc.linear_cross_entropy"] = True
# Rewrite an LM head's log-probabilities of chosen tokens (log_softmax, then gather) into
# evtc.torch.token_logprobs where no gradient is needed: True or False.
EVTC_OPTIONS["evtc.token_logprobs"] = True
# The options applied by backend() before Inductor traces the graph, not by the post-grad pass.
_REWRITE_OPTIONS = ("linear_cross_entropy", "token_logprobs")


class PostGradPass(CustomGraphPass):
    """evtc's fusion as an Inductor post-grad pass:

        torch._inductor.config.post_grad_custom_post_pass = evtc.torch.PostGradPass()

    It runs on every graph Inductor compiles: inference, and the forward and backward graphs
    of training (where tensors saved for backward become extra outputs of fused ops).
    """

    def __init__(self, **settings: Any):
        # The FX pass's settings (evtc.torch.passes.Settings: names and defaults), by keyword.
        self.settings = Settings.of(**settings)

    def __getattr__(self, name: str) -> Any:
        # The settings' values as attributes too (pass.merge_gated, pass.cast_mode, ...).
        settings = self.__dict__.get("settings")
        if settings is not None and name in {f.name for f in dataclasses.fields(Settings)}:
            return getattr(settings, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __call__(self, graph: torch.fx.Graph) -> None:
        fuse_gemm_epilogues(graph, **dataclasses.asdict(self.settings))

    def uuid(self) -> bytes:
        # Inductor's graph cache key: the pass's own source and its settings.
        h = hashlib.sha256(repr(self.settings).encode())
        for f in sorted(Path(__file__).parent.rglob("*.py")):
            h.update(f.read_bytes())
        return h.digest()


def inductor_config(mode: Optional[str] = None, options: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The Inductor configuration patches of torch.compile's ``mode``/``options``, evtc's pass
    included. evtc's own ``evtc.*`` options are taken out of ``options`` first; unknown keys
    raise as torch.compile raises for Inductor."""
    options = dict(options or {})
    ours = {key: options.pop(key) for key in list(options) if key.startswith("evtc.")}
    unknown = sorted(set(ours) - set(EVTC_OPTIONS))
    if unknown:
        raise RuntimeError(f"evtc backend: unknown option(s) {unknown}; evtc's options are {sorted(EVTC_OPTIONS)}")
    settings = {**EVTC_OPTIONS, **ours}
    for key, ours_cls in (("post_grad_custom_post_pass", "PostGradPass"),
                          ("joint_custom_post_pass", "WeightGradLayoutPass")):
        if key in options:
            raise RuntimeError(f"evtc backend: options sets {key}, which is where evtc's own pass runs; use the "
                               f"inductor backend with evtc.torch.{ours_cls}() and your pass composed instead")
    wrapper = torch._TorchCompileInductorWrapper(mode, options or None, dynamic=None)
    patches = dict(wrapper.config)
    for flag in [f"evtc.{name}" for name in Settings.flags() if name != "compile"] + ["evtc.token_logprobs"]:
        if not isinstance(settings[flag], bool):
            raise RuntimeError(f"evtc backend: {flag}={settings[flag]!r} (expected True or False)")
    lce = settings["evtc.linear_cross_entropy"]
    if not (isinstance(lce, bool) or (isinstance(lce, str) and lce in LCE_OPTION_VALUES)):
        raise RuntimeError(f"evtc backend: evtc.linear_cross_entropy={lce!r} (expected one of "
                           f"{', '.join(repr(v) for v in [*LCE_OPTION_VALUES, False])})")
    chosen = {key.removeprefix("evtc."): value for key, value in settings.items()}
    for key in _REWRITE_OPTIONS:  # applied by backend() before Inductor: not the post-grad pass's
        chosen.pop(key)
    patches["post_grad_custom_post_pass"] = PostGradPass(**chosen)
    patches["joint_custom_post_pass"] = WeightGradLayoutPass()
    return patches


def backend(gm: torch.fx.GraphModule, example_inputs, *, mode: Optional[str] = None,
            options: Optional[dict[str, Any]] = None, cast_mode: Optional[str] = None):
    """A torch.compile backend: Inductor, with GEMM epilogues fused by evtc.

        model = torch.compile(model, backend=evtc.torch.backend)
        model = torch.compile(model, backend="evtc", mode="reduce-overhead")

    ``mode`` and ``options`` are Inductor's (torch.compile passes them through);
    ``cast_mode`` is kept for calls made directly (same as ``options={"evtc.cast_mode": ...}``).
    """
    from torch._inductor.compile_fx import compile_fx

    if cast_mode is not None:
        options = {**(options or {}), "evtc.cast_mode": cast_mode}
    patches = inductor_config(mode, options)  # checks every option first
    lce = (options or {}).get("evtc.linear_cross_entropy", EVTC_OPTIONS["evtc.linear_cross_entropy"])
    if lce is not False:
        fuse_linear_cross_entropy(gm, save_logits=LCE_OPTION_VALUES[lce])
    if (options or {}).get("evtc.token_logprobs", EVTC_OPTIONS["evtc.token_logprobs"]):
        fuse_token_logprobs(gm)
    # As compile_fx's config_patches (what torch.compile's own Inductor backend does): they
    # apply around the whole compile, so that decisions compile_fx makes before its inner
    # compiles (freezing's constant inlining among them) see them, and to the inner compiles,
    # which includes the training backward graph that AOT autograd compiles at the first
    # backward call, after this function has returned: evtc's pass and the mode's settings
    # (CUDA graphs for "reduce-overhead") reach it too.
    return compile_fx(gm, example_inputs, config_patches=patches)


def _register() -> None:
    """Makes ``torch.compile(..., backend="evtc")`` work once evtc.torch is imported (the
    package's ``torch_dynamo_backends`` entry point does it without the import)."""
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

    # When the entry point is being loaded, torch registers the backend itself afterwards.
    if "evtc" not in _BACKENDS and "evtc" not in _COMPILER_FNS:
        register_backend(name="evtc")(backend)
