"""Reference solutions to the lesson exercises — for instructors; hand out lessons/ without this folder.

Each solution is written from the equations, the way a learner would, not by calling the project's
own implementation (the checks compare against that). `workshop.exercise(name)` swaps them in when
TINY_K3_SOLUTIONS=1.
"""

from .lesson0 import causal_attention, decode_step, kv_cache_bytes
from .lesson1 import active_params, bias_update, route
from .lesson2 import kda_gate, kda_step, read_weights
from .lesson3 import kda_state_bytes, mla_cache_bytes
from .lesson4 import block_sources, depth_attention
from .lesson5 import decode_roofline, ep_bytes, mxfp4_bytes, release_bytes
from .lesson6 import num_sources, sublayer_order
from .lesson7 import ablated_route, kl, reset_head
from .lesson8 import lr_at, weighted_loss, wilson_interval
from .build import attend_with_cache, delta_chunked, delta_step, kda_head, mla_decode  # the "Build it yourself" thread

__all__ = ["causal_attention", "decode_step", "kv_cache_bytes", "route", "active_params", "bias_update", "kda_step",
           "kda_gate", "read_weights", "mla_cache_bytes", "kda_state_bytes", "depth_attention", "block_sources",
           "mxfp4_bytes", "release_bytes", "ep_bytes", "decode_roofline", "sublayer_order", "num_sources",
           "ablated_route", "kl", "reset_head", "weighted_loss", "lr_at", "wilson_interval", "delta_step",
           "delta_chunked", "kda_head", "attend_with_cache", "mla_decode"]
