"""evtc.torch.linear_cross_entropy on a Hopper GPU, saving the logits and recomputing them: the
loss and the gradients of h and W against float64, within eager bf16's own error; ignored rows;
torch.compile's rewrite."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch integration tests need torch")
if not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)):
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import evtc.torch  # noqa: E402
from evtc.torch import _op  # noqa: E402
from evtc.torch._cross_entropy import _saving_spec, _specs  # noqa: E402

IGNORE = -100


def inputs(m, k, v, seed, ignored=0.1):
    g = torch.Generator("cuda").manual_seed(seed)
    h = (torch.randn(m, k, generator=g, device="cuda") / k ** 0.25).bfloat16()
    w = (torch.randn(v, k, generator=g, device="cuda") / k ** 0.25).bfloat16()
    t = torch.randint(0, v, (m,), generator=g, device="cuda")
    t[torch.rand(m, generator=g, device="cuda") < ignored] = IGNORE
    return h, w, t


def loss_and_grads(fn, h, w, t, dtype=None, **kw):
    h = h.detach().clone().to(dtype or h.dtype).requires_grad_()
    w = w.detach().clone().to(dtype or w.dtype).requires_grad_()
    loss = fn(h, w, t, **kw)
    loss.sum().backward()
    return loss.detach().double(), h.grad.double(), w.grad.double()


def eager(h, w, t, reduction="mean"):
    return F.cross_entropy(F.linear(h, w).float(), t, ignore_index=IGNORE, reduction=reduction)


def fused(h, w, t, reduction="mean", vocab_chunk=None, save_logits=False):
    return evtc.torch.linear_cross_entropy(h, w, t, ignore_index=IGNORE, reduction=reduction,
                                           vocab_chunk=vocab_chunk, save_logits=save_logits)


SAVING = pytest.mark.parametrize("save_logits", [False, True], ids=["recompute", "save_logits"])


def rel(x, ref):
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# Sizes that are no tile's multiple; 1003 columns cannot be stored by TMA (rows must be 16-byte
# aligned), so its backward GEMM runs the unfused path: the same results.
@pytest.mark.parametrize("m, k, v", [(300, 264, 1000), (129, 136, 1003), (512, 512, 4096)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@SAVING
def test_matches_float64_within_eagers_error(m, k, v, reduction, save_logits):
    h, w, t = inputs(m, k, v, seed=m + v)
    ref = loss_and_grads(eager, h, w, t, dtype=torch.float64, reduction=reduction)
    base = loss_and_grads(eager, h, w, t, reduction=reduction)
    ours = loss_and_grads(fused, h, w, t, reduction=reduction, save_logits=save_logits)
    for name, o, b, r in zip(("loss", "dh", "dW"), ours, base, ref):
        assert torch.isfinite(o).all(), name
        # eager rounds the logits to bf16 before its fp32 softmax; evtc folds the fp32
        # accumulator: its loss is closer, its gradients (bf16 like eager's) as close.
        assert rel(o, r) <= 2 * rel(b, r) + 1e-6, f"{name}: evtc {rel(o, r):.3g}, eager {rel(b, r):.3g}"


def test_vocabulary_chunks_give_the_same_gradients():
    h, w, t = inputs(300, 264, 1000, seed=11)
    whole = loss_and_grads(fused, h, w, t, vocab_chunk=1000)  # recomputing: chunks matter
    for chunk in (256, 504, 992):  # 4, 2 and 2 chunks, the last narrower
        chunked = loss_and_grads(fused, h, w, t, vocab_chunk=chunk)
        assert torch.equal(chunked[0], whole[0])
        for name, c, o in zip(("dh", "dW"), chunked[1:], whole[1:]):
            assert rel(c, o) < 1e-3, f"{name} with chunks of {chunk}"


@SAVING
def test_ignored_rows_have_zero_gradient_and_no_loss(save_logits):
    h, w, t = inputs(257, 128, 2048, seed=7, ignored=0.3)
    loss, dh, _ = loss_and_grads(fused, h, w, t, reduction="none", save_logits=save_logits)
    ignored = t == IGNORE
    assert ignored.any() and (~ignored).any()
    assert (loss[ignored] == 0).all()
    assert (dh[ignored] == 0).all()
    assert (dh[~ignored].abs().sum(1) > 0).all()


@SAVING
def test_every_row_ignored_gives_nan_like_pytorch(save_logits):
    h, w, t = inputs(64, 128, 512, seed=3)
    t[:] = IGNORE
    assert torch.isnan(fused(h, w, t, save_logits=save_logits)).item() and torch.isnan(eager(h, w, t)).item()


@SAVING
def test_large_logits_do_not_overflow(save_logits):
    h, w, t = inputs(128, 128, 1024, seed=5)
    h = (h.float() * 40).bfloat16()  # logits in the hundreds: exp() would overflow fp32
    ref = loss_and_grads(eager, h, w, t, dtype=torch.float64, reduction="none")[0]
    base = loss_and_grads(eager, h, w, t, reduction="none")[0]
    ours = loss_and_grads(fused, h, w, t, reduction="none", save_logits=save_logits)[0]
    assert torch.isfinite(ours).all()
    # Saved 16-bit logits in the hundreds round by up to 0.5, as eager's do.
    assert rel(ours, ref) < max(1e-2, 2 * rel(base, ref))


def test_token_logprobs_match_float64_and_differentiate():
    h, w, t = inputs(300, 264, 1000, seed=13, ignored=0.0)
    h64, w64 = h.double().requires_grad_(), w.double().requires_grad_()
    want = torch.log_softmax(h64 @ w64.T, -1).gather(-1, t[:, None])[:, 0]
    hb, wb = h.clone().requires_grad_(), w.clone().requires_grad_()
    got = evtc.torch.token_logprobs(hb, wb, t)
    assert got.dtype == torch.float32 and rel(got, want) < 1e-5
    weights = torch.randn(300, device="cuda", dtype=torch.float64)
    (want * weights).sum().backward()
    (got * weights.float()).sum().backward()
    assert rel(hb.grad.double(), h64.grad) < 1e-2 and rel(wb.grad.double(), w64.grad) < 1e-2


class LMHeadLoss(nn.Module):
    def __init__(self, hidden, vocab):
        super().__init__()
        self.lm_head = nn.Linear(hidden, vocab, bias=False, device="cuda", dtype=torch.bfloat16)

    def forward(self, x, labels):
        logits = self.lm_head(x).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=IGNORE)


@pytest.mark.parametrize("option", [True, "recompute", "save_logits"])
def test_torch_compile_rewrites_the_loss_and_matches_eager(option):
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = LMHeadLoss(256, 1000)
    x = torch.randn(2, 150, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 1000, (2, 150), device="cuda")
    labels[:, :10] = IGNORE
    # 300 x 1000 logits are small: saved by default.
    specs = [_saving_spec(torch.bfloat16)] if option != "recompute" else list(_specs(torch.bfloat16))
    before = [_op.path_counts(s)["fused"] for s in specs]
    compiled = torch.compile(model, backend="evtc", dynamic=False, options={"evtc.linear_cross_entropy": option})
    loss = compiled(x, labels)
    loss.backward()
    after = [_op.path_counts(s)["fused"] for s in specs]
    assert all(a > b for a, b in zip(after, before)), "the rewrite did not run evtc's kernels"
    got = (loss.detach(), x.grad.clone(), model.lm_head.weight.grad.clone())
    x.grad = None
    model.lm_head.weight.grad = None
    ref = model.double()(x.double(), labels)
    ref.backward()
    want = (ref.detach(), x.grad, model.lm_head.weight.grad)
    for name, g, r in zip(("loss", "dx", "dW"), got, want):
        assert rel(g.double(), r.double()) < 2e-2, name


def test_returned_logits_are_the_linears_and_differentiate():
    """linear_cross_entropy_and_logits: the logits are F.linear's, and a gradient reaching them
    too (a second loss on the logits) adds to the cross-entropy's."""
    h, w, t = inputs(300, 264, 1000, seed=17)

    def both(fn, h, w, t):
        loss, logits = fn(h, w, t)
        return loss + (logits.float() ** 2).mean() * 0.1, logits

    def ours(h, w, t):
        return evtc.torch.linear_cross_entropy_and_logits(h, w, t, ignore_index=IGNORE)

    def theirs(h, w, t):
        logits = F.linear(h, w)
        return F.cross_entropy(logits.float(), t, ignore_index=IGNORE), logits

    got = loss_and_grads(lambda *a: both(ours, *a)[0], h, w, t)
    ref = loss_and_grads(lambda *a: both(theirs, *a)[0], h, w, t, dtype=torch.float64)
    base = loss_and_grads(lambda *a: both(theirs, *a)[0], h, w, t)
    for name, o, b, r in zip(("loss", "dh", "dW"), got, base, ref):
        assert rel(o, r) <= 2 * rel(b, r) + 1e-6, f"{name}: evtc {rel(o, r):.3g}, eager {rel(b, r):.3g}"
    _, logits = ours(h, w, t)
    assert torch.equal(logits, F.linear(h, w)) or rel(logits.double(), F.linear(h, w).double()) < 4e-3


def test_transformers_causal_lm_loss_and_logits():
    """A transformers causal LM with labels returns its loss and its logits: the rewrite takes
    the logits from the loss's GEMM; loss, logits and gradients match plain torch.compile's."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16)
    ids = torch.randint(0, 1024, (2, 96), device="cuda")
    saving = _saving_spec(torch.bfloat16)

    def run(backend):
        torch._dynamo.reset()
        model.zero_grad(set_to_none=True)
        out = torch.compile(model, backend=backend, dynamic=False)(input_ids=ids, labels=ids)
        out.loss.backward()
        return (out.loss.detach().double(), out.logits.detach().double(),
                model.model.layers[0].mlp.down_proj.weight.grad.double(), model.lm_head.weight.grad.double())

    before = _op.path_counts(saving)["fused"]
    got = run("evtc")
    assert _op.path_counts(saving)["fused"] > before, "the rewrite did not run evtc's kernel"
    want = run("inductor")
    for name, g, r in zip(("loss", "logits", "d down_proj", "d lm_head"), got, want):
        assert rel(g, r) < 2e-2, name


@SAVING
def test_only_the_weights_gradient_when_h_needs_none(save_logits):
    """h without requires_grad (an LM head's input in a frozen-body fine-tune): the weight's
    gradient alone, as eager's."""
    h, w, t = inputs(300, 264, 1000, seed=19)
    grads = []
    for fn, dtype in ((fused, None), (eager, torch.float64), (eager, None)):
        wg = w.detach().clone().to(dtype or w.dtype).requires_grad_()
        kw = {"save_logits": save_logits} if fn is fused else {}
        fn(h.to(dtype or h.dtype), wg, t, **kw).backward()
        grads.append(wg.grad.double())
    ours, ref, base = grads
    assert rel(ours, ref) <= 2 * rel(base, ref) + 1e-6


class Scorer(nn.Module):
    """An RL scorer: each position's log-probability of the next token under an LM head."""

    def __init__(self, hidden, vocab):
        super().__init__()
        self.lm_head = nn.Linear(hidden, vocab, bias=False, device="cuda", dtype=torch.bfloat16)

    def forward(self, x, tokens):
        logits = self.lm_head(x)[:, :-1, :].float()
        return logits.log_softmax(-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)


def test_torch_compile_runs_chosen_token_log_probabilities_without_the_logits():
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = Scorer(264, 1000)
    x = torch.randn(2, 151, 264, device="cuda", dtype=torch.bfloat16)
    tokens = torch.randint(0, 1000, (2, 151), device="cuda")
    forward = _specs(torch.bfloat16)[0]
    before = _op.path_counts(forward)["fused"]
    with torch.no_grad():
        got = torch.compile(model, backend="evtc", dynamic=False)(x, tokens)
        base = model(x, tokens)
    assert _op.path_counts(forward)["fused"] > before, "the rewrite did not run evtc's kernel"
    want = model.double()(x.double(), tokens)
    assert got.shape == (2, 150) and got.dtype == torch.float32
    assert rel(got.double(), want) < max(1e-3, 2 * rel(base.double(), want))
