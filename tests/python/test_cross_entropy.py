"""evtc.torch.linear_cross_entropy's argument checks and the torch.compile rewrite's choices,
on the CPU (the GPU tests are in test_cross_entropy_gpu.py)."""
from __future__ import annotations

import logging
import operator

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
    with pytest.raises(ValueError, match="save_logits must be True, False or None"):
        linear_cross_entropy(h, w, t, save_logits="yes")


def test_loss_and_logits_checks_its_arguments():
    h = torch.randn(8, 16, dtype=torch.bfloat16)
    w = torch.randn(32, 16, dtype=torch.bfloat16)
    t = torch.randint(0, 32, (8,))
    with pytest.raises(ValueError, match="linear_cross_entropy_and_logits: reduction must be one of mean, sum, none, "
                                         "got 'avg'"):
        evtc.torch.linear_cross_entropy_and_logits(h, w, t, reduction="avg")
    with pytest.raises(ValueError, match=r"linear_cross_entropy_and_logits: target must be \[tokens\] = \[8\]"):
        evtc.torch.linear_cross_entropy_and_logits(h, w, t[:4])
    with pytest.raises(ValueError, match="linear_cross_entropy_and_logits: h, weight and target must be on one CUDA"):
        evtc.torch.linear_cross_entropy_and_logits(h, w, t)


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


def test_logits_are_saved_by_their_size():
    from evtc.torch._cross_entropy import SAVED_LOGITS_BYTES, saves_logits

    assert SAVED_LOGITS_BYTES == 1 << 30
    assert saves_logits(8192, 32000)  # 500 MiB in bf16
    assert saves_logits(8192, 65536)  # exactly 1 GiB
    assert not saves_logits(8192, 65536 + 1)
    assert not saves_logits(8192, 128256)  # 2 GiB
    assert not saves_logits(8192, 65536, torch.float32)


@pytest.mark.parametrize("block_bytes", [None, 3 * 4 * 40])  # the whole at once; 3 rows at a time
def test_the_saved_logits_gradient_is_cross_entropys(block_bytes, monkeypatch):
    """(exp(logits - lse) - one_hot(target)) * g against float64 autograd of cross_entropy, with
    ignored rows, on logits that are not a multiple of anything."""
    from evtc.torch import _cross_entropy as ce

    if block_bytes:
        monkeypatch.setattr(ce, "EAGER_BLOCK_BYTES", block_bytes)
    torch.manual_seed(3)
    logits = (torch.randn(13, 40) * 4).to(torch.bfloat16)
    target = torch.randint(0, 40, (13,))
    target[[2, 7]] = -100
    g = torch.tensor(0.37)
    x = logits.double().requires_grad_()
    (F.cross_entropy(x, target, reduction="sum") * g.double()).backward()
    valid, safe = ce._valid_targets(target, -100)
    lse = torch.logsumexp(logits.float(), 1)
    # loss = lse - target_logit: the row's gradient reaches the target logit negated.
    rows = torch.full((13,), float(g)) * valid
    grad = ce._logits_grad(logits, lse, safe, rows, -rows)
    assert grad.dtype == torch.bfloat16
    assert torch.equal(grad[2].float(), torch.zeros(40)) and torch.equal(grad[7].float(), torch.zeros(40))
    # bf16 rounding of each element (2^-8 relative) and of the logits' softmax.
    torch.testing.assert_close(grad.double(), x.grad, rtol=1e-2, atol=2e-3)


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


def returns_logits(h, w, t):
    """A causal LM's return: the loss and the logits."""
    logits = F.linear(h, w)
    return F.cross_entropy(logits.float().view(-1, 32), t.view(-1)), logits


def test_returned_logits_come_from_the_losss_gemm(caplog, monkeypatch):
    from evtc.torch import _cross_entropy as ce

    # On a CPU every rewrite is refused for the device; the graph surgery is what is tested.
    monkeypatch.setattr(ce, "_refusal", lambda kwargs, logits: None)
    count, gm, log = rewrite(returns_logits, H, W, T, caplog=caplog)
    assert count == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert ce.linear_cross_entropy_and_logits in targets
    assert F.cross_entropy not in targets and torch._C._nn.linear not in targets
    # The graph's outputs: the loss (item 0) and the logits viewed back to [2, 4, 32].
    (loss, logits), = [n.args[0] for n in gm.graph.nodes if n.op == "output"]
    assert loss.target is operator.getitem and loss.args[1] == 0
    assert logits.op == "call_method" and logits.target == "view"
    assert logits.args[0].target is operator.getitem and logits.args[0].args[1] == 1
    assert "returned and saved for backward" in log


def test_logits_used_elsewhere_are_not_recomputed(caplog):
    gm = graph_of(returns_logits, H, W, T)
    with caplog.at_level(logging.DEBUG, logger="evtc.torch"):
        assert evtc.torch.fuse_linear_cross_entropy(gm, save_logits=False) == 0
    assert "the recomputing way (option 'recompute') writes none" in caplog.text


def test_logits_used_before_the_loss_are_not_rewritten(caplog):
    def fn(h, w, t):
        logits = F.linear(h, w)
        top = logits.amax(-1)
        return F.cross_entropy(logits.float().view(-1, 32), t.view(-1)), top

    count, _, log = rewrite(fn, H, W, T, caplog=caplog)
    assert count == 0
    assert "its logits are used elsewhere too, before the loss" in log


def test_float_logits_used_elsewhere_are_not_rewritten(caplog):
    def fn(h, w, t):
        logits = F.linear(h, w).float()
        return F.cross_entropy(logits.view(-1, 32), t.view(-1)), logits

    count, _, log = rewrite(fn, H, W, T, caplog=caplog)
    assert count == 0
    assert "its float or flattened logits are used elsewhere too" in log


def test_the_option_is_checked():
    with pytest.raises(RuntimeError, match="evtc.linear_cross_entropy='yes' .expected one of True, "
                                           "'save_logits', 'recompute', False"):
        evtc.torch.inductor_config(options={"evtc.linear_cross_entropy": "yes"})
    with pytest.raises(RuntimeError, match="evtc.linear_cross_entropy=1"):
        evtc.torch.inductor_config(options={"evtc.linear_cross_entropy": 1})
    for value in (True, False, "save_logits", "recompute"):
        evtc.torch.inductor_config(options={"evtc.linear_cross_entropy": value})
    assert evtc.torch.EVTC_OPTIONS["evtc.linear_cross_entropy"] is True


# --- log-probabilities of chosen tokens ---------------------------------------------------------

def logprobs_rewrite(fn, *args, caplog):
    gm = graph_of(fn, *args)
    with caplog.at_level(logging.DEBUG, logger="evtc.torch"):
        count = evtc.torch.fuse_token_logprobs(gm)
    return count, gm, " ".join(r.getMessage() for r in caplog.records)


def cpu_token_logprobs(h, w, tokens):
    """token_logprobs' definition, on the CPU (the real one needs a GPU)."""
    return torch.log_softmax((h @ w.T).float(), -1).gather(-1, tokens[:, None])[:, 0]


@pytest.mark.parametrize("fn", [
    # TRL's selective_log_softmax over a causal LM's logits, the last position dropped
    lambda h, w, t: F.linear(h, w)[:, :-1, :].float().log_softmax(-1).gather(-1, t[:, 1:].unsqueeze(-1)).squeeze(-1),
    # torch.gather, log_softmax's own upcast, no row indexing
    lambda h, w, t: torch.gather(F.log_softmax(F.linear(h, w), dim=-1, dtype=torch.float32), 2, t[..., None])[..., 0],
    # 16-bit log-probabilities (no upcast), the last position only
    lambda h, w, t: torch.log_softmax(F.linear(h, w)[:, -1], -1).gather(-1, t[:, -1:]),
])
def test_chosen_token_log_probabilities_run_as_token_logprobs(fn, caplog, monkeypatch):
    from evtc.torch import _cross_entropy as ce

    # On a CPU every rewrite is refused for the device; the graph surgery is what is tested, and
    # the rewritten graph runs with token_logprobs' definition in its place.
    monkeypatch.setattr(ce, "_token_refusal", lambda linear, index: None)
    monkeypatch.setattr(ce, "token_logprobs", cpu_token_logprobs)
    h, w, t = torch.randn(2, 5, 16, dtype=torch.bfloat16), torch.randn(32, 16, dtype=torch.bfloat16), \
        torch.randint(0, 32, (2, 5))
    with torch.no_grad():
        expected = fn(h, w, t)
        count, gm, log = logprobs_rewrite(fn, h, w, t, caplog=caplog)
        assert count == 1
        targets = [n.target for n in gm.graph.nodes]
        assert cpu_token_logprobs in targets and torch._C._nn.linear not in targets
        assert not any(n.op == "call_method" and n.target in ("log_softmax", "gather") for n in gm.graph.nodes)
        got = gm(h, w, t)
    got = got[0] if isinstance(got, (tuple, list)) else got
    assert got.shape == expected.shape and got.dtype == expected.dtype
    torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
    assert "no [tokens, vocab] logits" in log


@pytest.mark.parametrize("fn, reason", [
    (lambda h, w, t: torch.log_softmax(F.linear(h, w, torch.ones(32, dtype=h.dtype)), -1).gather(-1, t[..., None]),
     "the LM head has a bias"),
    (lambda h, w, t: torch.log_softmax(F.linear(h, w).float(), -1).gather(-1, t[..., None]),
     "not on a CUDA device"),
    (lambda h, w, t: (lambda lp: (lp.gather(-1, t[..., None]), lp.amax(-1)))(
        torch.log_softmax(F.linear(h, w).float(), -1)),
     "the logits or their log-probabilities are used elsewhere too"),
])
def test_chosen_token_rewrites_that_cannot_apply_say_why(fn, reason, caplog):
    with torch.no_grad():
        count, gm, log = logprobs_rewrite(fn, H, W, T, caplog=caplog)
    assert count == 0 and reason in log
    assert any(n.op == "call_function" and n.target is torch._C._nn.linear for n in gm.graph.nodes)


def test_chosen_token_log_probabilities_that_need_gradients_are_left_alone(caplog, monkeypatch):
    from evtc.torch import _cross_entropy as ce

    monkeypatch.setattr(ce, "_token_refusal", lambda linear, index: None)
    head = torch.nn.Linear(16, 32, bias=False).bfloat16()  # a parameter: it needs gradients

    def score(h, t):
        return head(h).float().log_softmax(-1).gather(-1, t[..., None])

    count, _, log = logprobs_rewrite(score, H, T, caplog=caplog)
    assert count == 0 and "need gradients" in log
    with torch.no_grad():  # scoring: the same head, no gradients
        count, _, _ = logprobs_rewrite(score, H, T, caplog=caplog)
    assert count == 1


def test_the_token_logprobs_option_is_checked():
    assert evtc.torch.EVTC_OPTIONS["evtc.token_logprobs"] is True
    with pytest.raises(RuntimeError, match="evtc.token_logprobs='no' .expected True or False"):
        evtc.torch.inductor_config(options={"evtc.token_logprobs": "no"})
    evtc.torch.inductor_config(options={"evtc.token_logprobs": False})
