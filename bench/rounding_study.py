#!/usr/bin/env python3
"""Where a bf16 forward's 16-bit roundings move GPT-2's training objective (CPU, float64).

    python3 bench/rounding_study.py [--tokens 2048] [--seed 0] [--out bench/results]

bench/models.py's GPT-2 layer (hidden 1600, 25 heads, FFN 6400, Conv1D weights with random
biases) with bf16 weights and input, computed in float64 throughout except where a stage's
result is rounded to bf16. Stages, in order: ln1 (LayerNorm), qkv (c_attn's addmm, bias
included), att (SDPA), proj (c_proj's addmm), y (the residual sum as the second residual add
reads it), y_ln (the same sum as ln_2 reads it), ln2, fc (c_fc's addmm: the GELU's
pre-activation), gelu, mlp (mlp_proj's addmm), out (the second residual sum). The objective is
bench/models.py's mean(out^2).

Rows: nothing rounded (the reference), every stage rounded (what a bf16 step computes), each
stage alone, and every stage but one. "Every stage but fc" is a fused kernel that computes the
GELU from the unrounded pre-activation while plain torch.compile reads cuBLAS's rounded addmm
result. That is the gap between evtc's and plain compile's losses that bench/train_steps.py
measured on an H200 (1.6e-4 at GPT-2's first step) before the compile cast mode kept that
rounding (docs/passes.md, "normalize_casts").

Pipelines: the roundings each way of running the layer makes, with the output's relative L2
error against float64 and the objective's offset. Eager rounds every op's result. Plain
torch.compile rounds every stage but the first residual sum: Inductor recomputes x + proj in
float32 inside both kernels that read it (ln_2's and the second residual add's), so neither y
nor y_ln is rounded. evtc, with the residual adds fused into c_proj's and mlp_proj's epilogues
under the compile cast mode, rounds acc + bias before each add as cuBLAS's addmm would and
stores the sum rounded, which ln_2 and the second add then read: every stage, as eager. Before
the compile cast mode kept the library GEMM's rounding of a biased result, evtc rounded neither
GEMM result before its residual add nor c_fc's before the GELU (proj, mlp, fc). The last row
keeps c_fc's rounding and leaves out only the residual GEMMs': a choice the cast mode could make.
With the setting evtc.residual_sums "f32" (docs/python.md, "Residual sums"), c_proj's fused op
writes the sum unrounded in f32, which ln_2 and mlp_proj's epilogue read; with "recomputed",
c_proj's residual add stays with Inductor and mlp_proj's epilogue adds x and proj itself. Either
way the roundings are plain compile's.

Writes <out>/<stamp>-cpu-rounding-study.json and .png (each row's objective minus the
reference's) and prints a Markdown table. No GPU is used. About two minutes on two cores with
the default 2048 tokens.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402  (bench/models.py: the GPT-2 layer)
from result_files import pyplot, result_base, save_png  # noqa: E402

STAGES = ("ln1", "qkv", "att", "proj", "y", "y_ln", "ln2", "fc", "gelu", "mlp", "out")
PIPELINES = {
    "eager": STAGES,
    "plain compile": tuple(s for s in STAGES if s not in ("y", "y_ln")),
    "evtc": STAGES,
    "evtc before the cast-mode fix": tuple(s for s in STAGES if s not in ("proj", "mlp", "fc")),
    "evtc, residual GEMMs unrounded": tuple(s for s in STAGES if s not in ("proj", "mlp")),
    "evtc, residual_sums f32 or recomputed": tuple(s for s in STAGES if s not in ("y", "y_ln")),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=2048,
                   help="tokens, in sequences of 1024 (default 2048; a multiple of 1024)")
    p.add_argument("--seed", type=int, default=0, help="weights' and input's seed (default 0)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if args.tokens < 1024 or args.tokens % 1024:
        p.error(f"--tokens must be a positive multiple of 1024, got {args.tokens}")
    return args


class Layer:
    """GPT-2's layer as float64 tensors holding bf16 values; `objective(rounded)` rounds the
    named stages' results to bf16."""

    def __init__(self, tokens: int, seed: int, hidden: int = 1600, heads: int = 25, ffn: int = 6400):
        torch.manual_seed(seed)
        layer = models.GPT2Layer(hidden, heads, ffn)
        self.p = {n: t.detach().to(torch.bfloat16).double() for n, t in layer.named_parameters()}
        self.heads = heads
        self.x = torch.randn(tokens // 1024, 1024, hidden).to(torch.bfloat16).double()

    def objective(self, rounded) -> float:
        return float(self.forward(rounded).pow(2).mean())

    def forward(self, rounded):
        """The layer's output with the named stages' results rounded to bf16."""
        p, x = self.p, self.x
        b, s, h = x.shape

        def r(t, stage):
            return t.to(torch.bfloat16).double() if stage in rounded else t

        a = r(F.layer_norm(x, (h,), p["ln_1.weight"], p["ln_1.bias"]), "ln1")
        qkv = r(a.view(-1, h) @ p["c_attn.weight"] + p["c_attn.bias"], "qkv").view(b, s, -1)
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in qkv.split(h, dim=-1))
        att = r(F.scaled_dot_product_attention(q, k, v, is_causal=True), "att")
        proj = r(att.transpose(1, 2).reshape(-1, h) @ p["c_proj.weight"] + p["c_proj.bias"], "proj")
        y_sum = x + proj.view(b, s, h)
        y = r(y_sum, "y")
        c = r(F.layer_norm(r(y_sum, "y_ln"), (h,), p["ln_2.weight"], p["ln_2.bias"]), "ln2")
        f = r(c.view(-1, h) @ p["c_fc.weight"] + p["c_fc.bias"], "fc")
        g = r(F.gelu(f, approximate="tanh"), "gelu")
        m = r(g @ p["mlp_proj.weight"] + p["mlp_proj.bias"], "mlp")
        return r(y + m.view(b, s, h), "out")


def study(layer: Layer, stages=STAGES) -> dict:
    """The objective with nothing rounded, each row's objective minus it, and each pipeline's
    output error (relative L2 against float64's output) and objective offset."""
    outputs = {}  # one forward per set of roundings: rows and pipelines share several

    def output(rounded):
        key = frozenset(rounded)
        if key not in outputs:
            outputs[key] = layer.forward(key)
        return outputs[key]

    exact = output(())
    reference = float(exact.pow(2).mean())
    rows = [("every stage", tuple(stages))]
    rows += [(f"only {s}", (s,)) for s in stages]
    rows += [(f"all but {s}", tuple(t for t in stages if t != s)) for s in stages]
    offsets = {}
    for label, rounded in rows:
        offsets[label] = float(output(rounded).pow(2).mean()) - reference
        print(f"{label:14s} {offsets[label]:+.3e}", flush=True)
    pipelines = {}
    for name, rounded in PIPELINES.items():
        out = output(rounded)
        pipelines[name] = {"rounded": list(rounded), "rel_l2": models.deviation(out, exact)[0],
                           "offset": float(out.pow(2).mean()) - reference}
        print(f"{name}: output rel-L2 {pipelines[name]['rel_l2']:.3e}, objective {pipelines[name]['offset']:+.3e}",
              flush=True)
    return {"reference": reference, "offsets": offsets, "pipelines": pipelines}


def markdown_table(data: dict) -> str:
    lines = [f"GPT-2 layer, {data['tokens']} tokens, seed {data['seed']}: mean(out^2) in float64 = "
             f"{data['reference']:.7f}; each row's objective minus it.", "",
             "| rounded to bf16 | objective - float64's |", "|---|---|"]
    lines += [f"| {label} | {offset:+.3e} |" for label, offset in data["offsets"].items()]
    if data.get("pipelines"):
        lines += ["", "| pipeline | not rounded | output rel-L2 vs float64 | objective - float64's |", "|---|---|---|---|"]
        lines += [f"| {name} | {', '.join(s for s in STAGES if s not in row['rounded']) or '–'} | {row['rel_l2']:.3e} "
                  f"| {row['offset']:+.3e} |" for name, row in data["pipelines"].items()]
    return "\n".join(lines)


def plot(data: dict, base: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    labels = list(data["offsets"])
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.bar(range(len(labels)), [data["offsets"][k] for k in labels],
           color=["tab:red" if k == "all but fc" else "tab:blue" for k in labels])
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=8)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_ylabel("mean(out^2) - float64's")
    ax.set_title(f"GPT-2 layer, {data['tokens']} tokens: where bf16 roundings move the objective", fontsize=10)
    save_png(fig, base)


def main() -> None:
    args = parse_args()
    data = {"tokens": args.tokens, "seed": args.seed, "torch": torch.__version__}
    data.update(study(Layer(args.tokens, args.seed)))
    base = result_base(args.out, None, "rounding-study", slug="cpu")
    with open(base + ".json", "w") as f:
        json.dump(data, f, indent=2)
    print(f"wrote {base}.json")
    plot(data, base)
    print(markdown_table(data))


if __name__ == "__main__":
    main()
