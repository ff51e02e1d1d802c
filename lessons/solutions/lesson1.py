"""Lesson 1 solutions: routing, active parameters, the selection-bias update."""

import torch


def route(scores, bias, top_k):
    """scores [T, E], bias [E] -> (expert_ids [T, k], weights [T, k]) (k3_facts.md §1c)."""
    expert_ids = (scores + bias).topk(top_k, dim=-1).indices   # the bias picks ...
    chosen = scores.gather(-1, expert_ids)                     # ... the unbiased scores weigh
    return expert_ids, chosen / chosen.sum(-1, keepdim=True)


def active_params(parts, num_experts, top_k):
    """Everything but the input embedding, with top_k / num_experts of the routed experts."""
    idle = parts["routed_experts"] * (num_experts - top_k) // num_experts
    return sum(parts.values()) - parts["embedding"] - idle


def bias_update(bias, load, rate):
    """Aux-loss-free balancing: overloaded experts down by rate, underloaded up (DeepSeek-V3 §2.1.2)."""
    return bias + rate * torch.sign(load.mean() - load)
