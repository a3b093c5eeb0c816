#!/usr/bin/env python3
"""Whole models: torch.compile with evtc against plain torch.compile and eager PyTorch (bf16, one GPU).

    python3 bench/models.py [--out bench/results] [--models llama,gpt2,moe,llama_mlp,hf_llama,hf_qwen,hf_gpt2,hf_mixtral]
                            [--phases prefill,decode,train] [--modes default,cudagraphs] [--quick] [--json-only]
                            [--evtc-options '{"evtc.profitability": false}']
    python3 bench/models.py --table bench/results/STAMP-h200-models.json      # only print the Markdown table

Models (torch.nn, random weights from a fixed seed, eval mode): one LLaMA decoder layer (hidden 4096,
32 heads, SwiGLU FFN 11008), its MLP alone, one GPT-2 layer in GPT-2's Conv1D form (hidden 1600, 25
heads, FFN 6400), a top-2-of-8 MoE layer on torch._grouped_mm (hidden 2048, FFN 1408), and, when
transformers imports, 2-layer Llama / GPT-2 / Mixtral causal LMs from a config, and an LM head
with its cross-entropy loss (hidden 4096, 8 x 1024 tokens, vocab 32,000 and 128,256; training
only). Phases: prefill
(8 x 1024 tokens, no grad), decode (batch 64 or --decode-batch, one token; the attention layers read a
1023-position KV cache), train (forward + backward of mean(out^2)). Modes: default, and cudagraphs (both compiles with
mode="reduce-overhead", eager captured in a CUDA graph by hand); decode runs in cudagraphs mode only
unless --modes is given. Each (model, phase, mode) row compiles fresh copies of one model, times
eager, torch.compile and torch.compile(backend="evtc") interleaved (CUDA events, median), counts the
GEMMs evtc fused, and checks every output (training: and the parameter gradients) against a float64
copy. EVTC_BENCH_ITERS sets the timed calls per variant. Writes <out>/<stamp>-<gpu>-models.json
after every row, then a PNG of evtc's speed-up over torch.compile, and prints the Markdown table.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import re
import statistics
import sys
import time
from datetime import datetime, timezone

# A hit in Inductor's FX-graph or AOT-autograd cache skips the post-grad passes, so evtc would
# report no graphs and the first-call times would be cache loads: every compile here is cold.
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

import torch  # noqa: E402
import torch._inductor.cudagraph_trees  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import evtc.torch  # noqa: E402  (registers backend="evtc")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from result_files import result_base  # noqa: E402

# Every row compiles new copies of the same classes; their forward code collects one Dynamo
# cache entry per (backend, mode, phase), past the default limit of 8, after which Dynamo would
# silently run them eagerly.
torch._dynamo.config.recompile_limit = 256
torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 4096)

DTYPE = torch.bfloat16
SEED = 0
CACHE_LEN = 1023  # decode: KV-cache positions before the new token
DECODE_BATCH = 64  # decode: sequences, one new token each (--decode-batch)
TRAIN_BATCH = 4  # the layer models' training rows: sequences of 1024 tokens (--train-batch)
LAYER_MODELS = ("llama", "gpt2", "moe", "llama_mlp")
# An LM head and its cross-entropy (hidden 4096, 8192 tokens), vocab 32,000 and 128,256: training only.
LOSS_MODELS = {"lm_head_32k": 32000, "lm_head_128k": 128256}
HF_MODELS = ("hf_llama", "hf_qwen", "hf_gpt2", "hf_mixtral")
PHASES = ("prefill", "decode", "train")
MODES = ("default", "cudagraphs")
VARIANTS = ("eager", "compile", "evtc")
# The workload list's targets for evtc over torch.compile; every other row: at least 1.00x.
TARGETS = {("llama", "prefill"): 1.05, ("llama_mlp", "prefill"): 1.10, ("moe", "prefill"): 1.10}


# Stacked expert weights (Parameters [E, I, K]) that evtc.torch.merge_projections merges only when
# named, as docs/python.md advises for inference: in training their gradients would come out
# strided and cost a copy per step, so the training rows leave them as built.
EXPERT_PAIRS = {"moe": [("w1", "w3")]}


def merge_projections(model: nn.Module, name: str, phase: str) -> list[str]:
    """What evtc's docs tell a user to do before compiling ``model`` for ``phase``: its gate/up
    Linear pairs and q/k/v Linear stacks, and, outside training, its stacked expert pairs, made
    views of one buffer each."""
    merged = evtc.torch.merge_projections(model)
    if phase != "train" and name in EXPERT_PAIRS:
        merged += evtc.torch.merge_projections(model, pairs=EXPERT_PAIRS[name])
    return merged


def wide(dtype: torch.dtype) -> torch.dtype:
    """float32 for bf16 (where LLaMA's RMSNorm, the router and the loss compute); float64 stays
    float64, so the reference is float64 throughout."""
    return torch.promote_types(dtype, torch.float32)


# --- models -----------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = x.to(wide(x.dtype))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def attend(q, k, v, past_k, past_v):
    """SDPA over (batch, heads, seq, head_dim). With a KV cache the new keys and values follow the
    cached ones; the one new query sees every key, so there is no causal mask."""
    if past_k is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
    return F.scaled_dot_product_attention(q, k, v)


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int = 4096, ffn: int = 11008):
        super().__init__()
        self.hidden, self.heads = hidden, 0
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaLayer(nn.Module):
    def __init__(self, hidden: int = 4096, heads: int = 32, ffn: int = 11008, max_pos: int = 2048):
        super().__init__()
        self.hidden, self.heads, self.head_dim = hidden, heads, hidden // heads
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))
        self.mlp = LlamaMLP(hidden, ffn)
        inv_freq = 10000.0 ** -(torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim)
        angles = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        # Cast with the model, as LLaMA casts its tables to the activations' dtype.
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x, past_k=None, past_v=None):
        b, s, _ = x.shape
        start = 0 if past_k is None else past_k.shape[2]
        h = self.norm1(x)
        q, k, v = (p(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = self.cos[start:start + s], self.sin[start:start + s]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        x = x + self.o_proj(attend(q, k, v, past_k, past_v).transpose(1, 2).reshape(b, s, self.hidden))
        return x + self.mlp(self.norm2(x))


class Conv1D(nn.Module):
    """GPT-2's linear layer: the weight stored (in, out) and applied with addmm (B is N-major)."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.02)
        # GPT-2 starts its biases at zero; random ones make the check cover the bias too.
        self.bias = nn.Parameter(torch.randn(n_out) * 0.02)

    def forward(self, x):
        out = torch.addmm(self.bias, x.view(-1, x.shape[-1]), self.weight)
        return out.view(*x.shape[:-1], out.shape[-1])


class GPT2Layer(nn.Module):
    def __init__(self, hidden: int = 1600, heads: int = 25, ffn: int = 6400):
        super().__init__()
        self.hidden, self.heads = hidden, heads
        self.ln_1, self.ln_2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.c_attn, self.c_proj = Conv1D(hidden, 3 * hidden), Conv1D(hidden, hidden)
        self.c_fc, self.mlp_proj = Conv1D(hidden, ffn), Conv1D(ffn, hidden)

    def forward(self, x, past_k=None, past_v=None):
        b, s, h = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in self.c_attn(self.ln_1(x)).split(h, dim=-1))
        x = x + self.c_proj(attend(q, k, v, past_k, past_v).transpose(1, 2).reshape(b, s, h))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


def grouped_mm(x, w, offs):
    """Rows of x (sorted by group) times w[g] per group; offs: int32 end offsets on the device.
    torch._grouped_mm is bf16-only, so the float64 reference loops over the groups instead."""
    if x.dtype == torch.bfloat16:
        return torch._grouped_mm(x, w, offs=offs)
    ends = offs.tolist()
    return torch.cat([x[s:e] @ w[g] for g, (s, e) in enumerate(zip([0] + ends[:-1], ends))])


class MoE(nn.Module):
    def __init__(self, hidden: int = 2048, experts: int = 8, top_k: int = 2, ffn: int = 1408):
        super().__init__()
        self.hidden, self.heads, self.top_k = hidden, 0, top_k
        self.router = nn.Linear(hidden, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, ffn, hidden) * hidden ** -0.5)  # gate
        self.w3 = nn.Parameter(torch.randn(experts, ffn, hidden) * hidden ** -0.5)  # up
        self.w2 = nn.Parameter(torch.randn(experts, hidden, ffn) * ffn ** -0.5)  # down

    def forward(self, x):
        shape, experts = x.shape, self.w1.shape[0]
        x = x.reshape(-1, shape[-1])
        probs = F.softmax(self.router(x), dim=-1, dtype=wide(x.dtype))
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        flat = chosen.reshape(-1)  # (token, choice) pairs, token-major
        order = torch.argsort(flat, stable=True)
        xs = x[order // self.top_k]
        # Tokens per expert with a fixed-size result (bincount's size depends on the data).
        counts = (flat.unsqueeze(1) == torch.arange(experts, device=x.device)).sum(0)
        offs = counts.cumsum(0).to(torch.int32)
        h = F.silu(grouped_mm(xs, self.w1.transpose(-2, -1), offs)) * grouped_mm(xs, self.w3.transpose(-2, -1), offs)
        ys = grouped_mm(h, self.w2.transpose(-2, -1), offs)
        # Back to (token, choice) order, then each token's routing-weighted sum over its experts.
        y = ys[torch.argsort(order)].view(-1, self.top_k, shape[-1])
        return (y.to(weights.dtype) * weights.unsqueeze(-1)).sum(1).to(x.dtype).view(shape)


class LMHeadLoss(nn.Module):
    """A causal LM's last step in training: logits of the final hidden states, upcast, and their
    cross-entropy against the next tokens (the last position of each sequence ignored)."""

    hidden, heads = 4096, 0

    def __init__(self, vocab: int):
        super().__init__()
        self.lm_head = nn.Linear(self.hidden, vocab, bias=False)

    def forward(self, x, labels):
        logits = self.lm_head(x)
        logits = logits.to(wide(logits.dtype))  # .float(), except in the float64 reference
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)


class Logits(nn.Module):
    """A transformers causal LM's logits alone, without a cache."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids):
        return self.lm(input_ids=input_ids, use_cache=False).logits


def transformers_version():
    try:
        import transformers
        return transformers.__version__
    except ImportError:
        return None


def build_hf(name: str) -> nn.Module:
    import transformers

    llama = dict(num_hidden_layers=2, hidden_size=2048, num_attention_heads=16, num_key_value_heads=16,
                 intermediate_size=5632, vocab_size=32000, max_position_embeddings=2048)
    if name == "hf_llama":
        cls, config = transformers.LlamaForCausalLM, transformers.LlamaConfig(**llama, attn_implementation="sdpa")
    elif name == "hf_qwen":
        # Qwen2's decoder: biased q/k/v, grouped-query attention (16 query heads, 2 key/value heads)
        cls, config = transformers.Qwen2ForCausalLM, transformers.Qwen2Config(
            **{**llama, "num_key_value_heads": 2}, attn_implementation="sdpa")
    elif name == "hf_gpt2":
        cls, config = transformers.GPT2LMHeadModel, transformers.GPT2Config(
            n_layer=2, n_embd=1600, n_head=25, vocab_size=50257, n_positions=1024, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa")
    else:
        cls, config = transformers.MixtralForCausalLM, transformers.MixtralConfig(
            **{**llama, "intermediate_size": 1408}, num_local_experts=8, num_experts_per_tok=2,
            attn_implementation="sdpa")
    config.use_cache = False
    # Built in bf16 as from_pretrained(dtype=bf16) builds: parameters in bf16 while RoPE's
    # inv_freq stays float32 (a model.to(bf16) would round it too).
    previous = torch.get_default_dtype()
    torch.set_default_dtype(DTYPE)
    try:
        with torch.device("cuda"):
            return Logits(cls(config))
    finally:
        torch.set_default_dtype(previous)


def build(name: str) -> nn.Module:
    torch.manual_seed(SEED)
    if name in HF_MODELS:
        return build_hf(name).eval()
    with torch.device("cuda"):
        if name in LOSS_MODELS:
            model = LMHeadLoss(LOSS_MODELS[name])
        else:
            model = {"llama": LlamaLayer, "gpt2": GPT2Layer, "moe": MoE, "llama_mlp": LlamaMLP}[name]()
    return model.to(DTYPE).eval()


def make_inputs(name: str, phase: str, model: nn.Module, seed: int = SEED + 1) -> tuple:
    """The phase's inputs, from a fixed seed; the same tensors serve every variant."""
    gen = torch.Generator("cuda").manual_seed(seed)
    if name in HF_MODELS:
        shape = (DECODE_BATCH, 1) if phase == "decode" else (8, 1024)
        return (torch.randint(0, model.lm.config.vocab_size, shape, generator=gen, device="cuda"),)
    if name in LOSS_MODELS:
        x = torch.randn(8, 1024, model.hidden, generator=gen, device="cuda", dtype=DTYPE)
        labels = torch.randint(0, model.lm_head.out_features, (8, 1024), generator=gen, device="cuda")
        labels[:, -1] = -100
        return (x, labels)
    batch, seq = {"prefill": (8, 1024), "decode": (DECODE_BATCH, 1), "train": (TRAIN_BATCH, 1024)}[phase]
    x = torch.randn(batch, seq, model.hidden, generator=gen, device="cuda", dtype=DTYPE)
    if phase != "decode" or not model.heads:
        return (x,)
    cache = (batch, model.heads, CACHE_LEN, model.hidden // model.heads)
    past = tuple(torch.randn(cache, generator=gen, device="cuda", dtype=DTYPE) for _ in range(2))
    for t in past:
        # A server's preallocated cache: under CUDA graphs it is read in place, not copied in.
        torch._dynamo.mark_static_address(t)
    return (x, *past)


def row_notes(name: str, phase: str, mode: str, model: nn.Module) -> list[str]:
    notes = []
    if phase == "train" and name in LAYER_MODELS:
        notes.append(f"batch {TRAIN_BATCH} x 1024" + (" (memory)" if TRAIN_BATCH == 4 else ""))
    if name in LOSS_MODELS:
        notes.append("8 x 1024 tokens; the model's output is its loss; evtc runs it as linear_cross_entropy "
                     "(logits saved up to 1 GiB, recomputed above), which fused/gemms do not count")
    if phase == "decode":
        notes.append(f"input_ids ({DECODE_BATCH}, 1) without a KV cache" if name in HF_MODELS else
                     f"batch {DECODE_BATCH}, KV cache of {CACHE_LEN} positions, static address" if model.heads else
                     f"input ({DECODE_BATCH}, 1, hidden)")
    if phase == "train" and mode == "cudagraphs":
        notes.append("eager not captured in a CUDA graph for training: eager_ms is plain eager, as in default mode")
    if name in HF_MODELS:
        config = model.lm.config
        notes.append(f"attention: {config._attn_implementation}")
        if name == "hf_mixtral" and getattr(config, "_experts_implementation", None):
            notes.append(f"experts: {config._experts_implementation}")
    return notes


# --- running and timing -----------------------------------------------------------------------

def loss_of(out):
    """What a training row differentiates: the output itself where it is a loss (a scalar),
    else mean(out^2)."""
    return out if out.dim() == 0 else out.to(wide(out.dtype)).pow(2).mean()


def make_step(run, model: nn.Module, inputs: tuple, phase: str, mark_step: bool):
    """One call of the row: the forward without grad, or zeroed grads, forward and backward.
    Compiled functions under CUDA-graph trees start each call with a new step."""
    if phase == "train":
        def step():
            model.zero_grad(set_to_none=True)
            if mark_step:
                torch.compiler.cudagraph_mark_step_begin()
            out = run(*inputs)
            loss_of(out).backward()
            return out
    else:
        def step():
            if mark_step:
                torch.compiler.cudagraph_mark_step_begin()
            with torch.no_grad():
                return run(*inputs)
    return step


def graphed(step):
    """The eager step captured in one CUDA graph by hand; each replay returns the same output tensor."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # library workspaces and allocator blocks exist before capture
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        out = step()

    def replay():
        graph.replay()
        return out
    return replay


def event_times(step, iters: int) -> list[float]:
    """Per-call GPU times of back-to-back calls (as a serving or training loop makes them):
    one pair of events around each call, one synchronisation at the end, so the host prepares
    a call while the GPU runs the previous one (a synchronisation per call would count each
    call's host start-up as GPU idle time)."""
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in pairs:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in pairs]


def time_interleaved(steps: dict, warmup: int, iters: int, rounds: int) -> tuple[dict[str, float], list[dict]]:
    """Median ms per call of each step over all rounds, and each round's medians. The variants
    take turns: in each round every variant makes its share of the timed calls back to back,
    and the order of the variants rotates from round to round, so that neither clock drift nor
    a neighbour's power draw favours one of them."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    torch.cuda.synchronize()
    names = list(steps)
    samples = {v: [] for v in steps}
    per_round = []
    for r in range(rounds):
        medians = {}
        for v in names[r % len(names):] + names[:r % len(names)]:
            times = event_times(steps[v], math.ceil(iters / rounds))
            samples[v] += times
            medians[v] = statistics.median(times)
        per_round.append(medians)
    return {v: statistics.median(s) for v, s in samples.items()}, per_round


def outputs(step, model: nn.Module, phase: str):
    """One call's output and, training, each parameter's gradient by name, flattened (float64
    copies: CUDA-graph outputs are overwritten by the next replay). merge_projections keeps the
    names, so the variants' gradients and the reference's pair up by name."""
    out = step().detach().double()
    if phase != "train":
        return out, None
    return out, {name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).double()
                 for name, p in model.named_parameters()}


def deviation(value, ref) -> tuple[float, float]:
    """(relative L2 error, max abs error) of value against the float64 reference; where the
    reference is all zeros (a parameter with no gradient), the absolute L2 error."""
    diff = value - ref
    scale = ref.norm()
    return float(diff.norm() / scale if scale > 0 else diff.norm()), float(diff.abs().max())


def gradient_errors(grads: dict, ref_grads: dict) -> tuple[float, float, dict]:
    """All gradients' (relative L2, max abs) error against float64's as one vector, and each
    parameter's relative L2 error by name."""
    if grads.keys() != ref_grads.keys():
        raise ValueError(f"gradients of parameters {sorted(grads.keys() ^ ref_grads.keys())} are missing on "
                         "one side: the variant's parameter names differ from the reference's")
    whole = deviation(torch.cat(list(grads.values())), torch.cat([ref_grads[n] for n in grads]))
    return (*whole, {name: deviation(g, ref_grads[name])[0] for name, g in grads.items()})


def parameter_check(row: dict, variant: str = "evtc") -> dict | None:
    """The issue's gradient criterion per parameter: evtc's error against float64 at most plain
    compile's. Returns the count of parameters where evtc's (or variant's: "evtc_alt") is larger,
    the worst ratio to compile's with its parameter and eager's ratio there (another correct
    computation's distance from plain compile, for scale); None without per-parameter errors."""
    per = row.get("grad_param_errors")
    if not per or any(variant not in e for e in per.values()):
        return None
    ratios = {name: (e[variant] / e["compile"] if e["compile"] > 0 else math.inf if e[variant] > 0 else 1.0)
              for name, e in per.items()}
    worst = max(ratios, key=ratios.get)
    eager = per[worst].get("eager")
    return {"params": len(per), "above_compile": sum(1 for r in ratios.values() if r > 1.0),
            "worst_param": worst, "worst_ratio": ratios[worst],
            "eager_ratio_there": eager / per[worst]["compile"] if eager is not None and per[worst]["compile"] > 0
            else None}


def reference(base: nn.Module, inputs: tuple, phase: str):
    ref = copy.deepcopy(base).to(torch.float64)
    config = getattr(getattr(ref, "lm", None), "config", None)
    if getattr(config, "_experts_implementation", None) not in (None, "eager"):
        ref.lm.set_experts_implementation("eager")  # its grouped_mm path is bf16-only
    wide_inputs = tuple(t.to(torch.float64) if t.is_floating_point() else t for t in inputs)
    return outputs(make_step(ref, ref, wide_inputs, phase, False), ref, phase)


def fusion_counts(graph_reports) -> dict:
    """GEMMs evtc fused (a merged op counts every GEMM it replaced) and GEMMs in the graphs."""
    return {"fused": sum(r.fused_gemms for r in graph_reports), "gemms": sum(r.gemms for r in graph_reports),
            "evtc_graphs": len(graph_reports), "evtc_summary": [r.summary() for r in graph_reports]}


def fallback_counts(graph_reports) -> dict[str, int]:
    return {f.spec: evtc.torch.path_counts(f.spec)["fallback"] for r in graph_reports for f in r.fused}


def first_call(step) -> tuple[float, int, int]:
    """Wall time of the first call (compilation included), the Dynamo graphs compiled in it (more
    than one: graph breaks) and those of them where Inductor skipped CUDA graphs."""
    graphs, skips = counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return seconds, counters["stats"]["unique_graphs"] - graphs, counters["inductor"]["cudagraph_skips"] - skips


def compile_kwargs(cudagraphs: bool, options, evtc_backend: bool) -> dict:
    """torch.compile's mode/options for one variant. torch.compile refuses a mode and options
    together, so with options the mode goes in as its Inductor options; the plain compile gets
    the options that are not evtc's, so that both compile the same way."""
    if not options:
        return {"mode": "reduce-overhead"} if cudagraphs else {}
    options = {k: v for k, v in options.items() if evtc_backend or not k.startswith("evtc.")}
    mode_options = torch._inductor.list_mode_options("reduce-overhead") if cudagraphs else {}
    return {"options": {**mode_options, **options}}


def kernel_profile(step, iters: int = 5, top: int = 30) -> dict:
    """What the GPU does per call, from torch.profiler's kernel events over back-to-back calls:
    the span from the first kernel's start to the last one's end, the kernels' busy time, and
    the largest kernels by name (us per call). span - busy is time the GPU waited for the host."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    if not kernels:
        return {}
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name[:120]] = by_name.get(e.name[:120], 0.0) + e.time_range.elapsed_us() / iters
    largest = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    return {"span_us": (kernels[-1].time_range.end - kernels[0].time_range.start) / iters,
            "busy_us": sum(e.time_range.elapsed_us() for e in kernels) / iters,
            "top": [[name, round(t, 1)] for name, t in largest]}


# A profiled step whose kernels keep the GPU busy for less of its span than this waits on the host.
HOST_BOUND_BUSY = 0.8


def host_bound_note(profiles: dict) -> str:
    """A note where every profiled variant's step is bound by the host: its kernels' busy time is
    under HOST_BOUND_BUSY of the span from the first kernel's start to the last one's end. Such a
    row's times measure the host's work per step (Python, guards, launches), which a fused
    kernel does not shorten; the GPU's own time per variant is `busy_us`."""
    shares = {v: p["busy_us"] / p["span_us"] for v, p in profiles.items() if p and p.get("span_us")}
    if not shares or any(share >= HOST_BOUND_BUSY for share in shares.values()):
        return ""
    return "host-bound: the GPU was busy " + ", ".join(
        f"{profiles[v]['busy_us']:.0f} of {profiles[v]['span_us']:.0f} us per call under {v} ({share:.0%})"
        for v, share in shares.items())


DECLARATION = re.compile(r"^input (\w+)(?:\[[mn,\s]*\])?\s*:\s*(\w+)", re.M)
SPEC_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def fused_op_times(graph_reports, calls: int = 20, rounds: int = 3) -> list[dict]:
    """Each dense fused op of the row alone, on random inputs of its traced size and layouts,
    against torch.mm of the same operands (cuBLAS): median ms of back-to-back calls, the two
    interleaved, beside the cost model's estimate. Merged, grouped and fp8 ops are listed with
    the reason they are not timed."""
    from evtc.torch import _op

    out = []
    for report in graph_reports:
        for f in report.fused:
            spec, e = json.loads(f.spec), f.estimate
            entry = {"gemm": f.gemm, "outputs": f.outputs, "expr": spec["expr"]}
            out.append(entry)
            o = spec["options"]
            if "merged" in spec or spec.get("grouped") or not e:
                entry["skipped"] = "merged, grouped or without an estimate: not timed alone"
                continue
            if o.get("a_dtype") not in SPEC_DTYPES or o.get("b_dtype") not in SPEC_DTYPES:
                entry["skipped"] = f"{o.get('a_dtype')} operands: not timed alone"
                continue
            m, n, k = e["m"], e["n"], e["k"]
            dt = SPEC_DTYPES[o["a_dtype"]]
            a = torch.randn(m, k, device="cuda", dtype=dt) if o.get("a_layout", "row") == "row" else \
                torch.randn(k, m, device="cuda", dtype=dt).t()
            b = torch.randn(k, n, device="cuda", dtype=dt) if o.get("b_layout", "col") == "row" else \
                torch.randn(n, k, device="cuda", dtype=dt).t()
            dtypes = {name: SPEC_DTYPES.get(d, dt) for name, d in DECLARATION.findall(spec["expr"])}
            shapes = {"row": (n,), "col": (m,), "scalar": (), "aux": (m, n), "aux_col": (n, m)}
            operands = []
            for name, cls in spec["operands"]:
                t = torch.randn(shapes[cls], device="cuda", dtype=dtypes.get(name, dt))
                operands.append(t.t() if cls == "aux_col" else t)
            steps = {"fused": lambda: _op.GEMM_EPILOGUE(f.spec, a, b, operands), "mm": lambda: torch.mm(a, b)}
            times, _ = time_interleaved(steps, 3, calls, rounds)
            entry.update({"m": m, "n": n, "k": k, "a_layout": o.get("a_layout"), "b_layout": o.get("b_layout"),
                          "config": e.get("config"), "fused_ms": times["fused"], "mm_ms": times["mm"],
                          "fused_over_mm": times["fused"] / times["mm"],
                          "model_fused_over_cublas": e["fused_us"] / e["cublas_us"]})
    return out


# A fused op timed alone whose ratio to torch.mm is this far from the cost model's (either way)
# is flagged: the model priced a kernel it does not know (GPT-2's down projection on a tile that
# staged its row-major B with a 32-byte swizzle took 1.91x torch.mm where the model said 1.05x).
MODEL_GAP = 1.25


def model_gap_note(measured_ratio: float, model_ratio: float) -> str:
    """'' where the measured ratio of a fused op to torch.mm is within MODEL_GAP of the model's,
    else a note saying how far off it is."""
    gap = measured_ratio / model_ratio
    if 1 / MODEL_GAP <= gap <= MODEL_GAP:
        return ""
    return f" << {gap:.2f}x the model's ratio: look at its configuration"


def new_row(model: str, phase: str, mode: str, **fields) -> dict:
    """A row with every field the table reads, None until measured."""
    keys = ("eager_ms", "compile_ms", "evtc_ms", "speedup", "fused", "gemms", "compile_first_s", "evtc_first_s",
            *(f"error_{v}" for v in VARIANTS), "compile_errors", "evtc_summary", "error")
    return {"model": model, "phase": phase, "mode": mode, **dict.fromkeys(keys), "notes": [], **fields}


def run_row(row: dict, base: nn.Module, args) -> None:
    """Fills row in place, so that what was measured before an exception stays in it."""
    phase, cudagraphs, notes = row["phase"], row["mode"] == "cudagraphs", row["notes"]
    inputs = make_inputs(row["model"], phase, base)
    row["inputs"] = [list(t.shape) for t in inputs]
    try:
        ref_out, ref_grads = reference(base, inputs, phase)
    except Exception as e:  # the timings stand without it
        ref_out = ref_grads = None
        notes.append(f"no float64 reference ({type(e).__name__}: {str(e)[:200]})")
    alternative = args.alternative is not None
    variants = VARIANTS + (("control",) if args.control else ()) + (("evtc_alt",) if alternative else ())
    models = {v: copy.deepcopy(base) for v in variants}
    if args.merge_projections:  # what evtc's docs tell its users to do; the other variants stay as built
        merged = merge_projections(models["evtc"], row["model"], phase)
        if alternative:
            merge_projections(models["evtc_alt"], row["model"], phase)
        row["merged_projections"] = len(merged)
        if merged:
            notes.append(f"evtc: merge_projections made {len(merged)} gate/up pair(s) and q/k/v stack(s) views of "
                         "one buffer each")
    # dynamic=False: shapes stay static, however many shapes one class has been compiled for.
    runs = {"eager": models["eager"],
            "compile": torch.compile(models["compile"], dynamic=False,
                                     **compile_kwargs(cudagraphs, args.evtc_options, False)),
            "evtc": torch.compile(models["evtc"], backend="evtc", dynamic=False,
                                  **compile_kwargs(cudagraphs, args.evtc_options, True))}
    if args.control:  # a second plain compile: the spread between two identical variants
        runs["control"] = torch.compile(models["control"], dynamic=False,
                                        **compile_kwargs(cudagraphs, args.evtc_options, False))
    if alternative:  # evtc again, with the alternative options on top of --evtc-options
        runs["evtc_alt"] = torch.compile(models["evtc_alt"], backend="evtc", dynamic=False,
                                         **compile_kwargs(cudagraphs, {**(args.evtc_options or {}),
                                                                       **args.alternative}, True))
    steps = {v: make_step(runs[v], models[v], inputs, phase, cudagraphs and v != "eager") for v in variants}

    row["compile_first_s"], row["graphs_compile"], skips_compile = first_call(steps["compile"])
    if args.control:
        first_call(steps["control"])
    before = len(evtc.torch.reports)
    row["evtc_first_s"], row["graphs_evtc"], skips_evtc = first_call(steps["evtc"])
    row["compile_errors"] = evtc.torch.wait_for_compiles()
    evtc_reports = evtc.torch.reports[before:]
    if alternative:
        after = len(evtc.torch.reports)
        first_call(steps["evtc_alt"])
        row["compile_errors"] = (row["compile_errors"] or []) + (evtc.torch.wait_for_compiles() or [])
        alt_counts = fusion_counts(evtc.torch.reports[after:])
        row["alt_fused"], row["alt_graphs"] = alt_counts["fused"], alt_counts["evtc_graphs"]
        row["alt_summary"] = alt_counts["evtc_summary"]  # what it fused, and why it refused the rest
    row.update(fusion_counts(evtc_reports))
    fallbacks = fallback_counts(evtc_reports)
    for v, skips in (("compile", skips_compile), ("evtc", skips_evtc)):
        if skips:
            notes.append(f"{v}: Inductor skipped CUDA graphs in {skips} graph(s)")

    steps["eager"]()
    if cudagraphs and phase != "train":
        try:
            steps["eager"] = graphed(steps["eager"])
        except Exception as e:  # e.g. an op that syncs with the host; eager then runs plain
            notes.append(f"eager CUDA-graph capture failed ({type(e).__name__}: {str(e)[:200]}): eager_ms is plain eager")

    times, per_round = time_interleaved(steps, args.warmup, args.iters, args.rounds)
    row.update({f"{v}_ms": times[v] for v in VARIANTS})
    row["speedup"] = times["compile"] / times["evtc"]
    # The spread of the speed-up over the rounds: a row whose range straddles its target is
    # within this run's noise of it.
    row["speedup_rounds"] = [m["compile"] / m["evtc"] for m in per_round]
    if args.control:
        # The same ratio between two plain compiles of the same model: what this row's
        # timing cannot tell apart from 1.
        row["control_ms"] = times["control"]
        row["control_ratio"] = times["compile"] / times["control"]
        row["control_rounds"] = [m["compile"] / m["control"] for m in per_round]
    if alternative:  # compile over evtc with the alternative options, as speedup is for evtc
        row["alt_options"] = args.alternative
        row["alt_ms"] = times["evtc_alt"]
        row["alt_speedup"] = times["compile"] / times["evtc_alt"]
        row["alt_rounds"] = [m["compile"] / m["evtc_alt"] for m in per_round]
    row["evtc_over_eager"] = times["eager"] / times["evtc"]
    if later := len(evtc.torch.reports) - before - len(evtc_reports) - row.get("alt_graphs", 0):
        notes.append(f"evtc compiled {later} more graph(s) after the first call (not in fused/gemms)")
    # Calls made outside CUDA-graph replays only: a replay does not go through the op.
    row["evtc_ran_unfused"] = sum(1 for spec, n in fallback_counts(evtc_reports).items() if n > fallbacks[spec])

    if args.profile:
        row["profile"] = {v: kernel_profile(steps[v]) for v in ("compile", "evtc")}
        if note := host_bound_note(row["profile"]):
            notes.append(note)
            print(f"  {note}", flush=True)
    if args.kernels:
        row["kernels"] = fused_op_times(evtc_reports)
        for kt in row["kernels"]:
            print(f"  {kt['gemm']} -> {', '.join(kt['outputs'])}: " + (
                kt["skipped"] if "skipped" in kt else
                f"{kt['m']}x{kt['n']}x{kt['k']} A {kt['a_layout']} B {kt['b_layout']} {kt['config']}: fused "
                f"{kt['fused_ms']:.4f} ms, torch.mm {kt['mm_ms']:.4f} ms ({kt['fused_over_mm']:.3f}x; model "
                f"{kt['model_fused_over_cublas']:.3f}x)"
                + model_gap_note(kt["fused_over_mm"], kt["model_fused_over_cublas"])), flush=True)

    for v in (VARIANTS + (("evtc_alt",) if alternative else ())) if ref_out is not None else ():
        out, grads = outputs(steps[v], models[v], phase)
        row[f"error_{v}"], row[f"max_abs_{v}"] = deviation(out, ref_out)
        if grads is not None:
            row[f"grad_error_{v}"], row[f"grad_max_abs_{v}"], per_param = gradient_errors(grads, ref_grads)
            for name, err in per_param.items():
                row.setdefault("grad_param_errors", {}).setdefault(name, {})[v] = err
    if check := parameter_check(row):
        row["grad_param_check"] = check
    if alternative and (check := parameter_check(row, "evtc_alt")):
        row["grad_param_check_alt"] = check


def release_memory() -> None:
    gc.collect()  # compiled modules hold reference cycles
    evtc.torch.clear_merged_weights()
    # A deleted model's CUDA-graph trees keep their memory pools until the trees are reset.
    torch._inductor.cudagraph_trees.reset_cudagraph_trees()
    torch.cuda.empty_cache()


# --- reporting --------------------------------------------------------------------------------

def target(row: dict) -> float:
    return TARGETS.get((row["model"], row["phase"]), 1.00)


def fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def row_line(row: dict) -> str:
    head = f"{row['model']} {row['phase']} {row['mode']}:"
    if row.get("speedup") is None:
        return f"{head} error: {row.get('error')}"
    return (f"{head} eager {row['eager_ms']:.3f} ms, compile {row['compile_ms']:.3f}, evtc {row['evtc_ms']:.3f} "
            f"({row['speedup']:.3f}x), fused {row['fused']}/{row['gemms']} GEMMs, first call "
            f"{row['compile_first_s']:.1f} s / {row['evtc_first_s']:.1f} s, rel-L2 vs f64 compile "
            f"{fmt(row.get('error_compile'), '.1e')} evtc {fmt(row.get('error_evtc'), '.1e')}"
            + (f", error: {row['error']}" if row.get("error") else ""))


def markdown_table(data: dict) -> str:
    lines = [f"{data['gpu']}, torch {data['torch']}, transformers {data.get('transformers') or '–'}, {data['date']} "
             f"(median of {data.get('timed', '?')} CUDA-event timings per variant after {data.get('warmup', '?')} "
             "warm-up calls, variants interleaved; evtc / compile: median, and in brackets the range of the "
             "rounds' medians).", "",
             "| model | phase | mode | eager ms | compile ms | evtc ms | evtc / compile | target | met | fused / GEMMs "
             "| first call s (compile / evtc) | rel-L2 vs f64 (eager / compile / evtc) | grad rel-L2 (compile / evtc) "
             "| parameters whose gradient evtc computes less exactly than compile (worst evtc ÷ compile; eager ÷ "
             "compile there) | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        speedup = r.get("speedup")
        met = "–" if speedup is None else "PASS" if speedup >= target(r) else "MISS"
        gemms = f"{r['fused']} / {r['gemms']}" if r.get("gemms") is not None else "–"
        first = f"{fmt(r.get('compile_first_s'), '.1f')} / {fmt(r.get('evtc_first_s'), '.1f')}"
        errors = " / ".join(fmt(r.get(f"error_{v}"), ".1e") for v in VARIANTS)
        grads = (" / ".join(fmt(r.get(f"grad_error_{v}"), ".1e") for v in ("compile", "evtc"))
                 if r["phase"] == "train" else "–")
        check = r.get("grad_param_check")
        params = "–" if not check else (
            f"{check['above_compile']} of {check['params']} ({check['worst_ratio']:.2f}× at {check['worst_param']}; "
            f"eager {fmt(check.get('eager_ratio_there'), '.2f')}×)")
        error = (r.get("error") or "").replace("|", "\\|").replace("\n", " ")[:80] or "–"
        spread = r.get("speedup_rounds")
        spread = f" ({min(spread):.3f}–{max(spread):.3f})" if spread else ""
        if r.get("control_ratio") is not None:
            spread += f"; control {r['control_ratio']:.3f}×"
        if r.get("alt_speedup") is not None:
            spread += f"; alternative {r['alt_speedup']:.3f}×"
            errors += f"; alternative {fmt(r.get('error_evtc_alt'), '.1e')}"
            if alt := r.get("grad_param_check_alt"):
                params += (f"; alternative {alt['above_compile']} of {alt['params']} ({alt['worst_ratio']:.2f}× "
                           f"at {alt['worst_param']})")
        lines.append(f"| {r['model']} | {r['phase']} | {r['mode']} | {fmt(r.get('eager_ms'), '.3f')} "
                     f"| {fmt(r.get('compile_ms'), '.3f')} | {fmt(r.get('evtc_ms'), '.3f')} | "
                     f"{fmt(speedup, '.3f')}{'×' if speedup else ''}{spread} | ≥ {target(r):.2f}× | {met} | {gemms} | {first} "
                     f"| {errors} | {grads} | {params} | {error} |")
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if r.get("speedup")]
    if not rows:
        return
    xs = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(rows) + 2), 4.5))
    ax.bar(xs, [r["speedup"] for r in rows],
           color=["tab:green" if r["speedup"] >= target(r) else "tab:red" for r in rows])
    ax.scatter(xs, [target(r) for r in rows], marker="_", s=250, color="black", zorder=3, label="target")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(xs, [f"{r['model']} {r['phase']} {r['mode']}" for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("evtc speed-up over torch.compile")
    ax.set_title(f"{data['gpu']}, bf16, torch {data['torch']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# --- main -------------------------------------------------------------------------------------

def parse_list(text: str, allowed: tuple) -> list[str]:
    items = [s for s in text.split(",") if s]
    unknown = sorted(set(items) - set(allowed))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {','.join(allowed)}")
    return items


def add_evtc_options_argument(p: argparse.ArgumentParser) -> None:
    """--evtc-options, as every bench that compiles with backend="evtc" beside plain compile
    takes it (compile_kwargs gives its non-evtc. keys to the plain compiles too)."""
    p.add_argument("--evtc-options", type=json.loads, default=None,
                   help='JSON dict of evtc/Inductor options for the evtc backend, e.g. {"evtc.profitability": false} '
                        "(its non-evtc. keys go to the plain compiles too)")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    p.add_argument("--models", type=lambda s: parse_list(s, LAYER_MODELS + HF_MODELS + tuple(LOSS_MODELS)),
                   default=list(LAYER_MODELS + HF_MODELS + tuple(LOSS_MODELS)))
    p.add_argument("--phases", type=lambda s: parse_list(s, PHASES), default=list(PHASES))
    p.add_argument("--modes", type=lambda s: parse_list(s, MODES), default=None,
                   help="default: both; decode then runs in cudagraphs mode only (host-bound otherwise)")
    p.add_argument("--quick", action="store_true", help="2 warm-up and 5 timed calls per variant")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds the timed calls are split over, the variants' order rotating (default 5, --quick 3)")
    p.add_argument("--json-only", action="store_true", help="write the JSON only (no PNG, no table)")
    add_evtc_options_argument(p)
    p.add_argument("--rows", default=None,
                   help="exact (phase:mode) pairs to run, e.g. prefill:default,decode:cudagraphs (overrides --phases/--modes)")
    p.add_argument("--precompile", action="store_true",
                   help="first trace every row's evtc model once in evtc.torch.compile_only() and compile all "
                        "kernels at once (rows then start with the kernels in the disk cache)")
    p.add_argument("--profile", action="store_true",
                   help="also record each row's GPU time by kernel (torch.profiler) for compile and evtc")
    p.add_argument("--control", action="store_true",
                   help="also time a second plain torch.compile of the model (control_ratio: compile over it)")
    p.add_argument("--alternative", type=json.loads, default=None, metavar="JSON",
                   help='also time evtc with these options on top of --evtc-options, as a fourth variant in the '
                        'same rounds, e.g. {"evtc.residual_sums": "f32"} (alt_speedup, error_evtc_alt, '
                        "grad_param_check_alt)")
    p.add_argument("--kernels", action="store_true",
                   help="also time each dense fused op of the row alone against torch.mm of its operands")
    p.add_argument("--freezing", action="store_true",
                   help="Inductor's freezing (weights as constants) for the no-grad rows, plain compile and evtc alike")
    p.add_argument("--no-merge-projections", dest="merge_projections", action="store_false",
                   help="leave the evtc variant's gate/up projections as built (by default "
                        "evtc.torch.merge_projections makes each pair views of one buffer, as docs/python.md advises)")
    p.add_argument("--decode-batch", type=int, default=DECODE_BATCH, metavar="N",
                   help=f"decode rows: N sequences of one new token (default {DECODE_BATCH})")
    p.add_argument("--train-batch", type=int, default=TRAIN_BATCH, metavar="N",
                   help=f"the layer models' training rows: N sequences of 1024 tokens (default {TRAIN_BATCH}, "
                        "which fits the GPU's memory beside eager and two compiled copies)")
    p.add_argument("--table", metavar="FILE.json", help="print the Markdown table of a results file and exit")
    args = p.parse_args()
    if args.decode_batch < 1:
        p.error(f"--decode-batch must be at least 1, got {args.decode_batch}")
    if args.train_batch < 1:
        p.error(f"--train-batch must be at least 1, got {args.train_batch}")
    args.warmup, args.iters = (2, 5) if args.quick else (3, 20)
    if args.rounds is None:
        args.rounds = 3 if args.quick else 5
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    args.iters = int(os.environ.get("EVTC_BENCH_ITERS", args.iters))
    return args


def model_rows(name: str, args) -> list[tuple[str, str]]:
    """The planned rows a model runs: a loss model trains only."""
    return [(phase, mode) for phase, mode in planned_rows(args) if name not in LOSS_MODELS or phase == "train"]


def planned_rows(args) -> list[tuple[str, str]]:
    if args.rows:
        pairs = [tuple(item.split(":")) for item in args.rows.split(",")]
        for phase, mode in pairs:
            if phase not in PHASES or mode not in MODES:
                sys.exit(f"--rows: {phase}:{mode} is not a phase:mode pair ({PHASES} x {MODES})")
        return pairs
    modes = args.modes or list(MODES)
    return [(phase, mode) for phase in args.phases for mode in modes
            if not (phase == "decode" and mode == "default" and args.modes is None)]


def precompile(args) -> float:
    """Traces every planned row's evtc model once inside evtc.torch.compile_only() (outputs are
    meaningless there) so that all kernels compile at once, one nvcc per core, then forgets the
    traced graphs. Returns the wall time, from nothing to every kernel compiled."""
    start = time.perf_counter()
    for name in args.models:
        try:
            base = build(name)
        except Exception:  # reported by the row itself
            continue
        for phase, mode in model_rows(name, args):
            option_sets = [args.evtc_options] + ([{**(args.evtc_options or {}), **args.alternative}]
                                                 if args.alternative is not None else [])
            for options in option_sets:
                try:
                    model = copy.deepcopy(base)
                    if args.merge_projections:
                        merge_projections(model, name, phase)
                    run = torch.compile(model, backend="evtc", dynamic=False,
                                        **compile_kwargs(mode == "cudagraphs", options, True))
                    step = make_step(run, model, make_inputs(name, phase, base), phase, mode == "cudagraphs")
                    with evtc.torch.compile_only():
                        step()
                    del model, run, step
                except Exception as e:  # the row runs (and reports) it again
                    print(f"precompile {name} {phase} {mode}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        del base
        release_memory()
    evtc.torch.wait_for_compiles()
    torch._dynamo.reset()  # rows trace again, so that their reports are theirs
    release_memory()
    return time.perf_counter() - start


def write_json(data: dict, path: str) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=2)
    os.replace(path + ".tmp", path)  # a run stopped mid-write keeps the previous rows


def main() -> None:
    args = parse_args()
    if args.table:
        with open(args.table) as f:
            print(markdown_table(json.load(f)))
        return
    global DECODE_BATCH, TRAIN_BATCH
    DECODE_BATCH = args.decode_batch
    TRAIN_BATCH = args.train_batch
    if not torch.cuda.is_available():
        sys.exit("bench/models.py needs a CUDA GPU")
    # Dynamo decides at trace time whether parameters may become constants, from this global
    # setting (an options dict reaches the compiler only after tracing). It applies to no-grad
    # compiles only: training rows are unaffected.
    torch._inductor.config.freezing = args.freezing
    gpu = torch.cuda.get_device_name()
    now = datetime.now(timezone.utc)
    base_path = result_base(args.out, gpu, "models")
    data = {"gpu": gpu, "torch": torch.__version__, "transformers": transformers_version(),
            "date": now.isoformat(timespec="seconds"), "warmup": args.warmup,
            "timed": args.rounds * math.ceil(args.iters / args.rounds), "rounds": args.rounds, "evtc_options": args.evtc_options,
            "freezing": args.freezing, "merge_projections": args.merge_projections,
            "decode_batch": args.decode_batch, "train_batch": args.train_batch, "rows": []}

    def add(row: dict) -> None:
        data["rows"].append(row)
        write_json(data, base_path + ".json")  # after every row: a run stopped by a time limit keeps its rows
        print(row_line(row), flush=True)

    if args.precompile:
        data["precompile_s"] = precompile(args)
        print(f"precompiled every row's kernels in {data['precompile_s']:.1f} s", flush=True)

    for name in args.models:
        try:
            base = build(name)
        except Exception as e:  # e.g. transformers missing or without this model
            add(new_row(name, "-", "-", error=f"{type(e).__name__}: {e}"))
            continue
        for phase, mode in model_rows(name, args):
            row = new_row(name, phase, mode, notes=row_notes(name, phase, mode, base))
            try:
                run_row(row, base, args)
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
            release_memory()
            add(row)
        del base
        release_memory()

    if not args.json_only:
        try:
            plot(data, base_path + ".png")
        except ImportError as e:
            print(f"no plot: {e}", file=sys.stderr)
        print(markdown_table(data))
    print(f"wrote {base_path}.json" + ("" if args.json_only else " (and .png)"), flush=True)


if __name__ == "__main__":
    main()
