"""evtc.torch.linear_cross_entropy's argument checks and the torch.compile rewrite's choices,
on the CPU (the GPU tests are in test_cross_entropy_gpu.py)."""
from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch integration tests need torch")
import torch.nn.functional as F  # noqa: E402

import evtc.torch  # noqa: E402
from evtc.torch import linear_cross_entropy  # noqa: E402


def test_shapes_and_dtypes_are_checked_naming_the_operand():
    h = torch.randn(8, 16, dtype=torch.bfloat16)
    w = torch.randn(32, 16, dtype=torch.bfloat16)
    t = torch.randint(0, 32, (8,))
    with pytest.raises(ValueError, match=r"weight must be \[vocab, hidden\] with hidden = h's 16"):
        linear_cross_entropy(h, w[:, :8], t)
    with pytest.raises(ValueError, match=r"h must be \[tokens, hidden\]"):
        linear_cross_entropy(h.view(2, 4, 16), w, t)
    with pytest.raises(ValueError, match=r"target must be \[tokens\] = \[8\]"):
        linear_cross_entropy(h, w, t[:4])
    with pytest.raises(TypeError, match="target must hold class indices"):
        linear_cross_entropy(h, w, t.float())
    with pytest.raises(TypeError, match="must both be bfloat16 or float16"):
        linear_cross_entropy(h.float(), w.float(), t)
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        linear_cross_entropy(h, None, t)
    with pytest.raises(ValueError, match="one CUDA device"):
        linear_cross_entropy(h, w, t)
    with pytest.raises(ValueError, match="vocab_chunk must be a positive multiple of 8"):
        linear_cross_entropy(h, w, t, vocab_chunk=12)
    with pytest.raises(ValueError, match="reduction must be one of mean, sum, none"):
        linear_cross_entropy(h, w, t, reduction="avg")


def test_token_logprobs_checks_its_arguments():
    h = torch.randn(8, 16, dtype=torch.bfloat16)
    w = torch.randn(32, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"token_logprobs: tokens must be \[tokens\] = \[8\]"):
        evtc.torch.token_logprobs(h, w, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="token_logprobs: tokens must hold class indices"):
        evtc.torch.token_logprobs(h, w, torch.zeros(8))
    with pytest.raises(ValueError, match="one CUDA device"):
        evtc.torch.token_logprobs(h, w, torch.zeros(8, dtype=torch.int64))


def test_vocabulary_chunks():
    from evtc.torch._cross_entropy import vocab_chunk_columns

    assert vocab_chunk_columns(8192, 1000) == 1000  # the whole vocabulary
    assert vocab_chunk_columns(8192, 128256) == 8192  # 8192 x 8192 x 2 bytes = 128 MiB
    assert vocab_chunk_columns(65536, 128256) == 4096  # never narrower
    assert vocab_chunk_columns(1024, 128256) == 65536


def graph_of(fn, *args):
    """The Dynamo graph of fn(*args) (compiled, not run)."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=capture, dynamic=False)(*args)
    return graphs[0]


def rewrite(fn, *args, caplog):
    gm = graph_of(fn, *args)
    with caplog.at_level(logging.DEBUG, logger="evtc.torch"):
        count = evtc.torch.fuse_linear_cross_entropy(gm)
    return count, gm, " ".join(r.getMessage() for r in caplog.records)


H = torch.randn(2, 4, 16, dtype=torch.bfloat16)
W = torch.randn(32, 16, dtype=torch.bfloat16)
T = torch.randint(0, 32, (2, 4))


@pytest.mark.parametrize("fn, reason", [
    (lambda h, w, t: F.cross_entropy(F.linear(h, w).float().view(-1, 32), t.view(-1), label_smoothing=0.1),
     "label smoothing"),
    (lambda h, w, t: F.cross_entropy(F.linear(h, w).float().view(-1, 32), t.view(-1), weight=torch.ones(32)),
     "class weights"),
    (lambda h, w, t: F.cross_entropy(F.linear(h, w, torch.ones(32, dtype=h.dtype)).float().view(-1, 32),
                                     t.view(-1)), "the LM head has a bias"),
    # [2, 4, 32] logits: cross_entropy takes dim 1 (4) as the classes.
    (lambda h, w, t: F.cross_entropy(F.linear(h, w).float(), t.view(2, 4)[:, :1].expand(2, 32) % 4), "3-d input"),
    (lambda h, w, t: F.cross_entropy(F.linear(h, w).view(-1, 32).float(), t.view(-1)), "not on a CUDA device"),
])
def test_refused_rewrites_say_why_and_leave_the_graph(fn, reason, caplog):
    count, gm, log = rewrite(fn, H, W, T, caplog=caplog)
    assert count == 0
    assert reason in log
    assert any(n.target is F.cross_entropy for n in gm.graph.nodes)


def test_logits_used_elsewhere_are_not_rewritten(caplog):
    def fn(h, w, t):
        logits = F.linear(h, w)
        return F.cross_entropy(logits.float().view(-1, 32), t.view(-1)), logits

    count, _, log = rewrite(fn, H, W, T, caplog=caplog)
    assert count == 0
    assert "its logits are used elsewhere too" in log


def test_the_option_is_checked():
    with pytest.raises(RuntimeError, match="evtc.linear_cross_entropy"):
        evtc.torch.inductor_config(options={"evtc.linear_cross_entropy": "yes"})
    assert evtc.torch.EVTC_OPTIONS["evtc.linear_cross_entropy"] is True
