"""In one process: this tree's LatentMoE against the before tree's (its moe.py at /tmp/moe2-before: `git archive 89d6314`), same weights, same input, interleaved; --keep: glibc keeps freed memory."""
import sys, torch, importlib.util
sys.path.insert(0, '.'); sys.path.insert(0, str(__import__('pathlib').Path(__file__).parent))
from harness import ab, show
import tiny_k3
from tiny_k3.config import K3Config
from tiny_k3.moe import LatentMoE, GatedMLP
from bench.bench_moe import active_params, keep_freed_memory
spec = importlib.util.spec_from_file_location("tiny_k3.moe_before", "/tmp/moe2-before/tiny_k3/moe.py")
before = importlib.util.module_from_spec(spec); sys.modules["tiny_k3.moe_before"] = before; spec.loader.exec_module(before)
torch.set_num_threads(1); torch.manual_seed(0)
if "--keep" in sys.argv: keep_freed_memory()
presets = [a for a in sys.argv[1:] if not a.startswith("--")]
shapes = [(1, 1), (1, 256)]
for preset in presets:
    c = K3Config.preset(preset); new = LatentMoE(c); old = before.LatentMoE(c); old.load_state_dict(new.state_dict())
    dense = GatedMLP(c.hidden_size, round(active_params(new) / (3 * c.hidden_size)), c)
    for b, t in shapes:
        x = torch.randn(b, t, c.hidden_size)
        with torch.inference_mode():
            d = (new(x) - old(x)).abs().max().item()
            n = 200 if t == 1 else 10
            r = ab({"new": lambda: new(x), "old": lambda: old(x), "dense": lambda: dense(x)}, n=n, rounds=9)
        print(f"{preset:<12} {b}x{t:<4} new {r['new'][0]:.3f} old {r['old'][0]:.3f} dense {r['dense'][0]:.3f} ms (min of 9)  "
              f"new/old {r['new'][0]/r['old'][0]:.2f}  ratio new {r['new'][0]/r['dense'][0]:.2f}x old {r['old'][0]/r['dense'][0]:.2f}x  "
              f"(medians {r['new'][1]/r['dense'][1]:.2f}x / {r['old'][1]/r['dense'][1]:.2f}x)  max|diff| {d:.1e}", flush=True)
