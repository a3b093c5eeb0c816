"""evtc's torch.compile backend without a GPU: the modes and options torch.compile passes to a
custom backend become Inductor's configuration (PyTorch's own translation), evtc's options are
checked, and the backend is registered under the name "evtc"."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the backend tests need torch")

from torch._dynamo.backends.registry import lookup_backend  # noqa: E402

import evtc.torch  # noqa: E402
from evtc.torch import EVTC_OPTIONS, PostGradPass, inductor_config  # noqa: E402


def test_the_backend_is_registered_by_name():
    assert lookup_backend("evtc") is evtc.torch.backend


@pytest.mark.parametrize("mode, key, value", [
    ("reduce-overhead", "triton.cudagraphs", True),
    ("max-autotune", "max_autotune", True),
    ("max-autotune-no-cudagraphs", "max_autotune", True),
])
def test_modes_become_inductor_configuration(mode, key, value):
    config = inductor_config(mode)
    assert config[key] == value
    assert isinstance(config["post_grad_custom_post_pass"], PostGradPass)


def test_max_autotune_without_cudagraphs_keeps_them_off():
    assert not inductor_config("max-autotune-no-cudagraphs").get("triton.cudagraphs", False)


def test_inductor_options_pass_through_and_evtc_options_reach_the_pass():
    config = inductor_config(None, {"triton.cudagraphs": True, "freezing": True, "evtc.merge_gated": False,
                                    "evtc.profitability": False, "evtc.cast_mode": "fast"})
    assert config["triton.cudagraphs"] and config["freezing"]
    p = config["post_grad_custom_post_pass"]
    assert (p.merge_gated, p.profitability, p.cast_mode) == (False, False, "fast")
    assert inductor_config(None, {"evtc.precise_math": True})["post_grad_custom_post_pass"].precise_math
    with pytest.raises(RuntimeError, match=r"evtc.precise_math='yes' \(expected True or False\)"):
        inductor_config(None, {"evtc.precise_math": "yes"})
    assert not any(k.startswith("evtc.") for k in config)


def test_unknown_options_are_refused_by_name():
    with pytest.raises(RuntimeError, match="unknown option.*evtc.bogus"):
        inductor_config(None, {"evtc.bogus": 1})
    with pytest.raises(RuntimeError, match="Unexpected optimization option not_an_option"):
        inductor_config(None, {"not_an_option": 1})
    with pytest.raises(RuntimeError, match="post_grad_custom_post_pass"):
        inductor_config(None, {"post_grad_custom_post_pass": None})
    with pytest.raises(RuntimeError, match=r"options sets joint_custom_post_pass, which is where evtc's own pass "
                                           r"runs; use the inductor backend with evtc.torch.WeightGradLayoutPass\(\)"):
        inductor_config(None, {"joint_custom_post_pass": None})


def test_pass_settings_change_its_cache_key():
    assert PostGradPass().uuid() != PostGradPass(merge_gated=False).uuid()
    assert PostGradPass().uuid() != PostGradPass(wait_for_compile=True).uuid()
    assert PostGradPass().uuid() != PostGradPass(precise_math=True).uuid()
    assert PostGradPass().uuid() == PostGradPass().uuid()


def test_wait_for_compile_reaches_the_pass_and_the_specs():
    assert inductor_config(None, {})["post_grad_custom_post_pass"].wait_for_compile is False
    assert inductor_config(None, {"evtc.wait_for_compile": True})["post_grad_custom_post_pass"].wait_for_compile
    with pytest.raises(RuntimeError, match="evtc.wait_for_compile=1"):
        inductor_config(None, {"evtc.wait_for_compile": 1})


def test_merge_gated_takes_a_boolean():
    with pytest.raises(RuntimeError, match="evtc.merge_gated='always'"):
        inductor_config(None, {"evtc.merge_gated": "always"})


def test_stack_siblings_takes_a_boolean_and_reaches_the_pass():
    assert inductor_config(None, {})["post_grad_custom_post_pass"].stack_siblings is True
    p = inductor_config(None, {"evtc.stack_siblings": False})["post_grad_custom_post_pass"]
    assert p.stack_siblings is False and p.uuid() != PostGradPass().uuid()
    with pytest.raises(RuntimeError, match="evtc.stack_siblings='yes'"):
        inductor_config(None, {"evtc.stack_siblings": "yes"})


def test_the_backward_graph_is_compiled_with_the_pass_and_the_mode(monkeypatch):
    # AOT autograd compiles a training graph's backward at the first backward call, after the
    # backend has returned: the pass and the mode's configuration must reach it as well.
    seen = []

    def spy(self, graph):
        seen.append((sum(n.op == "placeholder" for n in graph.nodes),
                     torch._inductor.config.max_autotune))

    monkeypatch.setattr(PostGradPass, "__call__", spy)
    torch._dynamo.reset()
    w = torch.randn(8, 8, requires_grad=True)
    f = torch.compile(lambda x: torch.sin(x @ w).sum(), backend="evtc", mode="max-autotune-no-cudagraphs")
    loss = f(torch.randn(4, 8))
    assert len(seen) == 1
    loss.backward()
    assert len(seen) == 2 and all(autotune for _, autotune in seen)
    assert w.grad is not None and w.grad.shape == (8, 8)
    torch._dynamo.reset()


def test_one_set_of_settings_for_the_pass_the_backend_and_the_fx_entry_point():
    import dataclasses

    from evtc.torch.passes import Settings

    names = {f.name for f in dataclasses.fields(Settings)}
    # The pass's settings, and the rewrite the backend makes before Inductor.
    assert set(EVTC_OPTIONS) == {f"evtc.{n}" for n in names - {"compile"}} | {"evtc.linear_cross_entropy",
                                                                             "evtc.token_logprobs"}
    defaults = Settings()
    assert inductor_config(None, {})["post_grad_custom_post_pass"].settings == defaults
    assert PostGradPass().settings == defaults
    assert PostGradPass(precise_math=True).settings == dataclasses.replace(defaults, precise_math=True)
    # The FX entry point and the pass take the settings by name, spelled once (Settings): a
    # misspelt one is refused with the list of them.
    with pytest.raises(TypeError, match="unknown evtc setting.s. merged_gated; the settings are cast_mode, "
                                        "precise_math, compile, merge_gated"):
        evtc.torch.fuse_gemm_epilogues(torch.fx.Graph(), merged_gated=False)
    with pytest.raises(TypeError, match="unknown evtc setting.s. profitable"):
        PostGradPass(profitable=False)
    # The backend checks every True/False setting as one.
    assert set(Settings.flags()) == names - {"cast_mode", "residual_sums"}
    with pytest.raises(ValueError, match="evtc setting residual_sums: unknown value 'f16'; choose one of rounded, "
                                         "f32, recomputed"):
        inductor_config(None, {"evtc.residual_sums": "f16"})
    assert inductor_config(None, {"evtc.residual_sums": "f32"})["post_grad_custom_post_pass"].residual_sums == "f32"
    for name in sorted(set(Settings.flags()) - {"compile"}):
        with pytest.raises(RuntimeError, match=rf"evtc.{name}=1 \(expected True or False\)"):
            inductor_config(None, {f"evtc.{name}": 1})
