"""In-process A/B of kda_chunked: /work/exp/s13/ab/old_k3 (a copy of main) vs new_k3 (a copy of the worktree).
usage: ab_kda.py [threads] [rounds] [--fla]"""
import sys, time, torch, importlib
sys.path.insert(0, '/work/exp/s13/ab'); sys.path.insert(0, '/work/main/bench')
threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
torch.set_num_threads(threads)
old = importlib.import_module('old_k3.kda_chunk'); new = importlib.import_module('new_k3.kda_chunk')
import bench_kda
fla = bench_kda.fla_naive_recurrent() if '--fla' in sys.argv else None
torch.manual_seed(0)
x = bench_kda.inputs(4096, 'cpu')
xs = bench_kda.inputs(4096, 'cpu', strong_decay=True)
clock = time.process_time if threads == 1 else time.perf_counter
with torch.inference_mode():
    for _ in range(3): old.kda_chunked(*x); new.kda_chunked(*x)
    d = (old.kda_chunked(*x)[0] - new.kda_chunked(*x)[0]).abs().max().item()
    res = {'old': [], 'new': [], 'old g=-5': [], 'new g=-5': [], 'fla': []}
    for r in range(rounds):
        for name, m in (('old', old), ('new', new)):
            t = clock(); m.kda_chunked(*x); res[name].append(1e3 * (clock() - t))
        if r % 5 == 0:
            for name, m in (('old g=-5', old), ('new g=-5', new)):
                t = clock(); m.kda_chunked(*xs); res[name].append(1e3 * (clock() - t))
            if fla is not None:
                t = clock(); fla(*x); res['fla'].append(1e3 * (clock() - t))
print(f"threads {threads}, clock {clock.__name__}, max|old-new| {d:.1e}")
for k, v in res.items():
    if v: v = sorted(v); print(f"{k:9s} min {v[0]:7.2f}  median {v[len(v)//2]:7.2f} ms")
print(f"new/old (min) {min(res['new'])/min(res['old']):.3f}, (median) {sorted(res['new'])[rounds//2]/sorted(res['old'])[rounds//2]:.3f}")
if res['fla']: print(f"fla/new {min(res['fla'])/min(res['new']):.1f}x  fla/old {min(res['fla'])/min(res['old']):.1f}x")
