import time, statistics
def ab(fns, n=10, rounds=15, warm=3):
    for f in fns.values():
        for _ in range(warm): f()
    res = {k: [] for k in fns}
    for r in range(rounds):
        for k, f in fns.items():
            s = time.process_time()
            for _ in range(n): f()
            res[k].append(1e3*(time.process_time()-s)/n)
    return {k: (min(v), statistics.median(v)) for k, v in res.items()}
def show(title, r):
    print(title, "  ".join(f"{k}: min {a:.3f} med {b:.3f}" for k, (a, b) in r.items()))
