"""Where a prefill-256 call of `LatentMoE._forward_tokens` spends its CPU time: a copy of it with a clock between the parts
(asserted equal to the real forward), then the whole forward and the dense FFN, 7 rounds of 20 calls.  python stages.py small"""
import sys, time, torch
sys.path.insert(0, '.')
from bench.bench_moe import keep_freed_memory, active_params
keep_freed_memory()
import torch.nn.functional as F
from tiny_k3.config import K3Config
from tiny_k3.moe import LatentMoE, GatedMLP, top_k_ids, _chosen_weights, Routing
from tiny_k3.fused import scratch_buffer
from tiny_k3.probe import NO_RECORDER
torch.set_num_threads(1); torch.manual_seed(0)
c = K3Config.preset(sys.argv[1]); moe = LatentMoE(c)
dense = GatedMLP(c.hidden_size, round(active_params(moe)/(3*c.hidden_size)), c)
x = torch.randn(1, 256, c.hidden_size)
clk = time.process_time
acc = {}
def mark(name, t0):
    t1 = clk(); acc[name] = acc.get(name, 0) + t1 - t0; return t1
def fwd(self, x):
    t = clk()
    fused = self._fused_weights(x); t = mark("fused_weights", t)
    mods = self._modules
    E, l, hs = c.num_experts, c.latent_dim, mods["shared"]._modules["w1"].out_features
    n = 256; weight = fused[0]
    xs = torch.mm(x.reshape(n, -1), weight.t(), out=scratch_buffer("xs", (n, weight.shape[0]), x)); t = mark("xs mm", t)
    scores = torch.sigmoid(xs[:, :E], out=scratch_buffer("scores", (n, E), x)); t = mark("sigmoid", t)
    router, scores = mods["router"], scores.view(*x.shape[:-1], E)
    biased = torch.add(scores, router._buffers["bias"], out=xs[:, :E].view(*x.shape[:-1], E)); t = mark("bias", t)
    ids = top_k_ids(biased, router.top_k); t = mark("topk", t)
    routing = Routing(ids, _chosen_weights(scores, ids, router.renormalize, router.scaling), scores); t = mark("weights", t)
    self._report(routing, NO_RECORDER, 0)
    k = 16; z = xs[:, E:E + l]
    y = self._mix_token_major(z, routing.expert_ids.reshape(n, k), routing.weights.reshape(n, k)); t = mark("mix", t)
    y = F.rms_norm(y, (l,), eps=mods["latent_norm"].eps); t = mark("rms", t)
    gate = scratch_buffer("shared gate", (n, hs), x).copy_(xs[:, E + l:E + l + hs])
    up = scratch_buffer("shared up", (n, hs), x).copy_(xs[:, E + l + hs:])
    h = self._glu_(gate, up, scratch_buffer("shared sigmoid", (n, hs), x)); t = mark("shared glu", t)
    out = F.linear(torch.cat([y, h], -1), fused[1]).view_as(x); t = mark("out", t)
    return out
with torch.inference_mode():
    ref = moe(x); assert torch.equal(fwd(moe, x), ref)
    for _ in range(5): fwd(moe, x)
    best = {}
    for r in range(7):
        acc.clear()
        s = clk()
        for _ in range(20): fwd(moe, x)
        tot = (clk() - s) / 20 * 1e3
        s = clk()
        for _ in range(20): moe(x)
        whole = (clk() - s) / 20 * 1e3
        s = clk()
        for _ in range(20): dense(x)
        d = (clk() - s) / 20 * 1e3
        print(f"total {tot:.3f} whole {whole:.3f} dense {d:.3f} | " + " ".join(f"{k} {v/20*1e3:.3f}" for k, v in acc.items()))
