"""The Python package's messages (EVTC_LOG, set_log_level, TORCH_LOGS), its exception types
(ValueError / TypeError subclasses of evtc.Error), dtypes given as torch dtypes, the one version
number, and no environment variables written by `import evtc`."""
import importlib.metadata
import os
import subprocess
import sys

import pytest

import evtc

NINE_OUTPUTS = "; ".join(f"out o{i}: bf16 = acc * {i + 1}" for i in range(9))  # not fused: a plain epilogue


def run_python(script: str, **env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("EVTC_LOG", "TORCH_LOGS")}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True,
                          timeout=300)


def test_bad_values_are_value_errors_and_bad_types_type_errors():
    with pytest.raises(ValueError, match="a_dtype: unknown dtype 'f7'") as e:
        evtc.compile("out D = acc", a_dtype="f7")
    assert isinstance(e.value, evtc.UserError) and isinstance(e.value, evtc.Error)
    with pytest.raises(ValueError):
        evtc.compile("out D = sigmod(acc)")  # a ParseError is a bad value too
    with pytest.raises(TypeError, match=r"a_dtype: expected a dtype \(f32, f16, bf16, f8e4m3, f8e5m2, i32, i64, "
                                        r"or a torch.dtype\), got int 3") as t:
        evtc.compile("out D = acc", a_dtype=3)
    assert isinstance(t.value, evtc.ArgumentTypeError) and isinstance(t.value, evtc.Error)
    assert issubclass(evtc.ArgumentTypeError, evtc.UserError)
    assert issubclass(evtc.Error, RuntimeError)  # as before: `except RuntimeError` still catches everything


def test_torch_dtypes_are_accepted_wherever_a_dtype_is():
    torch = pytest.importorskip("torch")
    expr = "out D = silu(acc + bias[n]) * r[m,n]"
    by_name = evtc.compile(expr, a_dtype="f16", b_dtype="f16", operand_dtype="f32", output_dtype="f16")
    by_torch = evtc.compile(expr, a_dtype=torch.float16, b_dtype=torch.float16, operand_dtype=torch.float32,
                            output_dtype=torch.float16)
    assert by_torch.ir == by_name.ir and by_torch.hash == by_name.hash
    assert [(o.name, o.dtype) for o in by_torch.signature] == [("bias", "f32"), ("r", "f32"), ("D", "f16")]
    assert evtc.parse("out D = acc + x[n]", torch.bfloat16) == evtc.parse("out D = acc + x[n]", "bf16")
    assert evtc.explain("out D = relu(acc)", dtype=torch.float32).ir == evtc.explain("out D = relu(acc)", dtype="f32").ir
    fp8 = evtc.compile("out D: bf16 = acc * sa[m]", a_dtype=torch.float8_e4m3fn, b_dtype=torch.float8_e5m2)
    assert fp8.fallback_reason(256, 256, 256) == ""
    g = evtc.grouped("out y: bf16 = swiglu(acc)", dtype=torch.bfloat16)
    assert g.output.dtype == "bf16"


def test_log_level_is_one_setting_for_python_and_the_native_library():
    before = evtc.log_level()
    try:
        evtc.set_log_level("debug")
        assert evtc.log_level() == "debug"
        import logging
        assert logging.getLogger("evtc").level == logging.DEBUG
        evtc.set_log_level(logging.WARNING)
        assert evtc.log_level() == "warning"
        with pytest.raises(ValueError, match="log level 'loud': expected one of error, warning, info, debug"):
            evtc.set_log_level("loud")
        with pytest.raises(TypeError, match=r"log level: expected a name \(error, warning, info, debug\) or a "
                                            r"logging level, got float"):
            evtc.set_log_level(2.5)
    finally:
        evtc.set_log_level(before)


def test_compiles_are_announced_at_info_level_off_a_terminal(tmp_path):
    script = f"""
import evtc
k = evtc.compile({NINE_OUTPUTS!r})
k._native.compile_fallback()
k2 = evtc.compile({NINE_OUTPUTS!r})
k2._native.compile_fallback()          # a cache hit: no compile, no message
events = evtc.compile_events()
assert [e["what"] for e in events] == ["compiled"], events
assert events[0]["seconds"] > 0 and len(events[0]["key"]) == 16, events
print("label:", events[0]["label"])
"""
    done = run_python(script, EVTC_CACHE_DIR=str(tmp_path / "cache"))
    assert done.returncode == 0, done.stderr
    label = done.stdout.split("label: ", 1)[1].strip()
    lines = [l for l in done.stderr.splitlines() if l.startswith("evtc: ")]
    assert len(lines) == 2, done.stderr
    assert lines[0].startswith(f"evtc: compiling {label} [") and lines[1].startswith(f"evtc: compiled {label} in ")
    # warning: silent; debug: the nvcc command line too.
    quiet = run_python(script, EVTC_CACHE_DIR=str(tmp_path / "cache2"), EVTC_LOG="warning")
    assert quiet.returncode == 0 and "evtc:" not in quiet.stderr, quiet.stderr
    loud = run_python(script, EVTC_CACHE_DIR=str(tmp_path / "cache3"), EVTC_LOG="debug")
    assert loud.returncode == 0, loud.stderr
    assert any("nvcc" in l and "-gencode" in l for l in loud.stderr.splitlines()), loud.stderr
    # A level that is not one is said once, and info is used.
    odd = run_python("import evtc; print(evtc.log_level())", EVTC_LOG="chatty")
    assert odd.stdout.strip() == "info"
    assert "EVTC_LOG='chatty' is not a level (error, warning, info, debug): using info" in odd.stderr


def test_torch_logs_sets_evtcs_level():
    pytest.importorskip("torch")
    script = """
import logging, torch, evtc, evtc.torch
from evtc import _log
_log.sync_native_level()                          # what the FX pass does before each graph
print(evtc.log_level())
logging.getLogger("evtc.torch").debug("a debug record of evtc.torch")
"""
    done = run_python(script, TORCH_LOGS="+evtc")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "debug"
    assert done.stderr.count("a debug record of evtc.torch") == 1, done.stderr  # one handler wrote it
    plain = run_python(script)
    assert plain.stdout.strip() == "info" and "a debug record" not in plain.stderr


def test_import_writes_no_environment_variable():
    done = run_python("import os; before = dict(os.environ); import evtc; "
                      "print(sorted(set(os.environ.items()) ^ set(before.items())))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_one_version_number():
    assert evtc.__version__ == evtc._evtc.version()
    try:
        assert importlib.metadata.version("evtc") == evtc.__version__
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("evtc runs from a source tree without package metadata")


def test_the_supported_torch_range_comes_from_the_package_metadata():
    pytest.importorskip("torch")
    from evtc.torch import _version_check as v
    assert v.in_range("2.11.0+cu130", ">=2.11,<2.12")
    assert not v.in_range("2.10.1", ">=2.11,<2.12") and not v.in_range("2.12.0", ">=2.11,<2.12")
    spec = v.supported_range()
    if spec is None:
        pytest.skip("no package metadata")
    assert set(spec.split(",")) == {">=2.11", "<2.12"}


def test_a_torch_outside_the_range_is_warned_about(monkeypatch, caplog):
    torch = pytest.importorskip("torch")
    from evtc.torch import _version_check as v
    monkeypatch.setattr(v, "supported_range", lambda: ">=2.11,<2.12")
    monkeypatch.setattr(torch, "__version__", "2.9.1+cu126")
    with caplog.at_level("WARNING", logger="evtc.torch"):
        v.check_torch_version()
    assert "evtc.torch is tested with torch>=2.11,<2.12; this is torch 2.9.1+cu126" in caplog.text


def test_the_package_finds_its_headers_and_cutlass_without_environment_variables(tmp_path):
    # An installed package carries evtc's device headers and the CUTLASS headers it was built with.
    done = run_python("import evtc, evtc._evtc as n; print(n.compiler_available())",
                      EVTC_CACHE_DIR=str(tmp_path / "cache"))
    assert done.returncode == 0, done.stderr
    pkg = os.path.dirname(evtc.__file__)
    if not os.path.isfile(os.path.join(pkg, "cutlass", "include", "cutlass", "cutlass.h")):
        pytest.skip("this package was built without CUTLASS headers")
    # The toolchain lookup (compiling a CUTLASS kernel here would take a minute).
    env = {k: v for k, v in os.environ.items() if k not in ("EVTC_CUTLASS_DIR", "CUTLASS_DIR", "EVTC_INCLUDE_DIR")}
    probe = subprocess.run([sys.executable, "-c", "import evtc; t = evtc.toolchain(); "
                            "print(t['cutlass_include']); print(t['device_headers']); print(t['cutlass_version'])"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    cutlass, headers, version = probe.stdout.split()
    assert cutlass == os.path.join(pkg, "cutlass", "include")
    assert headers == os.path.join(pkg, "include")
    assert version.startswith("4.2.")


def test_options_of_the_wrong_type_are_argument_type_errors():
    expr = "out D = acc"
    cases = [
        (lambda: evtc.compile(None), "expr: expected the expression's text (a str), got NoneType None"),
        (lambda: evtc.compile(expr, a_layout=None), "a_layout: expected a str, got NoneType None"),
        (lambda: evtc.compile(expr, precise_math="yes"), "precise_math: expected True or False, got str 'yes'"),
        (lambda: evtc.compile(expr, wait_for_compile=1), "wait_for_compile: expected True or False, got int 1"),
        (lambda: evtc.compile(expr, config=5), "config: expected a configuration name (a str) or None, got int 5"),
        (lambda: evtc.compile(expr, arch=90), 'arch: expected an architecture name such as "sm90" (a str) or None'),
        (lambda: evtc.compile(expr, visit_order=8), 'visit_order: expected a visiting order name such as "along_n_s8"'),
        (lambda: evtc.explain(None), "expr: expected the expression's text (a str), got NoneType"),
        (lambda: evtc.explain(expr, passes="no"), "passes: expected True or False, got str 'no'"),
        (lambda: evtc.grouped(None), "expr: expected the expression's text (a str), got NoneType"),
        (lambda: evtc.grouped(expr, weights=1), "weights: expected a str, got int 1"),
    ]
    for call, message in cases:
        with pytest.raises(evtc.ArgumentTypeError) as e:
            call()
        assert message in str(e.value)
        assert isinstance(e.value, TypeError) and isinstance(e.value, evtc.Error)


def test_a_call_names_what_is_wrong_with_its_arrays():
    k = evtc.compile("out D = acc")
    for a, b in ((None, None), ("a", "b"), (3, 4)):
        with pytest.raises(evtc.ArgumentTypeError, match="operand A: expected a CUDA array"):
            k(a, b)
        with pytest.raises(evtc.ArgumentTypeError, match="operand A: expected a CUDA array"):
            k(a, b, out={"D": None})
    numpy = pytest.importorskip("numpy")
    a, b = numpy.ones((4, 8), numpy.float32), numpy.ones((8, 16), numpy.float32)
    with pytest.raises(evtc.UserError, match=r"operand A is not on a CUDA device \(DLPack device type 1\)"):
        k(a, b)  # before the missing output D is noticed
    with pytest.raises(evtc.ArgumentTypeError, match="out: expected a dict of output arrays by name.*got ndarray"):
        k(a, b, out=a)
    with pytest.raises(evtc.ArgumentTypeError, match="out: expected a dict .*got int"):
        k(a, b, out=5)


def test_negative_problem_sizes_are_refused_naming_the_size():
    k = evtc.compile("out D = acc")
    with pytest.raises(evtc.UserError, match=r"problem size M=-128: sizes are positive, or 0 where not known yet"):
        k.compile(-128, 128, 128)
    with pytest.raises(evtc.UserError, match="problem size N=-1"):
        k.config_for(128, -1, 128)
    with pytest.raises(evtc.UserError, match="problem size K=-5"):
        k.fallback_reason(16, 16, -5)
    assert k.config_for(0, 0, 0)  # unknown sizes: the large-problem default


def test_the_type_stubs_declare_what_the_native_module_has():
    """python/evtc/_evtc.pyi, written by hand, against the module: the same top-level names and,
    per class, the same public members (nanobind's own attributes aside)."""
    import ast
    import inspect

    from evtc import _evtc

    stub = ast.parse(open(os.path.join(os.path.dirname(evtc.__file__), "_evtc.pyi")).read())
    declared = {}
    for node in stub.body:
        if isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
            declared[node.name] = members
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            declared[node.name] = None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared[node.target.id] = None
    public = {n for n in dir(_evtc) if not n.startswith("_")}
    assert set(declared) == public, (sorted(public - set(declared)), sorted(set(declared) - public))
    for name, members in declared.items():
        obj = getattr(_evtc, name)
        if members is None or not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        have = {n for n in dir(obj) if not n.startswith("_")}
        assert members - {"__init__"} == have, (name, sorted(have - members), sorted(members - have))


def test_torch_dtype_names_come_from_the_native_table():
    torch = pytest.importorskip("torch")
    from evtc import _evtc
    from evtc.torch._chain import EVTC_DTYPES

    names = _evtc.torch_dtype_names()
    assert sorted(names) == sorted(_evtc.dtype_names())
    for name, torch_name in names.items():
        t = getattr(torch, torch_name)
        if t.is_floating_point:
            assert EVTC_DTYPES[t] == name
            # the native parser takes the torch name as the same type
            assert evtc.compile("out D = acc", output_dtype=t).outputs[0].dtype == name
        else:  # integer types: [m]/[n] operands only, never a traced chain's
            assert t not in EVTC_DTYPES
            assert evtc.parse(f"input t[m]: {torch_name}\nout D = acc * (n == t)") == \
                evtc.parse(f"input t[m]: {name}\nout D = acc * (n == t)")
    assert {n for n, tn in names.items() if not getattr(torch, tn).is_floating_point} == {"i32", "i64"}
