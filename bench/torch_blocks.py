"""torch.compile with evtc vs plain torch.compile vs eager on transformer blocks (bf16).

    python3 bench/torch_blocks.py [--tokens 8192] [--hidden 4096] [--ffn 11008] [--out bench/results]

Blocks, built from torch.nn modules:
  mlp   - the LLaMA MLP: down(silu(gate(x)) * up(x)), no biases;
  layer - a pre-norm transformer layer: LayerNorm, q/k/v/o projections with
          scaled_dot_product_attention (32 heads), residual, LayerNorm, GELU MLP with biases, residual.
Each is timed forward (no grad) and forward+backward, with CUDA events: median of --iters runs
after --warmup runs. Writes <stamp>-torch-blocks.json and .png under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone

import torch
import torch.nn as nn
import torch.nn.functional as F

import evtc.torch  # noqa: E402


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class TransformerLayer(nn.Module):
    def __init__(self, hidden: int, ffn: int, heads: int = 32):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x):  # x: (batch, seq, hidden)
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def time_ms(fn, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def make_block(name: str, args) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if name == "mlp":
        model = LlamaMLP(args.hidden, args.ffn)
        x = torch.randn(args.tokens, args.hidden)
    else:
        model = TransformerLayer(args.hidden, args.ffn)
        x = torch.randn(args.tokens // 2048, 2048, args.hidden)
    return model.cuda().to(torch.bfloat16), x.cuda().to(torch.bfloat16)


def measure(block: str, mode: str, train: bool, args) -> dict:
    model, x = make_block(block, args)
    torch._dynamo.reset()
    fused_before = len(evtc.torch.reports)
    if mode == "eager":
        run = model
    elif mode == "compile":
        run = torch.compile(model)
    else:
        run = torch.compile(model, backend=evtc.torch.backend)
    if train:
        x.requires_grad_(True)

        def step():
            run(x).float().square().mean().backward()
    else:
        def step():
            with torch.no_grad():
                run(x)
    t0 = time.perf_counter()
    step()  # compiles (graphs and evtc kernels)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    ms = time_ms(step, args.warmup, args.iters)
    fused = sum(len(r.fused) for r in evtc.torch.reports[fused_before:])
    refused = [why for r in evtc.torch.reports[fused_before:] for _, why in r.refused]
    print(f"{block:5s} {'fwd+bwd' if train else 'fwd':7s} {mode:12s} {ms:8.3f} ms  (first call {compile_s:.1f} s"
          + (f", evtc fused {fused} GEMMs" if mode == "evtc" else "") + ")", flush=True)
    return {"block": block, "pass": "fwd+bwd" if train else "fwd", "mode": mode, "ms": ms,
            "first_call_s": compile_s, "fused_gemms": fused, "refused": refused}


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = ["eager", "compile", "evtc"]
    have = {(r["block"], r["pass"], r["mode"]) for r in results}
    # Only groups measured in every mode (a run cut short leaves some out).
    groups = sorted({(r["block"], r["pass"]) for r in results if all((r["block"], r["pass"], m) in have for m in modes)},
                    key=lambda g: (g[0] != "mlp", g[1]))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.25
    for i, mode in enumerate(modes):
        speedups = []
        for g in groups:
            base = next(r["ms"] for r in results if (r["block"], r["pass"], r["mode"]) == (*g, "compile"))
            mine = next(r["ms"] for r in results if (r["block"], r["pass"], r["mode"]) == (*g, mode))
            speedups.append(base / mine)
        ax.bar([j + (i - 1) * width for j in range(len(groups))], speedups, width, label=mode)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(range(len(groups)), [f"{b} {p}" for b, p in groups])
    ax.set_ylabel("speed-up over torch.compile")
    ax.set_title("bf16 blocks, tokens=8192, hidden=4096, FFN=11008")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=11008)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--blocks", default="mlp,layer")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = p.parse_args()

    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M")
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"{stamp}-torch-blocks")
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": args.tokens,
            "hidden": args.hidden, "ffn": args.ffn, "warmup": args.warmup, "iters": args.iters,
            "timing": "median of CUDA-event times per call", "stamp": stamp}
    results = []
    for block in args.blocks.split(","):
        for train in (False, True):
            for mode in ("eager", "compile", "evtc"):
                results.append(measure(block, mode, train, args))
                with open(base + ".json", "w") as f:  # after every row: a cut-short run keeps its rows
                    json.dump({"meta": meta, "results": results}, f, indent=2)
    for block in args.blocks.split(","):
        for pass_ in ("fwd", "fwd+bwd"):
            row = {r["mode"]: r["ms"] for r in results if r["block"] == block and r["pass"] == pass_}
            print(f"{block} {pass_}: evtc / compile speed-up {row['compile'] / row['evtc']:.3f}x, "
                  f"compile / eager {row['eager'] / row['compile']:.3f}x")

    plot(results, base + ".png")
    print(f"wrote {base}.json and {base}.png")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--plot":  # re-plot a results file
        with open(sys.argv[2]) as f:
            plot(json.load(f)["results"], sys.argv[2].removesuffix(".json") + ".png")
    else:
        main()
