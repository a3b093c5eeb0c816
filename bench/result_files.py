"""Where a benchmark writes its results: <out>/<UTC stamp>-<gpu>-<kind> (+ .json, .png, ...)."""
from __future__ import annotations

import datetime
import os


def gpu_slug(device_name: str) -> str:
    """"h200" or "h100" for those GPUs, else the last word of the device name, lower-case."""
    for gpu in ("H200", "H100"):
        if gpu in device_name:
            return gpu.lower()
    return device_name.split()[-1].lower()


def result_base(out_dir: str, device_name: str, kind: str) -> str:
    """The path, without extension, of a result of `kind` measured now on `device_name` (the
    folder is created)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
    os.makedirs(out_dir, exist_ok=True)
    return os.path.join(out_dir, f"{stamp}-{gpu_slug(device_name)}-{kind}")
