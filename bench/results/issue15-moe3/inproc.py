"""In one process: this tree's LatentMoE against another moe.py (argv[1]: the before tree's, `git show 3766109:tiny_k3/moe.py`),
same weights and input, one dense FFN, interleaved rounds (old, new, dense), min of 9; glibc keeps freed memory.
    python inproc.py /tmp/moe3_before_moe.py small mini-896/16"""
import sys, time, statistics, torch, importlib.util
sys.path.insert(0, '.')
sys.path.insert(0, str(__import__('pathlib').Path(__file__).parents[1] / 'issue15-moe2'))
from harness import ab  # noqa: E402  (issue15-moe2's: interleaved rounds, (min, median) ms per call)
from bench.bench_moe import active_params, keep_freed_memory
keep_freed_memory()
from tiny_k3.config import K3Config
from tiny_k3.moe import LatentMoE, GatedMLP
path = sys.argv[1]
spec = importlib.util.spec_from_file_location("tiny_k3.moe_before", path)
before = importlib.util.module_from_spec(spec); sys.modules["tiny_k3.moe_before"] = before; spec.loader.exec_module(before)
torch.set_num_threads(1); torch.manual_seed(0)
for preset in sys.argv[2:]:
    c = K3Config.preset(preset); new = LatentMoE(c); old = before.LatentMoE(c); old.load_state_dict(new.state_dict())
    dense = GatedMLP(c.hidden_size, round(active_params(new) / (3 * c.hidden_size)), c)
    for b, t in [(1, 1), (1, 256)]:
        x = torch.randn(b, t, c.hidden_size)
        with torch.inference_mode():
            d = (new(x) - old(x)).abs().max().item()
            r = ab({"old": lambda: old(x), "new": lambda: new(x), "dense": lambda: dense(x)}, n=200 if t == 1 else 10, rounds=9)
        print(f"{preset:<12} {b}x{t:<4} new {r['new'][0]:.3f} old {r['old'][0]:.3f} dense {r['dense'][0]:.3f} ms  new/old {r['new'][0]/r['old'][0]:.2f}  "
              f"ratio new {r['new'][0]/r['dense'][0]:.2f}x old {r['old'][0]/r['dense'][0]:.2f}x  max|diff| {d:.1e}", flush=True)
