#!/usr/bin/env python3
"""Scoring chosen tokens under an LM head, as RL and sampling code does it without gradients:
plain torch.compile against torch.compile(backend="evtc"), which rewrites
log_softmax(linear(h)[:, :-1].float()).gather(-1, next tokens) into evtc.torch.token_logprobs
(one GEMM writing each row's logsumexp; no [tokens, vocab] logits).

    python3 bench/token_scoring.py                     # vocab 32000 and 128256, 8192 tokens, hidden 4096
    python3 bench/token_scoring.py --vocab 128256 --quick

Per vocabulary, in one process, under torch.no_grad(): each variant's time per call (median
over interleaved rounds), its peak GPU memory during a call above what the model and inputs
hold, and the error of its log-probabilities against a float64 eager call (relative L2).
Writes bench/results/<stamp>-<gpu>-token-scoring.json and .png.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
from datetime import datetime, timezone

import torch
import torch.nn as nn

import evtc.torch
from lm_head_loss import rel  # bench/lm_head_loss.py's relative L2 error
from models import release_memory, time_interleaved, write_json  # bench/models.py's interleaved rounds
from result_files import result_base

VARIANTS = ("compile", "evtc")


class Scorer(nn.Module):
    """Each position's log-probability of the next token (the last position has none)."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, h, tokens):
        logits = self.lm_head(h)[:, :-1, :]
        logits = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
        return logits.log_softmax(-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)


def peak_call_bytes(call) -> int:
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak


def run_vocab(vocab: int, args) -> dict:
    torch.manual_seed(0)
    row = {"vocab": vocab, "tokens": args.tokens, "hidden": args.hidden, "notes": []}
    with torch.device("cuda"):
        model = Scorer(args.hidden, vocab).to(torch.bfloat16)
    gen = torch.Generator("cuda").manual_seed(1)
    h = torch.randn(args.tokens // 1024, 1024, args.hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
    tokens = torch.randint(0, vocab, (args.tokens // 1024, 1024), generator=gen, device="cuda")
    runs = {"compile": torch.compile(model, dynamic=False),
            "evtc": torch.compile(model, backend="evtc", dynamic=False, options={"evtc.wait_for_compile": True})}

    def caller(run):
        def call():
            with torch.no_grad():
                return run(h, tokens)
        return call

    calls = {v: caller(runs[v]) for v in VARIANTS}
    forward = evtc.torch._cross_entropy._specs(torch.bfloat16)[0]
    before = evtc.torch.path_counts(forward)["fused"]
    results = {v: calls[v]().clone() for v in VARIANTS}
    row["evtc_kernel_calls"] = evtc.torch.path_counts(forward)["fused"] - before
    if not row["evtc_kernel_calls"]:
        row["notes"].append("evtc did not run token_logprobs' kernel (rewrite refused or unfused)")
    for v in VARIANTS:
        row[f"{v}_peak_gib"] = peak_call_bytes(calls[v]) / 2**30
    times, per_round = time_interleaved(calls, args.warmup, args.iters * args.rounds, args.rounds)
    for v in VARIANTS:
        row[f"{v}_ms"] = times[v]
    row["time_ratio"] = times["evtc"] / times["compile"]
    row["time_ratio_rounds"] = [m["evtc"] / m["compile"] for m in per_round]
    row["peak_ratio"] = row["evtc_peak_gib"] / row["compile_peak_gib"]
    del runs, calls
    release_memory()
    # The float64 reference: the model itself, converted (nothing else needs it now).
    try:
        with torch.no_grad():
            ref = model.double()(h.double(), tokens)
        row.update({f"{v}_error": rel(results[v], ref) for v in VARIANTS})
    except torch.OutOfMemoryError:
        row["notes"].append("no float64 reference (out of memory)")
    del results, model
    release_memory()
    torch._dynamo.reset()
    return row


def plot(data: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["time_ratio"] for r in rows], 0.4, label="time, evtc / compile")
    ax.bar([x + 0.2 for x in xs], [r["peak_ratio"] for r in rows], 0.4, label="peak memory, evtc / compile")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(list(xs), [f"vocab {r['vocab']}" for r in rows])
    ax.set_title(f"{data['gpu']}: scoring {data['tokens']} tokens (no grad)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=lambda s: [int(v) for v in s.split(",")], default=[32000, 128256])
    p.add_argument("--tokens", type=int, default=8192, help="a multiple of 1024 (sequences of 1024)")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--quick", action="store_true", help="2 warm-up calls, 3 rounds of 3")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args()
    if args.tokens % 1024 or args.tokens <= 0:
        p.error("--tokens must be a positive multiple of 1024")
    args.warmup, args.rounds, args.iters = (2, 3, 3) if args.quick else (3, 5, 10)
    if not torch.cuda.is_available():
        sys.exit("bench/token_scoring.py needs a CUDA GPU")
    gpu = torch.cuda.get_device_name()
    base = result_base(args.out, gpu, "token-scoring")
    data = {"gpu": gpu, "torch": torch.__version__, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "tokens": args.tokens, "hidden": args.hidden, "rows": []}
    for vocab in args.vocab:
        row = run_vocab(vocab, args)
        data["rows"].append(row)
        write_json(data, base + ".json")
        print(f"vocab {vocab}: compile {row['compile_ms']:.3f} ms, evtc {row['evtc_ms']:.3f} ms "
              f"({row['time_ratio']:.3f}x time), peak {row['compile_peak_gib']:.2f} / {row['evtc_peak_gib']:.2f} GiB "
              f"({row['peak_ratio']:.3f}x), error vs f64 {row.get('compile_error', float('nan')):.2e} / "
              f"{row.get('evtc_error', float('nan')):.2e}; {'; '.join(row['notes'])}", flush=True)
    try:
        plot(data, base + ".png")
    except ImportError as e:
        print(f"no plot: {e}", file=sys.stderr)
    print(f"wrote {base}.json", flush=True)


if __name__ == "__main__":
    main()
