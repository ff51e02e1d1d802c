"""Measured, not modelled: K3's decode speed-up from one real-width layer of each kind.

    python -m sim measure [--tokens 1024,...,1048576] [--batch 1,8,64] [--device cpu|cuda] [--dtype float32|bfloat16]
                          [--quick] [--save]

layers.py       the layers at real widths from tiny_k3's modules; absorbed MLA decode; MoE with touched experts only
measurement.py  what a step reads and computes, input checks, `Measurement` (composition), save / load
run.py          `measure()`: one layer at a time, timed; the machine's copy bandwidth and GEMM FLOP/s
accelerators.py H100 / H200 / B200 / B300 bandwidth and dense BF16 FLOP/s (docs/accelerators.md)
report.py       the printed tables, the roofline, the reading, the CLI and its last line
"""

from .accelerators import ACCELERATORS, REPORTED_SPEEDUP, Accelerator
from .layers import TouchedMoE, Widths, absorbed_mla_step, k2_config, latent_cache, widths
from .measurement import (SHIPPED, LayerWork, Machine, Measurement, check_memory, estimate_peak_bytes, load_saved, parse_batches,
                          parse_tokens, save, saved_paths, schedules)
from .run import measure
from .report import batch_line, last_line, main_measure, reading, report, saved_line

__all__ = ["measure", "Measurement", "LayerWork", "Machine", "load_saved", "save", "saved_paths", "SHIPPED", "main_measure", "last_line", "batch_line", "saved_line",
           "reading", "report", "absorbed_mla_step", "latent_cache", "TouchedMoE", "Widths", "widths", "k2_config",
           "schedules", "check_memory", "estimate_peak_bytes", "parse_tokens", "parse_batches", "ACCELERATORS", "Accelerator",
           "REPORTED_SPEEDUP"]
