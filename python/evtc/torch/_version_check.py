"""The torch releases evtc.torch is tested with: the ``torch`` extra of the package's metadata
(pyproject.toml, the one place the range is written). Outside it evtc.torch still loads, with a
warning: it uses torch.compile's backend interface and Inductor's pass hooks, which change
between releases."""
from __future__ import annotations

import logging
import re
from importlib import metadata
from typing import Optional

import torch

log = logging.getLogger("evtc.torch")

_CLAUSE = re.compile(r"^(>=|<=|==|!=|>|<)\s*([0-9][0-9a-zA-Z.+]*)$")


def supported_range() -> Optional[str]:
    """``">=2.11,<2.12"`` from the installed package's metadata; None when evtc runs from a
    source tree without metadata."""
    try:
        requires = metadata.requires("evtc") or []
    except metadata.PackageNotFoundError:
        return None
    for r in requires:
        m = re.match(r"^torch\s*([^;]*);.*extra\s*==\s*['\"]torch['\"]", r)
        if m:
            return m.group(1).strip().strip("()").replace(" ", "")
    return None


def in_range(version: str, spec: str) -> bool:
    """Whether a torch version ("2.11.0+cu130") meets every clause of ``spec``."""
    v = torch.torch_version.TorchVersion(version.split("+")[0])
    ops = {">=": v.__ge__, "<=": v.__le__, "==": v.__eq__, "!=": v.__ne__, ">": v.__gt__, "<": v.__lt__}
    for clause in filter(None, spec.split(",")):
        m = _CLAUSE.match(clause)
        if m is None:
            return True  # a clause this check does not read: do not warn on it
        if not ops[m.group(1)](m.group(2)):
            return False
    return True


def check_torch_version() -> None:
    spec = supported_range()
    if spec and not in_range(torch.__version__, spec):
        log.warning("evtc.torch is tested with torch%s; this is torch %s: compiling with the evtc backend may "
                    "fail (install evtc[torch] for a tested release)", spec, torch.__version__)
