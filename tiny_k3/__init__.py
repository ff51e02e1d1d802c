"""tiny_k3: a scaled-down Kimi K3 with the real KDA, gated MLA, latent MoE and Attention Residuals math."""

from .cache import KDAState, MLACache, ModelCache
from .config import DEFAULT_PRESET, DEFAULT_PROMPT, ConfigError, K3Config
from .model import LoadedModel, TinyK3, generate, load_model, resolve_device, sample_next
from .params import parameter_breakdown, parameter_counts
from .probe import NO_RECORDER, Recorder, TraceRecorder

__all__ = ["K3Config", "ConfigError", "DEFAULT_PRESET", "DEFAULT_PROMPT", "TinyK3", "load_model", "LoadedModel",
           "generate", "sample_next", "resolve_device", "parameter_counts", "parameter_breakdown", "ModelCache",
           "KDAState", "MLACache", "Recorder", "NO_RECORDER", "TraceRecorder"]
