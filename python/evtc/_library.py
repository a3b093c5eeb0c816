"""Kernel libraries: kernels compiled ahead of time, run where no nvcc exists (docs/backend.md,
"Kernel libraries").

On a machine with nvcc and CUTLASS, record what a run compiles and build a library from it::

    evtc.record_kernels("kernels.json")          # or EVTC_RECORD_KERNELS=kernels.json
    ...run the model (torch.compile with the evtc backend, or evtc.compile kernels)...
    evtc.build_kernel_library("model-kernels", "kernels.json")   # or `evtc aot build`

Where it runs (no nvcc needed)::

    evtc.add_kernel_library("model-kernels")     # or EVTC_KERNEL_LIBRARY=model-kernels
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, Optional, Union

from . import _evtc

PathLike = Union[str, "os.PathLike[str]"]


def _path(value: Any, what: str) -> str:
    """A path argument as a str; :class:`evtc.ArgumentTypeError` naming ``what`` otherwise."""
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    raise _evtc.ArgumentTypeError(f"{what}: expected a path (a str or os.PathLike), got {type(value).__name__}")


def add_kernel_library(path: PathLike) -> dict[str, Any]:
    """Verifies the library folder (its manifest; that its kernels are for this GPU and this
    evtc's architecture, CUTLASS version, device headers and kernel ABI) and looks every kernel
    up in it, before the disk cache and nvcc, from now on. Returns its manifest as a dict
    (``dir``, ``arch``, ``cutlass``, ``nvcc``, ``evtc``, ``created``, ``kernels``). Raises
    :class:`evtc.UserError` saying why when the library is refused."""
    return _evtc.add_kernel_library(_path(path, "path"))


def kernel_libraries() -> list[str]:
    """The library folders in use, in search order (``EVTC_KERNEL_LIBRARY``'s included)."""
    return list(_evtc.kernel_libraries())


def read_kernel_library(path: PathLike) -> dict[str, Any]:
    """A library's manifest as a dict, without using the library."""
    return _evtc.read_kernel_library(_path(path, "path"))


def record_kernels(path: Optional[PathLike]) -> None:
    """Records every kernel this process compiles or loads from now on into the kernel list at
    ``path`` (JSON; entries already in the file are kept), rewritten as kernels are added.
    ``None`` stops recording. ``EVTC_RECORD_KERNELS=path`` records from the start."""
    _evtc.record_kernels("" if path is None else _path(path, "path"))


def build_kernel_library(path: PathLike, kernels: Union[PathLike, dict, list],
                         gpu: Optional[str] = None) -> dict[str, Any]:
    """Compiles kernels into the library folder ``path`` (created, or added to), in parallel.
    ``kernels`` is a kernel list: the path of its JSON file (as :func:`record_kernels` writes),
    the list as a dict, or its ``"kernels"`` entries as a list. Needs nvcc and CUTLASS, not a
    GPU. ``gpu``: a GPU class with selection tables (:func:`kernel_library_gpus`: ``"h100"``,
    ``"h200"``) whose choice of configuration the kernels without one take, as on such a GPU
    (default: the choice here, which a machine without that GPU makes by the rules). Returns
    ``{"dir", "kernels", "added", "compiled", "seconds", "errors"}``; kernels that failed to
    compile are left out and named in ``errors``. Each error is an :class:`evtc.Error`: a kernel
    list file that cannot be read, or a ``gpu`` without tables, is a :class:`evtc.UserError`
    naming it."""
    folder = _path(path, "path")
    if gpu is not None and not isinstance(gpu, str):
        raise _evtc.UserError(f"gpu: expected a GPU class name such as 'h200', got {type(gpu).__name__}")
    if isinstance(kernels, list):
        text = _evtc.kernel_list_of(json.dumps(kernels))
    elif isinstance(kernels, dict):
        text = json.dumps(kernels)
    else:
        list_path = _path(kernels, "kernels (a kernel list: its file's path, a dict or a list)")
        try:
            with open(list_path) as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise _evtc.UserError(f"kernel list {list_path}: {getattr(e, 'strerror', None) or e}") from e
    return _evtc.build_kernel_library(text, folder, gpu or "")


def kernel_library_gpus() -> list[str]:
    """The GPU classes :func:`build_kernel_library` takes as ``gpu`` (those with selection tables)."""
    return list(_evtc.kernel_library_gpus())


def kernel_library_gpu() -> str:
    """This process's GPU's class among :func:`kernel_library_gpus` (``"h200"`` on an H200): the
    ``gpu`` to build a library with, on another machine, for GPUs like this one. ``""`` without
    a GPU, or for a GPU of no such class."""
    return _evtc.kernel_library_gpu()


def preset_kernel_list(name: str = "transformer", shapes: Iterable[tuple[int, int, int]] = ()) -> dict:
    """A preset kernel list of common epilogues (``"transformer"``: bias, GELU/SiLU/ReLU²,
    SwiGLU/GeGLU, residual add, fp8 rowwise scales) for the given (M, N, K) shapes."""
    return json.loads(_evtc.preset_kernel_list(name, [tuple(int(x) for x in s) for s in shapes]))


def compiler_runs() -> int:
    """How many nvcc processes this process has started."""
    return int(_evtc.compiler_runs())


def toolchain() -> dict[str, str]:
    """What kernel compiles use here: ``nvcc`` and ``nvcc_version``, ``cutlass_include`` and
    ``cutlass_version``, ``device_headers`` (evtc's). Raises :class:`evtc.EvtcRuntimeError`
    saying what is missing (no nvcc, no CUTLASS headers, CUTLASS of another release)."""
    return dict(_evtc.toolchain())


def compiler_available() -> bool:
    """Whether nvcc can be found here (``CUDACXX``, ``CUDA_HOME``, ``PATH``, the build's toolkit)."""
    return bool(_evtc.compiler_available())
