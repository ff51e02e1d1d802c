# How bench/results/issue15-perf2/kda-interleaved-cpu.txt was measured: old (a checkout of ab1305c at
# /tmp/perf2/before, loaded under another package name) and new kda_chunked interleaved in one process,
# CPU time (process_time), 1 thread, T=4096 H=4 K=V=64; run from the repo root: python <this> 1 32,64 fla
import sys, time, torch, statistics, importlib.util, types
sys.path.insert(0, '.'); sys.path.insert(0, 'bench')
from bench_kda import inputs, fla_naive_recurrent
import tiny_k3.kda as new
def load(path, name):
    # load the before package under another name
    spec = importlib.util.spec_from_file_location(name, path + '/tiny_k3/__init__.py', submodule_search_locations=[path + '/tiny_k3'])
    m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m)
    return importlib.import_module(name + '.kda')
old = load('/tmp/perf2/before', 'tk_before')
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv)>1 else 1); torch.manual_seed(0)
Cs = [int(c) for c in sys.argv[2].split(',')] if len(sys.argv)>2 else [32, 64]
withfla = len(sys.argv) > 3
fla = fla_naive_recurrent()
x = inputs(4096, 'cpu')
def cpu(fn):
    t=time.process_time(); fn(); return 1e3*(time.process_time()-t)
res = {}
with torch.inference_mode():
    for _ in range(2):
        for C in Cs: old.kda_chunked(*x, chunk_size=C); new.kda_chunked(*x, chunk_size=C)
    for rep in range(7):
        if withfla and rep < 3: res.setdefault('fla', []).append(cpu(lambda: fla(*x)))
        for C in Cs:
            for nm, m in (('old', old), ('new', new)):
                res.setdefault((nm, C), []).append(cpu(lambda: m.kda_chunked(*x, chunk_size=C)))
for k_, v_ in res.items(): print(k_, round(statistics.median(v_), 1), [round(a) for a in v_])
