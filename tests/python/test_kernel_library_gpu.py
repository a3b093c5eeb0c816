"""A kernel library end to end on the GPU: one process (with nvcc) runs evtc kernels and a model
through torch.compile while recording what it compiles, and builds a library from the record;
a second process with no nvcc (CUDACXX=/nonexistent) and an empty disk cache runs the same
through the library: 0 compiles, every op fused, results equal to the first process's and close
to float64."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import evtc

torch = pytest.importorskip("torch", reason="the kernel library GPU test needs torch")
if not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)):
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)

# Runs in a subprocess: argv[1] is the output folder. Writes results.json and outputs.pt there.
SCRIPT = textwrap.dedent("""
    import json, os, sys, torch, torch.nn.functional as F
    import evtc, evtc.torch
    out = sys.argv[1]
    torch.manual_seed(0)
    M, N, K = 1000, 1032, 520   # not tile multiples
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(N, K, device="cuda") * K ** -0.5).bfloat16()
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16)

    kernel = evtc.compile("out D: bf16 = silu(acc + bias[n]) * 1.25", b_layout="col")
    d = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    kernel(x, w.t(), bias=b, out={"D": d})

    def block(x, w, b):
        return F.gelu(F.linear(x, w, b), approximate="tanh")
    compiled = torch.compile(block, backend="evtc",
                             options={"evtc.profitability": False, "evtc.wait_for_compile": True})
    y = compiled(x, w, b)
    torch.cuda.synchronize()
    fused = sum(len(r.fused) for r in evtc.torch.reports)
    counts = {}
    for r in evtc.torch.reports:
        for f in r.fused:
            for path, n in evtc.torch.path_counts(f.spec).items():
                counts[path] = counts.get(path, 0) + n
    torch.save({"d": d.cpu(), "y": y.cpu()}, os.path.join(out, "outputs.pt"))
    json.dump({"compiler_runs": evtc.compiler_runs(), "fused": fused, "paths": counts,
               "libraries": evtc.kernel_libraries()}, open(os.path.join(out, "results.json"), "w"))
""")


def run(tmp_path, name: str, env: dict) -> dict:
    out = tmp_path / name
    out.mkdir()
    full = dict(os.environ, TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0", **env)
    for var in ("EVTC_KERNEL_LIBRARY", "EVTC_RECORD_KERNELS", "EVTC_WAIT_FOR_COMPILE"):
        if var not in env:
            full.pop(var, None)
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], env=full, capture_output=True, text=True,
                       timeout=1200)
    assert p.returncode == 0, f"{name} failed:\n{p.stdout}\n{p.stderr}"
    result = json.loads((out / "results.json").read_text())
    result["outputs"] = torch.load(out / "outputs.pt")
    result["stderr"] = p.stderr
    return result


def test_a_recorded_library_runs_with_no_nvcc_and_no_compile(tmp_path):
    record = tmp_path / "kernels.json"
    built = run(tmp_path, "build", {"EVTC_CACHE_DIR": str(tmp_path / "cache"), "EVTC_RECORD_KERNELS": str(record)})
    assert built["compiler_runs"] >= 2 and built["fused"] == 1
    listed = json.loads(record.read_text())["kernels"]
    assert len(listed) == 2 and all(k["shapes"] for k in listed)

    lib = tmp_path / "library"
    env = dict(os.environ, EVTC_CACHE_DIR=str(tmp_path / "cache"))
    report = subprocess.run([sys.executable, "-c", "import evtc, json, sys; "
                             "print(json.dumps(evtc.build_kernel_library(sys.argv[1], sys.argv[2])))",
                             str(lib), str(record)], env=env, capture_output=True, text=True, timeout=1200)
    assert report.returncode == 0, report.stderr
    summary = json.loads(report.stdout)
    assert summary["errors"] == [] and summary["kernels"] == 4  # 2 fused + their plain epilogues
    assert summary["compiled"] == 2  # the fused kernels came from the disk cache

    deployed = run(tmp_path, "deploy", {"EVTC_CACHE_DIR": str(tmp_path / "empty-cache"), "CUDACXX": "/nonexistent",
                                        "EVTC_KERNEL_LIBRARY": str(lib)})
    assert deployed["compiler_runs"] == 0
    assert deployed["fused"] == 1 and deployed["paths"].get("fused", 0) >= 1
    assert deployed["paths"].get("fallback", 0) == 0
    assert not (tmp_path / "empty-cache" / "kernels").exists()
    assert deployed["libraries"] == [str(lib.resolve())]
    for name in ("d", "y"):  # the same kernels on the same inputs
        assert torch.equal(deployed["outputs"][name], built["outputs"][name]), name

    # And close to float64.
    torch.manual_seed(0)
    M, N, K = 1000, 1032, 520
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16).double()
    w = (torch.randn(N, K, device="cuda") * K ** -0.5).bfloat16().double()
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16).double()
    h = x @ w.t() + b
    want = {"d": torch.nn.functional.silu(h) * 1.25, "y": torch.nn.functional.gelu(h, approximate="tanh")}
    for name, ref in want.items():
        got = deployed["outputs"][name].cuda().double()
        assert not got.isnan().any(), f"{name}: unwritten elements"
        torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


# Runs in a subprocess: argv[1] is the output folder. Runs D = acc at shapes whose table choice
# differs from the rules' and checks each against float64; writes results.json.
SHAPES_SCRIPT = textwrap.dedent("""
    import json, os, sys, torch
    import evtc
    out, shapes = sys.argv[1], json.loads(sys.argv[2])
    kernel = evtc.compile("out D: bf16 = acc", b_layout="col")
    torch.manual_seed(1)
    rows = []
    for s in shapes:
        m, n, k = s["m"], s["n"], s["k"]
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(n, k, device="cuda") * k ** -0.5).bfloat16()
        d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        kernel(a, w.t(), out={"D": d})
        ref = a.double() @ w.double().t()
        err = ((d.double() - ref).norm() / ref.norm()).item()
        rows.append({"shape": [m, n, k], "config": kernel.config_for(m, n, k), "in_library": kernel.in_library(m, n, k),
                     "path": kernel.last_path, "nan": bool(d.isnan().any()), "rel_err": err})
    json.dump({"compiler_runs": evtc.compiler_runs(), "rows": rows}, open(os.path.join(out, "results.json"), "w"))
""")


def test_a_library_built_without_the_gpu_for_its_class_runs_on_it_with_no_compile(tmp_path):
    # `evtc aot build --gpu CLASS` on a machine without that GPU: the library holds what a GPU of
    # the class chooses (its selection table's transposed 64x16 tile at 48x2048x8192, where the
    # rules alone choose a 64-row one), so such a GPU runs it with no compile.
    gpu = evtc.kernel_library_gpu()
    if not gpu:
        pytest.skip(f"{torch.cuda.get_device_name()} is of no GPU class with selection tables")
    shapes = [{"m": 48, "n": 2048, "k": 8192}, {"m": 100, "n": 3072, "k": 8192}]  # not tile multiples: 100
    kernels = [{"expr": "out D: bf16 = acc", "options": {"a_dtype": "bf16", "b_dtype": "bf16", "a_layout": "row",
                                                        "b_layout": "col"}, "shapes": shapes}]
    lib = tmp_path / "library"
    no_gpu = dict(os.environ, EVTC_CACHE_DIR=str(tmp_path / "cache"), CUDA_VISIBLE_DEVICES="")
    build = subprocess.run([sys.executable, "-c", "import evtc, json, sys; "
                            "print(json.dumps([evtc.kernel_library_gpu(), "
                            "evtc.build_kernel_library(sys.argv[1], json.loads(sys.argv[2]), gpu=sys.argv[3])]))",
                            str(lib), json.dumps(kernels), gpu], env=no_gpu, capture_output=True, text=True, timeout=1200)
    assert build.returncode == 0, build.stderr
    class_there, summary = json.loads(build.stdout.strip().splitlines()[-1])
    assert class_there == ""  # the build saw no GPU
    assert summary["errors"] == [] and summary["kernels"] >= 2

    out = tmp_path / "deploy"
    out.mkdir()
    env = dict(os.environ, EVTC_CACHE_DIR=str(tmp_path / "empty-cache"), CUDACXX="/nonexistent",
               EVTC_KERNEL_LIBRARY=str(lib))
    env.pop("EVTC_RECORD_KERNELS", None)
    p = subprocess.run([sys.executable, "-c", SHAPES_SCRIPT, str(out), json.dumps(shapes)], env=env,
                       capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    result = json.loads((out / "results.json").read_text())
    assert result["compiler_runs"] == 0, result
    for row in result["rows"]:
        assert row["in_library"] and row["path"] == "fused", row
        assert not row["nan"] and row["rel_err"] < 1e-2, row
    assert result["rows"][0]["config"].endswith("_swap"), result["rows"][0]  # the table's transposed tile
