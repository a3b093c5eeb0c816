"""Kernel libraries from Python, without a GPU: the API's errors, presets, recording, and the FX
pass where no nvcc exists (kernels no library holds stay unfused, with the reason). Libraries with
real kernels, used with no nvcc on a GPU, are tested in test_kernel_library_gpu.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import evtc


def test_missing_and_malformed_libraries_are_refused_with_the_reason(tmp_path):
    with pytest.raises(evtc.UserError, match="not a folder"):
        evtc.add_kernel_library(tmp_path / "nowhere")
    with pytest.raises(evtc.UserError, match="no manifest.json"):
        evtc.add_kernel_library(tmp_path)
    (tmp_path / "manifest.json").write_text('{"format": "evtc-kernel-library", "format_version": 99}')
    with pytest.raises(evtc.UserError, match="format version 99"):
        evtc.read_kernel_library(tmp_path)
    assert str(tmp_path) not in evtc.kernel_libraries()


def test_malformed_kernel_lists_name_the_entry(tmp_path):
    with pytest.raises(evtc.UserError, match="kernel list entry 2: needs one of"):
        evtc.build_kernel_library(tmp_path / "lib", [{"expr": "out D = acc"}, {"options": {}}])
    with pytest.raises(evtc.UserError, match="kernel list entry 1: .*unknown dtype"):
        evtc.build_kernel_library(tmp_path / "lib", [{"expr": "out D = acc", "options": {"b_dtype": "i4"}}])
    assert not (tmp_path / "lib" / "manifest.json").exists()


def test_a_gpu_class_must_have_selection_tables(tmp_path):
    assert evtc.kernel_library_gpus() == ["h100", "h200"]
    assert evtc.kernel_library_gpu() in ["", *evtc.kernel_library_gpus()]  # this machine's class
    kernels = [{"expr": "out D: bf16 = acc", "shapes": [{"m": 48, "n": 2048, "k": 8192}]}]
    with pytest.raises(evtc.UserError, match="gpu 'h300': evtc has selection tables for h100, h200"):
        evtc.build_kernel_library(tmp_path / "lib", kernels, gpu="h300")
    with pytest.raises(evtc.UserError, match="gpu: expected a GPU class name such as 'h200', got int"):
        evtc.build_kernel_library(tmp_path / "lib", kernels, gpu=200)
    assert not (tmp_path / "lib" / "manifest.json").exists()


def test_preset_lists_carry_the_shapes():
    preset = evtc.preset_kernel_list("transformer", [(8192, 4096, 4096)])
    assert preset["format"] == "evtc-kernel-list"
    exprs = [k["expr"] for k in preset["kernels"]]
    assert any("swiglu" in e for e in exprs) and any("sa[m]" in e for e in exprs)
    assert all(k["shapes"] == [{"m": 8192, "n": 4096, "k": 4096}] for k in preset["kernels"])
    with pytest.raises(evtc.UserError, match="unknown kernel list preset"):
        evtc.preset_kernel_list("gpt-9")


def test_recording_keeps_other_files_intact(tmp_path):
    notes = tmp_path / "notes.json"
    notes.write_text("[1, 2, 3]")
    with pytest.raises(evtc.UserError, match="not a kernel list"):
        evtc.record_kernels(notes)
    assert notes.read_text() == "[1, 2, 3]"
    evtc.record_kernels(None)


def test_without_nvcc_the_fx_pass_leaves_kernels_no_library_holds_to_inductor(tmp_path):
    pytest.importorskip("torch", reason="the FX pass needs torch")
    code = textwrap.dedent("""
        import json, torch, torch.nn.functional as F
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.proxy_tensor import make_fx
        import evtc, evtc.torch
        with FakeTensorMode(allow_non_fake_inputs=True):
            x = torch.empty(1000, 520, device="cuda", dtype=torch.bfloat16)
            w = torch.empty(1032, 520, device="cuda", dtype=torch.bfloat16)
            gm = make_fx(lambda x, w: F.silu(x @ w.t()))(x, w)
        report = evtc.torch.fuse_gemm_epilogues(gm.graph, compile=False, profitability=False)
        print(json.dumps({"available": evtc.compiler_available(), "fused": len(report.fused),
                          "refused": [r for _, r in report.refused]}))
    """)
    env = dict(os.environ, CUDACXX="/nonexistent", EVTC_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("EVTC_KERNEL_LIBRARY", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["available"] is False
    assert result["fused"] == 0
    assert any("no nvcc here" in r and "kernel library" in r for r in result["refused"]), result


def test_library_calls_raise_evtc_errors_naming_the_argument(tmp_path):
    with pytest.raises(evtc.UserError, match=r"kernel list .*nowhere.json: No such file or directory"):
        evtc.build_kernel_library(tmp_path / "lib", tmp_path / "nowhere.json")
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(evtc.UserError, match=r"kernel list .*folder.json: Is a directory"):
        evtc.build_kernel_library(tmp_path / "lib", tmp_path / "folder.json")
    with pytest.raises(evtc.ArgumentTypeError, match=r"kernels \(a kernel list: .*\): expected a path .*got int"):
        evtc.build_kernel_library(tmp_path / "lib", 5)
    with pytest.raises(evtc.ArgumentTypeError, match="path: expected a path .*got NoneType"):
        evtc.build_kernel_library(None, [])
    with pytest.raises(evtc.ArgumentTypeError, match="path: expected a path .*got int"):
        evtc.add_kernel_library(3)
    (tmp_path / "afile").write_text("")
    with pytest.raises(evtc.EvtcRuntimeError, match="cannot create the library folder .*afile: Not a directory"):
        evtc.build_kernel_library(tmp_path / "afile", [{"expr": "out D = acc"}])
    (tmp_path / "lib2" / "manifest.json").mkdir(parents=True)
    with pytest.raises(evtc.UserError, match="manifest.json is a folder, not a file"):
        evtc.build_kernel_library(tmp_path / "lib2", [{"expr": "out D = acc"}])
