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


def result_base(out_dir: str, device_name: str | None, kind: str, *, slug: str | None = None) -> str:
    """The path, without extension, of a result of `kind` measured now on `device_name`:
    <out_dir>/<UTC stamp>-<gpu_slug(device_name)>-<kind>, the folder created. `slug`, where given,
    stands as-is for the GPU's part (device_name may then be None). A result already there under
    that name keeps its files: this one's name takes a suffix, -2, -3, ... The name is claimed by
    creating an empty <base>.json, which the caller overwrites, so that runs started at the same
    moment get different names."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
    os.makedirs(out_dir, exist_ok=True)
    name = f"{stamp}-{gpu_slug(device_name) if slug is None else slug}-{kind}"
    taken = {f.split(".", 1)[0] for f in os.listdir(out_dir)}
    n = 1
    while True:
        base = name if n == 1 else f"{name}-{n}"
        if base not in taken:
            try:
                claim = os.open(os.path.join(out_dir, base + ".json"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
                os.close(claim)
                return os.path.join(out_dir, base)
            except FileExistsError:
                pass  # another run claimed it after the listing
        n += 1


def write_do_bench_results(out_dir: str, device_name: str, kind: str, rounds: int, shapes: list, torch_version: str) -> str:
    """Writes <base>.json for a benchmark timed with triton's do_bench, variants in turn for
    `rounds` rounds; returns <base> for the plot beside it."""
    import json

    base = result_base(out_dir, device_name, kind)
    with open(base + ".json", "w") as f:
        json.dump({"device": device_name, "torch": torch_version, "method": "triton.testing.do_bench median "
                   f"(L2 flushed), variants in turn, median of {rounds} rounds", "shapes": shapes}, f, indent=2)
    return base


def save_png(fig, base: str) -> None:
    """Writes a matplotlib figure to <base>.png (tight layout, 120 dpi) and says where."""
    fig.tight_layout()
    fig.savefig(base + ".png", dpi=120)
    print(f"wrote {base}.png")


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display), or None, saying so, where
    matplotlib is not installed: the results' JSON is written either way."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing: no plot")
        return None
    return plt
