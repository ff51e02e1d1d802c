"""Exercise checks: each one tests a learner's function on random inputs against tiny_k3 / sim, offline.

A check returns quietly after printing one success line, or raises `ExerciseError` with a message
that teaches: which shape, which term, and the right value for this very input. Known mistakes (a
scalar decay instead of a per-channel one, weights taken from scores + bias, bytes off by the dtype,
a missing renormalisation, ...) are recognised by recomputing the mistaken formula on the same input
and naming it. A NotImplementedError from the learner's stub passes through untouched, so
`workshop.try_exercise` can say "not done yet".

One module per lesson (lessonN.py), shared helpers and the registry in _common.py. A new lesson adds
`checks/lessonN.py` (its checks decorated with `@register(...)`) and one import line below; `ALL_CHECKS`,
`EXERCISES` and `hint` pick it up.

    0.1 check_causal_attention softmax attention over a sequence, causal
    0.2 check_decode_step      one decode step with a growing KV cache
    0.3 check_kv_cache_bytes   bytes of a plain multi-head KV cache
    1.1 check_route            top-k routing with a selection bias
    1.2 check_active_params    active parameters from the real breakdown
    1.3 check_bias_update      aux-loss-free load balancing
    2.1 check_kda_step         one KDA recurrent step for one head
    2.2 check_kda_gate         the KDA decay gate
    2.3 check_read_weights     the read as a weighted sum of past writes
    3.1 check_mla_cache_bytes  bytes of the MLA latent cache
    3.2 check_kda_state_bytes  bytes of the fixed KDA state
    4.1 check_depth_attention  one depth-attention read
    4.2 check_block_sources    the sources of Block AttnRes
    5.1 check_mxfp4_bytes      MXFP4 bytes of a weight matrix
    5.2 check_release_bytes    K3's release checkpoint size
    5.3 check_ep_bytes         expert-parallel traffic per token
    5.4 check_decode_roofline  bytes, FLOPs and the bound of one decode step
    6.1 check_sublayer_order   the sublayers one token passes through
    6.2 check_num_sources      how many depth sources a sublayer reads
    7.1 check_ablated_route    routing with an ablated expert
    7.2 check_kl               KL between the original's and the what-if's prediction
    7.3 check_reset_head       wiping one KDA head's state and conv tail
    8.1 check_weighted_loss    the weighted next-byte loss of a training step
    8.2 check_lr_at            the learning-rate schedule: warm-up, cosine, floor
    8.3 check_wilson_interval  the 95 % interval of a measured recall
"""

from ._common import EXERCISES, Exercise, ExerciseError, find_exercise, hint
from .lesson0 import check_causal_attention, check_decode_step, check_kv_cache_bytes
from .lesson1 import check_active_params, check_bias_update, check_route
from .lesson2 import check_kda_gate, check_kda_step, check_read_weights
from .lesson3 import check_kda_state_bytes, check_mla_cache_bytes
from .lesson4 import check_block_sources, check_depth_attention
from .lesson5 import check_decode_roofline, check_ep_bytes, check_mxfp4_bytes, check_release_bytes
from .lesson6 import check_num_sources, check_sublayer_order
from .lesson7 import check_ablated_route, check_kl, check_reset_head
from .lesson8 import check_lr_at, check_weighted_loss, check_wilson_interval

ALL_CHECKS = [ex.check for ex in EXERCISES.values()]     # in lesson order

__all__ = ["ALL_CHECKS", "EXERCISES", "Exercise", "ExerciseError", "find_exercise", "hint",
           "check_causal_attention", "check_decode_step", "check_kv_cache_bytes", "check_route",
           "check_active_params", "check_bias_update", "check_kda_step", "check_kda_gate", "check_read_weights",
           "check_mla_cache_bytes", "check_kda_state_bytes", "check_depth_attention", "check_block_sources",
           "check_mxfp4_bytes",
           "check_release_bytes", "check_ep_bytes", "check_decode_roofline", "check_sublayer_order",
           "check_num_sources", "check_ablated_route", "check_kl", "check_reset_head", "check_weighted_loss",
           "check_lr_at", "check_wilson_interval"]
