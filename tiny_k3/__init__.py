"""tiny_k3: a scaled-down Kimi K3 with the real KDA, gated MLA, latent MoE and Attention Residuals math."""

from .cache import KDAState, MLACache, ModelCache
from .config import DEFAULT_PRESET, TEST_PRESET, ConfigError, K3Config
from .model import TinyK3, generate, resolve_device, sample_next
from .params import parameter_breakdown, parameter_counts
from .probe import Recorder, TraceRecorder

__all__ = ["K3Config", "ConfigError", "DEFAULT_PRESET", "TEST_PRESET", "TinyK3", "generate", "sample_next",
           "resolve_device", "parameter_counts", "parameter_breakdown", "ModelCache", "KDAState", "MLACache",
           "Recorder", "TraceRecorder"]
