"""One horizontal bar chart per shape of a benchmark's variants (evtc green, torch blue, others
grey), as bench/fp8_blockwise.py and bench/grouped_blockwise.py draw them."""
from __future__ import annotations


def plot_variants(panels, path, suptitle, value, xlabel, label, width=7, fontsize=8):
    """panels: (title, {variant name: result dict}) per shape; value(result) is the bar's length
    and label(v) the text printed at its end."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 5), squeeze=False)
    for ax, (title, variants) in zip(axes[0], panels):
        names = list(variants)
        values = [value(variants[n]) for n in names]
        colors = ["tab:green" if n.startswith("evtc") else "tab:blue" if n.startswith("torch") else "tab:gray"
                  for n in names]
        ax.barh(range(len(names)), values, color=colors)
        ax.set_yticks(range(len(names)), [n.replace("_persistent", "") for n in names], fontsize=fontsize)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        for i, v in enumerate(values):
            ax.text(v, i, f" {label(v)}", va="center", fontsize=fontsize)
    fig.suptitle(suptitle)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
