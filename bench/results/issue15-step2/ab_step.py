"""A/B decode-step timing of two source trees in one process each, alternating: python ab_step.py <tree> <preset>"""
import sys, time, torch, numpy as np
sys.path.insert(0, sys.argv[1])
from sim import Simulation
from tiny_k3.cache import ModelCache
from tiny_k3.config import DEFAULT_PROMPT as PROMPT
torch.set_num_threads(1)
preset = sys.argv[2]
sim = Simulation(preset, PROMPT, weights="random")
class Bare:
    def __init__(self, model):
        self.model = model; self.cache = ModelCache(model.config.num_layers)
    @torch.no_grad()
    def step(self, token=65):
        _, self.cache = self.model(torch.tensor([[token]]), self.cache)
hy, tw = Bare(sim.model), Bare(sim.twin_model)
for tok in [256] + list(PROMPT.encode()):
    hy.step(tok); tw.step(tok)
n = 40 if preset == 'small' else int(sys.argv[3]) if len(sys.argv) > 3 else 10
res = {'hybrid': [], 'twin': [], 'step()': []}
for _ in range(n):
    for name, fn in (('hybrid', hy.step), ('twin', tw.step), ('step()', sim.step)):
        t = time.process_time(); fn(); res[name].append((time.process_time() - t) * 1e3)
print(sys.argv[1], preset, {k: round(float(np.median(v)), 2) for k, v in res.items()}, 'min', {k: round(float(np.min(v)), 2) for k, v in res.items()})
