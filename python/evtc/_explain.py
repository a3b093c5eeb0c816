"""evtc.explain: what the pass pipeline makes of an expression."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import _evtc
from ._kernel import dtype_name, require_type


@dataclass(frozen=True)
class PassStep:
    name: str
    summary: str
    changed: bool
    ir: str


@dataclass(frozen=True)
class Explanation:
    """The canonical IR of an epilogue before and after the passes, and the fusion verdict."""

    parsed: str
    ir: str
    hash: str
    fusable: bool
    reasons: list[str]
    passes: list[PassStep] = field(default_factory=list)

    def __str__(self) -> str:
        lines = []
        if self.passes:
            lines.append("== parsed ==\n" + self.parsed.rstrip("\n"))
            for p in self.passes:
                lines.append(f"== after {p.name} ==\n" + (p.ir.rstrip("\n") if p.changed else "(unchanged)"))
        else:
            lines.append(self.ir.rstrip("\n"))
        lines.append(f"hash: {self.hash}")
        lines.extend(f"not fusable: {r}" for r in self.reasons)
        return "\n".join(lines)


def explain(expr: str, *, dtype: Any = "bf16", passes: bool = True) -> Explanation:
    """Parses ``expr`` and runs the pass pipeline, recording the IR after every pass.

    ``dtype`` is the default dtype of operands and [m,n] outputs the expression does not
    declare. ``str()`` of the result reads like ``evtc explain --passes``.
    """
    require_type(expr, str, "expr", "the expression's text (a str)")
    require_type(passes, bool, "passes", "True or False")
    r = _evtc.explain(expr, dtype_name(dtype, "dtype"), passes)
    steps = [PassStep(s["name"], s["summary"], s["changed"], s["ir"]) for s in r["passes"]]
    return Explanation(r["parsed"], r["ir"], r["hash"], r["fusable"], list(r["reasons"]), steps)
