"""Lesson 6 solutions: the walk of one token, depth sources per sublayer."""


def sublayer_order(config):
    order = ["embed"]
    for i, kind in enumerate(config.layer_kinds):
        order += [kind, "dense" if i < config.first_k_dense else "moe"]
    return order + ["head"]


def num_sources(config, layer, site):
    block = 1 if config.residual == "full" else config.attnres_block_size
    done = 2 * layer + (1 if site == "mlp" else 0)   # outputs produced before this read ("out": all 2L)
    return 1 + done // block + (1 if done % block else 0)
