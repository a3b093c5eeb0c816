"""Several processes started by PyTorch's own launcher (torchrun, the gloo process group, no GPU):
two ranks that need the same kernel at the same moment run one nvcc between them, and both load
the kernel (docs/backend.md, "Several processes, several hosts")."""
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

RANK_SCRIPT = r'''
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
import evtc
# Nine outputs are not fused: this is the unfused path's plain epilogue (a second of nvcc), the same
# kernel for both ranks.
expr = "; ".join(f"out o{i}: bf16 = acc * {i + 1} + {sys.argv[1]}" for i in range(9))
kernel = evtc.compile(expr)
dist.barrier()                           # both ask for it at the same moment
path = kernel._native.compile_fallback()
events = evtc.compile_events()
gathered = [None] * dist.get_world_size()
dist.all_gather_object(gathered, {"rank": dist.get_rank(), "path": path, "events": events,
                                  "nvcc": evtc.compiler_runs()})
if dist.get_rank() == 0:
    import json
    print("RESULT " + json.dumps(gathered))
dist.destroy_process_group()
'''


def test_two_ranks_compile_a_kernel_once(tmp_path):
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun is not installed")
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "EVTC_LOG"}
    env["EVTC_CACHE_DIR"] = str(tmp_path / "shared cache")
    done = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", str(script), str(os.getpid())],
                          env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    import json
    line = next(l for l in done.stdout.splitlines() if l.startswith("RESULT "))
    ranks = json.loads(line[len("RESULT "):])
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["path"] == ranks[1]["path"], ranks  # one cache entry, loaded by both
    compiled = [e for r in ranks for e in r["events"] if e["what"] == "compiled"]
    assert len(compiled) == 1, ranks                    # one nvcc between them
    assert sum(r["nvcc"] for r in ranks) == 1, ranks
    assert len(os.listdir(tmp_path / "shared cache" / "kernels")) == 1
    # One rank says it compiled; the other, if it had to wait, says whose compile it loaded.
    assert done.stderr.count("evtc: compiling ") == 1, done.stderr
    waited = [e for r in ranks for e in r["events"] if e["what"] == "waited"]
    assert done.stderr.count("compiled by another process") == len(waited), done.stderr
