import sys, time, torch
sys.path.insert(0, '/work/main'); sys.path.insert(0, '/work/main/bench')
torch.set_num_threads(1)
import bench_kda, op_floor
import tiny_k3.kda_chunk as kc
from tiny_k3.kda import kda_chunked
torch.manual_seed(0)
def run(Kd, segbytes):
    bench_kda.K = bench_kda.V = Kd
    x = bench_kda.inputs(4096, 'cpu')
    kc._SEGMENT_BYTES = segbytes
    with torch.inference_mode():
        for _ in range(3): kda_chunked(*x)
        ts=[]
        for _ in range(15):
            t=time.perf_counter(); kda_chunked(*x); ts.append(1e3*(time.perf_counter()-t))
        ops = op_floor.record_ops(lambda: kda_chunked(*x))
        f = op_floor.replay_floor(ops)
    return min(ts), f.total_ms, len(ops)
for rep in range(2):
    print("K=V=64:", run(64, 512*1024))
    print("K=V=4 (same op sequence, tiny data):", run(4, 512*1024//16))
