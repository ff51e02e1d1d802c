"""Decode only, in one process: this tree's LatentMoE against another moe.py (argv[1]), same weights, 40 rounds of 100 calls
in shuffled order; min and median ms per call.   python decode_ab.py /tmp/moe3_before_moe.py small mini-896/16"""
import sys, time, random, statistics, torch, importlib.util
sys.path.insert(0, '.')
from bench.bench_moe import keep_freed_memory
keep_freed_memory()
from tiny_k3.config import K3Config
from tiny_k3.moe import LatentMoE
spec = importlib.util.spec_from_file_location("tiny_k3.moe_before", sys.argv[1])
before = importlib.util.module_from_spec(spec); sys.modules["tiny_k3.moe_before"] = before; spec.loader.exec_module(before)
torch.set_num_threads(1); torch.manual_seed(0)
for preset in sys.argv[2:]:
    c = K3Config.preset(preset); new = LatentMoE(c); old = before.LatentMoE(c); old.load_state_dict(new.state_dict())
    x = torch.randn(1, 1, c.hidden_size)
    res = {"new": [], "old": []}
    with torch.inference_mode():
        for f in (new, old):
            for _ in range(50): f(x)
        for r in range(40):
            order = [("new", new), ("old", old)]; random.shuffle(order)
            for name, f in order:
                s = time.process_time()
                for _ in range(100): f(x)
                res[name].append((time.process_time() - s) / 100 * 1e3)
    print(preset, {k: (round(min(v), 4), round(statistics.median(v), 4)) for k, v in res.items()})
