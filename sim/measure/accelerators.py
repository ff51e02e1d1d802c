"""Published accelerators as data: memory bandwidth and dense BF16 tensor FLOP/s (docs/accelerators.md).

Per GPU, SXM/HGX parts, dense (no 2:4 sparsity, which vendors' headline figures double). The numbers and
their sources are discussed in docs/accelerators.md; the roofline there and in `sim.measure` uses only these.
"""

from __future__ import annotations

from typing import NamedTuple


class Accelerator(NamedTuple):
    name: str
    bandwidth: float    # bytes/s of HBM
    bf16_flops: float   # dense BF16 tensor-core FLOP/s
    source: str

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which a step is compute-bound on this part (the roofline's ridge point)."""
        return self.bf16_flops / self.bandwidth


ACCELERATORS: tuple[Accelerator, ...] = (
    Accelerator("H100", 3.35e12, 989.4e12, "NVIDIA H100 SXM5 datasheet (1,979 TFLOPS BF16 with sparsity)"),
    Accelerator("H200", 4.8e12, 989.4e12, "NVIDIA H200 SXM datasheet (same GH100 tensor cores as H100)"),
    Accelerator("B200", 8.0e12, 2.25e15, "NVIDIA HGX B200 (36 PFLOPS BF16 sparse per 8 GPUs)"),
    Accelerator("B300", 8.0e12, 2.25e15, "NVIDIA HGX B300 (BF16 as B200; FP4 and FP64 differ)"),
)

# The claim and the measurement it comes from (k3_facts.md §0): Moonshot's "up to 6.3x faster decoding in
# million-token contexts" (S14) names no baseline; its number matches Kimi Linear's TPOT at 1M, 11.48 ms (full MLA)
# vs 1.84 ms (S16, S34). The whole story, told once: sim.serving_text.claim_story().
REPORTED_SPEEDUP = 6.3
