"""Shared set-up of the Python tests.

Inductor's graph caches are switched off so that every torch.compile really runs evtc's pass
(the tests count the GEMMs it fused)."""
import os

os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
