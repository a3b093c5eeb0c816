#!/usr/bin/env python3
"""Training over many optimizer steps: the losses of torch.compile(backend="evtc") against plain
torch.compile and eager PyTorch, from the same weights and batches (bf16, AdamW, one GPU).

    python3 bench/train_steps.py [--models llama_mlp,llama,gpt2,moe,hf_llama,hf_qwen] [--steps 20]
                                 [--modes default] [--lr 1e-4] [--out bench/results]
    python3 bench/train_steps.py --table bench/results/STAMP-h100-train-steps.json   # only print the table

The models are bench/models.py's, in their training configuration (layers: batch 4 x 1024;
transformers models: 8 x 1024 tokens), with its objective (the loss itself where the model
returns one, else mean(out^2)). Four copies of each train side by side: eager, plain
torch.compile, a second plain torch.compile (the control), and torch.compile(backend="evtc")
on a copy made by evtc.torch.merge_projections (as bench/models.py runs it). Each copy has
its own AdamW (--lr, weight decay 0.01); at every step all four take the same new batch (from
a fixed seed per step), so their losses differ only by how each computes.

What it checks: evtc's losses track plain compile's within the spread of two correct ways of
computing the same step. Per variant, its largest deviation from plain compile's loss over the
steps; evtc passes where its deviation is at most the larger of eager's and the control's
(the control's is zero where Inductor's kernels are deterministic, so eager's, the same model
with other kernel boundaries and roundings, is then the spread). It also records the GEMMs evtc
fused, as bench/models.py does, and the first batch's loss computed in float64 (bench/models.py's
reference copy, before any update) with each variant's first loss minus it (`first_step_error`):
where evtc and plain compile disagree, which of them is off. --evtc-options passes options to the
evtc backend as bench/models.py does (e.g. '{"evtc.precise_math": true}').

Writes <out>/<stamp>-<gpu>-train-steps.json after every model, then a PNG of each model's
loss curves with evtc's and eager's deviation from plain compile, and prints a Markdown table.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from datetime import datetime, timezone

import torch

import evtc.torch
import models  # bench/models.py: the models, their inputs and objective, the compile options
from result_files import result_base

VARIANTS = ("eager", "compile", "control", "evtc")
DEFAULT_MODELS = ("llama_mlp", "llama", "gpt2", "moe", "hf_llama", "hf_qwen")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    known = models.LAYER_MODELS + models.HF_MODELS
    p.add_argument("--models", type=lambda s: models.parse_list(s, known), default=list(DEFAULT_MODELS),
                   help=f"comma-separated, of {', '.join(known)}")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    p.add_argument("--modes", type=lambda s: models.parse_list(s, models.MODES), default=["default"],
                   help="default and/or cudagraphs (torch.compile mode reduce-overhead)")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW's learning rate (default 1e-4)")
    models.add_evtc_options_argument(p)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    p.add_argument("--table", metavar="FILE.json", help="print the Markdown table of a results file and exit")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be 1 or more")
    if not args.lr > 0:
        p.error("--lr must be positive")
    return args


def max_deviation(losses: list[float], ref: list[float]) -> float:
    """The largest |loss - reference| over the steps (inf where a loss is not finite)."""
    worst = 0.0
    for a, b in zip(losses, ref):
        d = abs(a - b)
        worst = max(worst, d if d == d else float("inf"))  # NaN counts as the worst
    return worst


def judge(losses: dict[str, list[float]]) -> dict:
    """Each variant's largest deviation from plain compile, the spread of the two plain ones
    (eager, control) and whether evtc stays within it."""
    ref = losses["compile"]
    dev = {v: max_deviation(losses[v], ref) for v in losses if v != "compile"}
    spread = max(dev["eager"], dev["control"])
    return {"max_deviation": dev, "spread": spread, "within_spread": dev["evtc"] <= spread}


def first_step_errors(losses: dict[str, list[float]], loss_f64: float) -> dict[str, float]:
    """Each variant's first loss (before any update: the same weights and batch for all) minus
    the float64 model's: which of two variants that disagree is off, and by how much."""
    return {v: losses[v][0] - loss_f64 for v in losses if losses[v]}


def batch(name: str, model, step: int) -> tuple:
    """Step `step`'s batch (from 0), the same for every variant."""
    return models.make_inputs(name, "train", model, seed=models.SEED + 1 + step)


def train(name: str, mode: str, args) -> dict:
    row = {"model": name, "mode": mode, "steps": args.steps, "lr": args.lr}
    base = models.build(name)  # eval mode, as bench/models.py's training rows: no dropout to tell apart
    try:  # the first batch's loss in float64 (bench/models.py's reference copy), before any update
        # The forward alone (a no-grad phase): the loss is all that is compared.
        ref_out, _ = models.reference(base, batch(name, base, 0), "prefill")
        row["first_loss_f64"] = float(models.loss_of(ref_out))
    except Exception as e:  # the run stands without it
        row["first_loss_f64_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    copies = {v: copy.deepcopy(base) for v in VARIANTS}
    del base
    merged = models.merge_projections(copies["evtc"], name, "train")
    row["merged_projections"] = len(merged)
    cudagraphs = mode == "cudagraphs"
    runs = {"eager": copies["eager"]}
    for v in ("compile", "control"):
        runs[v] = torch.compile(copies[v], dynamic=False, **models.compile_kwargs(cudagraphs, args.evtc_options, False))
    runs["evtc"] = torch.compile(copies["evtc"], backend="evtc", dynamic=False,
                                 **models.compile_kwargs(cudagraphs, args.evtc_options, True))
    optimizers = {v: torch.optim.AdamW(copies[v].parameters(), lr=args.lr, weight_decay=0.01) for v in VARIANTS}
    losses: dict[str, list[float]] = {v: [] for v in VARIANTS}
    before = len(evtc.torch.reports)
    for step in range(args.steps):
        inputs = batch(name, copies["eager"], step)
        for v in VARIANTS:
            optimizers[v].zero_grad(set_to_none=True)
            if cudagraphs and v != "eager":
                torch.compiler.cudagraph_mark_step_begin()
            loss = models.loss_of(runs[v](*inputs))
            loss.backward()
            optimizers[v].step()
            losses[v].append(float(loss.detach()))
        print(f"{name} {mode} step {step + 1}/{args.steps}: " +
              ", ".join(f"{v} {losses[v][-1]:.6g}" for v in VARIANTS), flush=True)
    row["compile_errors"] = evtc.torch.wait_for_compiles()
    row.update(models.fusion_counts(evtc.torch.reports[before:]))
    row["losses"] = losses
    row.update(judge(losses))
    if "first_loss_f64" in row:
        row["first_step_error"] = first_step_errors(losses, row["first_loss_f64"])
        print(f"{name} {mode}: first loss minus float64's " +
              ", ".join(f"{v} {e:+.3g}" for v, e in row["first_step_error"].items()), flush=True)
    del runs, copies, optimizers
    models.release_memory()
    return row


def markdown_table(data: dict) -> str:
    lines = [f"{data['gpu']}, torch {data['torch']}, {data['date']}: {data['steps']} AdamW steps "
             f"(lr {data['lr']}), the same batches for every variant; deviations are the largest "
             "|loss - plain compile's loss| over the steps.", "",
             "| model | mode | first loss | last loss (compile) | evtc | eager | control | within spread | fused / GEMMs "
             "| first loss − float64's (compile / evtc) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['mode']} | error: {r['error'][:120]} | | | | | | | |")
            continue
        d, c = r["max_deviation"], r["losses"]["compile"]
        first = r.get("first_step_error")
        first = f"{first['compile']:+.3g} / {first['evtc']:+.3g}" if first else "–"
        lines.append(f"| {r['model']} | {r['mode']} | {c[0]:.6g} | {c[-1]:.6g} | {d['evtc']:.3g} | {d['eager']:.3g} | "
                     f"{d['control']:.3g} | {'yes' if r['within_spread'] else '**no**'} | {r['fused']} / {r['gemms']} "
                     f"| {first} |")
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if "losses" in r]
    if not rows:
        return
    fig, axes = plt.subplots(2, len(rows), figsize=(3.2 * len(rows) + 1, 6), squeeze=False)
    for i, r in enumerate(rows):
        steps = range(1, len(r["losses"]["compile"]) + 1)
        top, bottom = axes[0][i], axes[1][i]
        for v in VARIANTS:
            top.plot(steps, r["losses"][v], label=v, linestyle="--" if v == "control" else "-")
        top.set_title(f"{r['model']} ({r['mode']})", fontsize=9)
        ref = r["losses"]["compile"]
        for v in ("evtc", "eager", "control"):
            bottom.plot(steps, [a - b for a, b in zip(r["losses"][v], ref)], label=f"{v} - compile")
        bottom.set_xlabel("step")
    axes[0][0].set_ylabel("loss")
    axes[1][0].set_ylabel("loss - plain compile's")
    axes[0][-1].legend(fontsize=7)
    axes[1][-1].legend(fontsize=7)
    fig.suptitle(f"{data['gpu']}: AdamW steps, evtc against plain torch.compile", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    args = parse_args()
    if args.table:
        with open(args.table) as f:
            print(markdown_table(json.load(f)))
        return
    if not torch.cuda.is_available():
        sys.exit("bench/train_steps.py needs a CUDA GPU")
    gpu = torch.cuda.get_device_name()
    os.makedirs(args.out, exist_ok=True)
    base_path = result_base(args.out, gpu, "train-steps")
    data = {"gpu": gpu, "torch": torch.__version__, "transformers": models.transformers_version(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "steps": args.steps, "lr": args.lr,
            "evtc_options": args.evtc_options, "rows": []}
    for name in args.models:
        for mode in args.modes:
            try:
                row = train(name, mode, args)
            except Exception as e:  # recorded; the other models go on
                row = {"model": name, "mode": mode, "error": f"{type(e).__name__}: {str(e)[:2000]}"}
                models.release_memory()
            data["rows"].append(row)
            models.write_json(data, base_path + ".json")
    try:
        plot(data, base_path + ".png")
    except ImportError as e:
        print(f"no plot: {e}", file=sys.stderr)
    print(markdown_table(data))
    print(f"wrote {base_path}.json", flush=True)
    bad = [r for r in data["rows"] if "error" in r or not r.get("within_spread")]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
