"""The errors of evtc's PyTorch op library that need no GPU: loading it, and specs it cannot
resolve (the plan of a spec is built before any tensor is touched). Skipped where torch is not
installed."""
from __future__ import annotations

import json
import re

import pytest

torch = pytest.importorskip("torch", reason="the op library needs torch")

import evtc.torch  # noqa: E402
from evtc.torch import _op  # noqa: E402

OPTIONS = {"a_dtype": "bf16", "b_dtype": "bf16", "a_layout": "row", "b_layout": "col"}


def test_a_package_without_the_library_says_how_to_build_it(tmp_path):
    with pytest.raises(ImportError, match="built without its PyTorch op library.*--no-build-isolation"):
        _op._load_library(str(tmp_path))


def test_a_library_built_for_another_torch_is_refused(tmp_path):
    (tmp_path / "_evtc_torch.so").write_bytes(b"")
    (tmp_path / "_evtc_torch.version").write_text("1.0.0\n")
    with pytest.raises(ImportError, match=f"built against torch 1.0.0, but this is torch {re.escape(torch.__version__)}"):
        _op._load_library(str(tmp_path))


@pytest.mark.parametrize("spec, message", [
    ("{not json", "evtc op spec is not JSON"),
    (evtc.torch.make_spec("input x0[n]: bf16\nout D: bf16 = acc + x0\n", OPTIONS, [("x0", "diagonal")], ["D"]),
     "spec: operand x0 has class 'diagonal' (expected row, col, scalar, aux or aux_col)"),
    (evtc.torch.make_spec("out D: bf16 = acc\n", OPTIONS, [], ["E"]), "spec: the epilogue has no output 'E'"),
    (evtc.torch.make_spec("out D: bf16 = acc\n", {**OPTIONS, "a_dtype": "f8e4m3", "b_dtype": "f8e4m3",
                                                  "fp8_blockwise": True}, [("@scale_c", "block_scale")], ["D"]),
     "spec: block scale operand '@scale_c' (expected @scale_a or @scale_b)"),
    (evtc.torch.make_spec("out D: bf16 = acc\n", OPTIONS, [("@scale_a", "row")], ["D"]),
     "spec: operand '@scale_a' of class row: only block scales (class block_scale) have names that start with '@'"),
    (evtc.torch.make_spec("out D: bf16 = acc\n", {**OPTIONS, "tile": "big"}, [], ["D"]),
     "unknown kernel option 'tile'"),
    (json.dumps({"expr": "out D: bf16 = acc\n", "options": {**OPTIONS, "a_dtype": "f64"}, "operands": [],
                 "outputs": ["D"]}), "a_dtype: unknown dtype 'f64'"),
])
def test_specs_it_cannot_resolve_say_why(spec, message):
    with pytest.raises(RuntimeError, match=re.escape(message)):
        evtc.torch.path_counts(spec)
