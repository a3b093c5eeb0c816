#!/usr/bin/env python3
"""Training with several processes (PyTorch's torchrun): evtc against plain torch.compile, and one
compile per kernel across the processes.

    torchrun --standalone --nproc-per-node 2 bench/distributed.py          # DDP; gloo when ranks share a GPU
    torchrun --standalone --nproc-per-node 8 bench/distributed.py --strategy fsdp2   # one GPU per rank: NCCL
    torchrun --standalone --nproc-per-node 4 bench/distributed.py --strategy tp      # tensor-parallel MLP
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 bench/distributed.py ...

Strategies: ``ddp`` (DistributedDataParallel over bench/models.py's LLaMA decoder layer, each
rank its own batch), ``fsdp2`` (``torch.distributed.fsdp.fully_shard`` of the layer and its MLP,
each rank its own batch) and ``tp`` (the layer's MLP with ``ColwiseParallel`` gate/up and
``RowwiseParallel`` down projections through ``torch.distributed.tensor.parallel``; every rank
the same batch). The process group is NCCL when every rank has a GPU of its own, else gloo
(several ranks on one GPU: NCCL refuses that; ``--backend`` overrides).

Each rank builds the same model (fixed seed) and runs ``--steps`` SGD steps three ways: eager in
float64 (the reference), ``torch.compile`` (Inductor) and ``torch.compile(backend="evtc")`` with
``evtc.wait_for_compile`` (fused kernels from the first call). It checks every step's loss and the
first step's gradients (after the strategy's reduction: all ranks agree) against float64: evtc's
error must be at most max(2 x plain torch.compile's, 2^-8). evtc's kernel cache is a folder every
rank shares (``--cache``, default a fresh one made by rank 0, so that the kernels do compile):
each rank lists the kernels it compiled with nvcc or waited for while another rank compiled them
(``evtc.compile_events()``), and the run checks that every kernel was compiled by exactly one
rank. Rank 0 writes <out>/<stamp>-<gpu>-distributed-<strategy>.json and a PNG of the losses, and
prints a summary. Exits 1 when a check fails.

To warm a cluster's shared cache before a job (so no rank compiles): run the job once on one
node with ``EVTC_RECORD_KERNELS=kernels.json``, then ``evtc aot build -o LIB --list kernels.json``
and give every rank ``EVTC_KERNEL_LIBRARY=LIB`` (no nvcc needed), or point ``EVTC_CACHE_DIR`` at
the shared folder the warm-up compiled into (docs/backend.md, "Several processes, several hosts").
"""
from __future__ import annotations

import argparse
import copy
import faulthandler
import json
import math
import os
import sys
import tempfile
import time

# NVLink multicast (NVLS, symmetric-memory multicast) stays off in every rank: not every machine
# with several GPUs supports it, and a collective that tries it there fails.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")  # every compile runs evtc's pass
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import LlamaLayer, LlamaMLP, loss_of  # noqa: E402
from result_files import result_base  # noqa: E402

STRATEGIES = ("ddp", "fsdp2", "tp")
VARIANTS = ("float64", "compile", "evtc")
BF16_UNIT = 2.0 ** -8


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategy", choices=STRATEGIES, default="ddp")
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                   help="process group backend (auto: nccl when each rank has its own GPU, else gloo)")
    p.add_argument("--steps", type=int, default=3, help="training steps per variant")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=11008)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank")
    p.add_argument("--tokens", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--evtc-options", type=json.loads, default={},
                   help='more of the evtc backend\'s options, as JSON (e.g. \'{"evtc.profitability": false}\')')
    p.add_argument("--cache", help="evtc's kernel cache folder, shared by all ranks (default: a fresh one)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args()
    if args.steps < 1:
        p.error("--steps: at least 1")
    return args


def init(args) -> tuple[int, int, torch.device, str]:
    if "RANK" not in os.environ:
        sys.exit("bench/distributed.py runs under torchrun, e.g. `torchrun --standalone --nproc-per-node 2 bench/distributed.py`")
    if not torch.cuda.is_available():
        sys.exit("bench/distributed.py needs CUDA GPUs")
    local_rank, world = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    gpus = torch.cuda.device_count()
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if local_world <= gpus else "gloo"
    if backend == "nccl" and local_world > gpus:
        sys.exit(f"--backend nccl: {local_world} ranks on this node share {gpus} GPU(s), which NCCL refuses; "
                 "use --backend gloo or fewer ranks")
    if args.strategy != "ddp" and backend == "gloo":
        # Measured with torch 2.11 on one H200: gloo's CUDA all-gather under DTensor (FSDP2's
        # parameter gathers, tensor parallelism's redistributions) ends the process with SIGSEGV.
        sys.exit(f"--strategy {args.strategy} needs NCCL (one GPU per rank): with gloo, DTensor's collectives "
                 "on CUDA tensors crash in torch; run it with as many GPUs as ranks")
    device = torch.device("cuda", local_rank % gpus)
    torch.cuda.set_device(device)
    dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    return dist.get_rank(), world, device, backend


def shared_cache(args, rank: int) -> str:
    """One cache folder for every rank (rank 0 makes a fresh one unless --cache names one)."""
    folder = [args.cache or (tempfile.mkdtemp(prefix="evtc-distributed-cache-") if rank == 0 else None)]
    dist.broadcast_object_list(folder, src=0)
    return folder[0]


# --- the three ways of running a strategy -------------------------------------------------------

def build_model(args) -> nn.Module:
    torch.manual_seed(0)  # every rank the same weights
    if args.strategy == "tp":
        return LlamaMLP(args.hidden, args.ffn)
    return LlamaLayer(args.hidden, args.heads, args.ffn, max_pos=max(2048, args.tokens))


def make_input(args, rank: int, device: torch.device) -> torch.Tensor:
    # Data parallel: each rank its own batch; tensor parallel: every rank the same one.
    gen = torch.Generator(device).manual_seed(1000 + (0 if args.strategy == "tp" else rank))
    return torch.randn(args.batch, args.tokens, args.hidden, generator=gen, device=device, dtype=torch.bfloat16)


def wrap(args, model: nn.Module, device: torch.device) -> nn.Module:
    """The strategy's distributed module."""
    if args.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device])
    mesh = torch.distributed.device_mesh.init_device_mesh("cuda", (dist.get_world_size(),))
    if args.strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model.mlp, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    return parallelize_module(model, mesh, {"gate": ColwiseParallel(), "up": ColwiseParallel(),
                                            "down": RowwiseParallel()})


def full_grads(model: nn.Module) -> torch.Tensor:
    """Every parameter's gradient, whole (sharded DTensor gradients are gathered), as one float64
    vector in parameter order."""
    parts = []
    for p in model.parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        if hasattr(g, "full_tensor"):
            g = g.full_tensor()
        parts.append(g.detach().reshape(-1).double())
    return torch.cat(parts)


def run_variant(variant: str, args, base: nn.Module, x: torch.Tensor, device: torch.device) -> dict:
    model = copy.deepcopy(base).to(device)
    if variant == "float64":
        model = model.double()
        x = x.double()
    module = wrap(args, model, device)
    if variant == "compile":
        module = torch.compile(module, dynamic=False)
    elif variant == "evtc":
        module = torch.compile(module, backend="evtc", dynamic=False,
                               options={"evtc.wait_for_compile": True, **args.evtc_options})
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses, grads, step_ms = [], None, []
    first_call_s = 0.0
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = loss_of(module(x))
        loss.backward()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        if step == 0:
            first_call_s = seconds
            grads = full_grads(model)
        else:
            step_ms.append(seconds * 1e3)
        mean = loss.detach().double().clone()
        dist.all_reduce(mean)  # the mean over ranks (each rank its own batch under data parallelism)
        losses.append(float(mean) / dist.get_world_size())
        opt.step()
    return {"losses": losses, "grads": grads, "first_call_s": first_call_s,
            "step_ms": (sorted(step_ms)[len(step_ms) // 2] if step_ms else None)}


def rel_error(value: torch.Tensor, ref: torch.Tensor) -> float:
    return float((value - ref).norm() / ref.norm())


# --- reporting --------------------------------------------------------------------------------

def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for v in VARIANTS:
        ax.plot(range(1, len(report["losses"][v]) + 1), report["losses"][v], marker="o", label=v)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (mean over ranks)")
    ax.set_title(f"{report['strategy']} x{report['world_size']} ({report['backend']}), {report['gpu']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    faulthandler.enable()  # a crash in a collective or a kernel says where
    args = parse_args()
    rank, world, device, backend = init(args)
    cache = shared_cache(args, rank)
    os.environ["EVTC_CACHE_DIR"] = cache  # before evtc compiles anything (it reads it per compile)
    import evtc
    import evtc.torch  # noqa: F401 (registers the backend)

    base = build_model(args).to(torch.bfloat16)
    x = make_input(args, rank, device)
    results = {}
    for v in VARIANTS:
        runs_before = evtc.compiler_runs()
        results[v] = run_variant(v, args, base, x, device)
        results[v]["nvcc_runs"] = evtc.compiler_runs() - runs_before
        dist.barrier()
    evtc_errors = evtc.torch.wait_for_compiles()

    # Compiles across the ranks: every kernel any rank compiled, compiled by exactly one.
    events = evtc.compile_events()
    fused = sum(r.fused_gemms for r in evtc.torch.reports)
    gemms = sum(r.gemms for r in evtc.torch.reports)
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "events": events, "nvcc_runs": results["evtc"]["nvcc_runs"],
                                      "fused": fused, "gemms": gemms, "errors": evtc_errors,
                                      "first_call_s": results["evtc"]["first_call_s"]})
    ok = True
    if rank == 0:
        compiled_by: dict[str, list[int]] = {}
        waited: dict[str, list[int]] = {}
        labels: dict[str, str] = {}
        for g in gathered:
            for e in g["events"]:
                labels[e["key"]] = e["label"]
                (compiled_by if e["what"] == "compiled" else waited).setdefault(e["key"], []).append(g["rank"])
        kernels = sorted(set(compiled_by) | set(waited))
        per_kernel = [{"key": k, "label": labels[k], "compiled_by": compiled_by.get(k, []),
                       "waited": waited.get(k, [])} for k in kernels]
        once = all(len(compiled_by.get(k, [])) == 1 for k in kernels)
        entries = sorted(os.listdir(os.path.join(cache, "kernels"))) if os.path.isdir(os.path.join(cache, "kernels")) else []

        ref = results["float64"]
        checks = {}
        for v in ("compile", "evtc"):
            checks[v] = {"grad_error": rel_error(results[v]["grads"], ref["grads"]),
                         "loss_errors": [abs(a - b) / abs(b) for a, b in zip(results[v]["losses"], ref["losses"])]}
        bound = max(2 * checks["compile"]["grad_error"], BF16_UNIT)
        loss_bound = max(2 * max(checks["compile"]["loss_errors"]), BF16_UNIT)
        grads_ok = checks["evtc"]["grad_error"] <= bound
        losses_ok = max(checks["evtc"]["loss_errors"]) <= loss_bound
        ok = once and grads_ok and losses_ok and not any(g["errors"] for g in gathered)

        report = {
            "strategy": args.strategy, "backend": backend, "world_size": world, "gpu": torch.cuda.get_device_name(),
            "gpus_on_node": torch.cuda.device_count(), "torch": torch.__version__, "evtc": evtc.__version__,
            "model": {"hidden": args.hidden, "ffn": args.ffn, "heads": args.heads, "batch_per_rank": args.batch,
                      "tokens": args.tokens, "steps": args.steps, "lr": args.lr},
            "evtc_options": args.evtc_options,
            "cache": cache,
            "losses": {v: results[v]["losses"] for v in VARIANTS},
            "grad_error": {v: checks[v]["grad_error"] for v in checks},
            "loss_errors": {v: checks[v]["loss_errors"] for v in checks},
            "grad_bound": bound, "loss_bound": loss_bound,
            "evtc_vs_compile_grad_difference": rel_error(results["evtc"]["grads"], results["compile"]["grads"]),
            "step_ms": {v: results[v]["step_ms"] for v in VARIANTS},
            "first_call_s": {v: results[v]["first_call_s"] for v in VARIANTS},
            "ranks": [{k: g[k] for k in ("rank", "nvcc_runs", "fused", "gemms", "errors", "first_call_s")} | {
                "compiled": sum(e["what"] == "compiled" for e in g["events"]),
                "waited": sum(e["what"] == "waited" for e in g["events"])} for g in gathered],
            "kernels": per_kernel, "cache_entries": len(entries),
            "each_kernel_compiled_once": once, "grads_ok": grads_ok, "losses_ok": losses_ok, "ok": ok,
        }
        stem = result_base(args.out, torch.cuda.get_device_name(), f"distributed-{args.strategy}")
        with open(stem + ".json", "w") as f:
            json.dump(report, f, indent=1)
        try:
            plot(report, stem + ".png")
        except ImportError:
            pass
        print(f"{args.strategy} x{world} ({backend}) on {report['gpu']}: {len(kernels)} kernels, "
              f"nvcc runs per rank {[g['nvcc_runs'] for g in gathered]}, cache entries {len(entries)}, "
              f"each compiled by one rank: {once}")
        for k in per_kernel:
            print(f"  {k['key']} compiled by rank {k['compiled_by']}, waited for by {k['waited']}: {k['label']}")
        print(f"fused {[g['fused'] for g in gathered]} of {[g['gemms'] for g in gathered]} GEMMs per rank")
        for v in ("compile", "evtc"):
            print(f"{v:8s} grads rel. error {checks[v]['grad_error']:.3e}, losses max rel. error "
                  f"{max(checks[v]['loss_errors']):.3e}, step {results[v]['step_ms'] or math.nan:.2f} ms, "
                  f"first call {results[v]['first_call_s']:.1f} s")
        print(f"bounds: grads {bound:.3e}, losses {loss_bound:.3e}; losses {report['losses']}")
        print(f"{'PASS' if ok else 'FAIL'}: {stem}.json")
    flag = [ok]
    dist.broadcast_object_list(flag, src=0)
    dist.destroy_process_group()
    return 0 if flag[0] else 1


if __name__ == "__main__":
    sys.exit(main())
