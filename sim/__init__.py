"""sim: the step-through simulator that drives tiny_k3 and scales its figures up to K3."""

from .frame import DepthRecord, Frame, KDARecord, MemoryRecord, RoutingRecord, SublayerRecord, SublayerView
from .session import Simulation

from .streamed_run import open_run as load   # sim.load("run.npz"): reopen a saved run (sim/streamed_run.py)

__all__ = ["Simulation", "Frame", "RoutingRecord", "KDARecord", "DepthRecord", "SublayerRecord", "MemoryRecord",
           "SublayerView", "load"]
