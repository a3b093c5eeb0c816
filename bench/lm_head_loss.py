"""The LM head and its loss in one training step: plain torch.compile against
torch.compile(backend="evtc"), which rewrites linear + float + cross_entropy into
evtc.torch.linear_cross_entropy, both ways it runs: saving the 16-bit logits (three GEMMs, the
softmax's reduction in the forward GEMM's epilogue) and recomputing them (four GEMMs, no
[tokens, vocab] tensor). The row says which of the two evtc chooses by default at its size.

    python3 bench/lm_head_loss.py                       # vocab 32000 and 128256, 8192 tokens, hidden 4096
    python3 bench/lm_head_loss.py --vocab 128256 --quick

Per vocabulary, in one process: each variant's step time (zeroed grads, forward, backward;
median over interleaved rounds), its peak GPU memory during the step above what the model and
inputs hold, and the error of its loss and of the gradients of h and W against a float64
eager step (relative L2). Writes bench/results/<stamp>-<gpu>-lm-head-loss.json and .png.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys

os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import evtc.torch  # noqa: E402
from models import time_interleaved  # noqa: E402  (bench/models.py's interleaved rounds)
from result_files import result_base  # noqa: E402

IGNORE = -100
# evtc.linear_cross_entropy's two ways (torch.compile option values).
EVTC_MODES = ("save_logits", "recompute")


class LMHeadLoss(nn.Module):
    """A causal LM's last step: logits of the final hidden states, upcast, cross-entropy."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, h, labels):
        logits = self.lm_head(h)
        # .float(), except in the float64 reference (whose logits stay float64).
        logits = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=IGNORE)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def make_step(run, model, h, labels):
    def step():
        model.zero_grad(set_to_none=True)
        h.grad = None
        loss = run(h, labels)
        loss.backward()
        return loss
    return step


def peak_step_bytes(step, model, h) -> int:
    """Peak memory allocated during one step, above what the model, the inputs and the
    optimizer-free state hold before it (the previous step's gradients freed first, as the step
    itself frees them)."""
    model.zero_grad(set_to_none=True)
    h.grad = None
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def rel(x, ref) -> float:
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def run_vocab(vocab: int, args) -> dict:
    torch.manual_seed(0)
    row = {"vocab": vocab, "tokens": args.tokens, "hidden": args.hidden, "notes": []}
    with torch.device("cuda"):
        base = LMHeadLoss(args.hidden, vocab).to(torch.bfloat16)
    gen = torch.Generator("cuda").manual_seed(1)
    h = torch.randn(args.tokens // 1024, 1024, args.hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
    h.requires_grad_()
    labels = torch.randint(0, vocab, (args.tokens // 1024, 1024), generator=gen, device="cuda")
    labels[:, -1] = IGNORE  # the last position of each sequence has no next token
    ce = evtc.torch._cross_entropy
    row["default"] = "save_logits" if ce.saves_logits(args.tokens, vocab) else "recompute"
    models = {"compile": base}
    runs = {"compile": torch.compile(base, dynamic=False)}
    for mode in EVTC_MODES:
        models[mode] = LMHeadLoss(args.hidden, vocab).to("cuda", torch.bfloat16)
        models[mode].load_state_dict(base.state_dict())
        runs[mode] = torch.compile(models[mode], backend="evtc", dynamic=False,
                                   options={"evtc.wait_for_compile": True, "evtc.linear_cross_entropy": mode})
    steps = {v: make_step(runs[v], models[v], h, labels) for v in runs}
    specs = {"save_logits": [ce._saving_spec(torch.bfloat16)], "recompute": list(ce._specs(torch.bfloat16))}
    results = {}
    row["evtc_kernel_calls"] = {}
    for v in runs:
        log(f"[{vocab}] first call of {v} (compiles)")
        before = [evtc.torch.path_counts(s)["fused"] for s in specs.get(v, [])]
        loss = steps[v]()
        results[v] = (loss.detach().clone(), h.grad.clone(), models[v].lm_head.weight.grad.clone())
        if v in specs:
            fused = [evtc.torch.path_counts(s)["fused"] - b for s, b in zip(specs[v], before)]
            row["evtc_kernel_calls"][v] = fused
            if not all(fused):
                row["notes"].append(f"{v}: evtc did not run its fused kernels (rewrite refused or unfused)")

    for v in runs:
        row[f"{v}_peak_gib"] = peak_step_bytes(steps[v], models[v], h) / 2**30

    # args.iters steps per variant and round (time_interleaved spreads its total over the rounds).
    times, per_round = time_interleaved(steps, args.warmup, args.iters * args.rounds, args.rounds)
    for v in steps:
        row[f"{v}_ms"] = times[v]
    for mode in EVTC_MODES:
        row[f"{mode}_peak_ratio"] = row[f"{mode}_peak_gib"] / row["compile_peak_gib"]
        row[f"{mode}_time_ratio"] = row[f"{mode}_ms"] / row["compile_ms"]
        row[f"{mode}_time_ratio_rounds"] = [m[mode] / m["compile"] for m in per_round]
    # evtc's default at this size.
    row["peak_ratio"] = row[f"{row['default']}_peak_ratio"]
    row["time_ratio"] = row[f"{row['default']}_time_ratio"]

    # float64 eager reference of the same step.
    try:
        ref_model = LMHeadLoss(args.hidden, vocab).to("cuda", torch.float64)
        ref_model.load_state_dict({k: t.double() for k, t in base.state_dict().items()})
        h64 = h.detach().double().requires_grad_()
        loss = ref_model(h64, labels)
        loss.backward()
        ref = (loss.detach(), h64.grad, ref_model.lm_head.weight.grad)
        for v, got in results.items():
            for name, g, r in zip(("loss", "dh", "dW"), got, ref):
                row[f"{v}_error_{name}"] = rel(g, r)
        del ref_model, h64, ref, loss
    except torch.OutOfMemoryError:
        row["notes"].append("no float64 reference (out of memory)")
    del runs, steps, models, results
    gc.collect()
    torch.cuda.empty_cache()
    torch._dynamo.reset()
    return row


def plot(data: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    labels = [f"vocab {r['vocab']}" for r in rows]
    xs = range(len(rows))
    width = 0.4
    for ax, key, title in ((axes[0], "time_ratio", "step time, evtc / torch.compile"),
                           (axes[1], "peak_ratio", "peak step memory, evtc / torch.compile")):
        for i, (mode, color) in enumerate(zip(EVTC_MODES, ("tab:blue", "tab:orange"))):
            ax.bar([x + (i - 0.5) * width for x in xs], [r[f"{mode}_{key}"] for r in rows], width, color=color,
                   label=mode + " (hatched: the default)")
            for x, r in zip(xs, rows):
                if r["default"] == mode:
                    ax.bar(x + (i - 0.5) * width, r[f"{mode}_{key}"], width, color=color, hatch="//",
                           edgecolor="black")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(list(xs), labels)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"LM head + cross-entropy, {data['tokens']} tokens, hidden {data['hidden']}, {data['gpu']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", default="32000,128256", help="comma-separated vocabulary sizes")
    p.add_argument("--tokens", type=int, default=8192, help="tokens per step (a multiple of 1024)")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--iters", type=int, default=5, help="timed steps per variant and round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="2 rounds of 3 steps")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args()
    if args.tokens % 1024:
        p.error("--tokens must be a multiple of 1024")
    if args.quick:
        args.rounds, args.iters, args.warmup = 2, 3, 1
    gpu = torch.cuda.get_device_name()
    data = {"gpu": gpu, "torch": torch.__version__, "tokens": args.tokens, "hidden": args.hidden,
            "method": f"median of {args.rounds} interleaved rounds x {args.iters} steps (CUDA events); peak memory "
                      "of one step above what was allocated before it", "rows": []}
    for vocab in (int(v) for v in args.vocab.split(",")):
        row = run_vocab(vocab, args)
        data["rows"].append(row)
        for mode in EVTC_MODES:
            log(f"vocab {vocab}, {mode}{' (default)' if row['default'] == mode else ''}: step "
                f"{row['compile_ms']:.2f} ms compile, {row[mode + '_ms']:.2f} ms evtc ({row[mode + '_time_ratio']:.3f}x); "
                f"peak {row['compile_peak_gib']:.2f} vs {row[mode + '_peak_gib']:.2f} GiB ({row[mode + '_peak_ratio']:.3f}x)")
    base = result_base(args.out, gpu, "lm-head-loss")
    with open(base + ".json", "w") as f:
        json.dump(data, f, indent=2)
    plot(data, base + ".png")
    print(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
