#!/usr/bin/env python3
"""numpy (BLAS) attention baseline for clattn-bench: the same computation, timed the same way.

    bench_numpy.py [--batch N] [--heads N] [--seq N] [--dim N] [--causal]
                   [--iters N] [--warmup N] [--csv]

out = softmax(Q·Kᵀ/sqrt(d) [+ causal mask]) · V in float32 with a numerically stable softmax
(row maximum subtracted), batched over B·H heads through numpy.matmul, which calls the BLAS numpy
loaded (OpenBLAS when installed; the output names the one actually loaded). Inputs are uniform in
[-1, 1) from a fixed seed. The median and minimum of --iters runs after --warmup runs are
reported; GFLOP/s counts 4·B·H·S·S·d, with causal counting only the visible (query, key) pairs,
as clattn-bench does.

Exit status: 0 ok; 2 bad usage (argparse); 3 numpy is not importable.
"""
import argparse
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description="numpy attention baseline (fp32)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--causal", action="store_true",
                   help="bottom-right causal mask (query i sees keys j <= i)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--csv", action="store_true",
                   help="one header line and one result line, in clattn-bench's columns")
    a = p.parse_args()
    for name in ("batch", "heads", "seq", "dim", "iters"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1")
    if a.warmup < 0:
        p.error("--warmup must be at least 0")
    return a


def blas_in_use():
    """Names the BLAS library numpy actually loaded, from this process's memory map (Linux), since
    numpy's build config names only what it was linked against and Debian switches libblas.so.3
    between implementations with update-alternatives. The reference (netlib) BLAS is ~20x slower
    than OpenBLAS, so a baseline must say which one it measured."""
    import os
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return "unknown BLAS"
    for path in sorted(paths):
        real = os.path.realpath(path)
        base = os.path.basename(real).lower()
        if "openblas" in real.lower():
            return "OpenBLAS"
        if base.startswith("libmkl"):
            return "MKL"
        if "blis" in base:
            return "BLIS"
        if base.startswith("libblas") and os.path.basename(os.path.dirname(real)) == "blas":
            return "reference BLAS (" + real + ")"
    return "unknown BLAS"


def main():
    a = parse_args()
    try:
        import numpy as np
    except ImportError as e:
        print(f"bench_numpy: numpy is not importable ({e}); install python3-numpy or "
              "pip install numpy", file=sys.stderr)
        return 3

    rng = np.random.default_rng(20261122)
    shape = (a.batch, a.heads, a.seq, a.dim)
    q, k, v = (rng.uniform(-1.0, 1.0, shape).astype(np.float32) for _ in range(3))
    scale = np.float32(1.0 / np.sqrt(a.dim))
    # Square case, so bottom-right and top-left alignment agree: key j is hidden when j > i.
    hidden = np.triu(np.ones((a.seq, a.seq), dtype=bool), k=1) if a.causal else None

    def attention():
        s = np.matmul(q * scale, k.swapaxes(-1, -2))  # [B][H][S][S], BLAS sgemm per head
        if hidden is not None:
            s[..., hidden] = -np.inf
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        return np.matmul(s, v)

    for _ in range(a.warmup):
        attention()
    times = []
    for _ in range(a.iters):
        t0 = time.perf_counter()
        out = attention()
        times.append((time.perf_counter() - t0) * 1e3)
    assert out.dtype == np.float32 and out.shape == shape

    blas = blas_in_use()
    if blas.startswith("reference"):
        print("bench_numpy: warning: numpy runs on the reference BLAS, not OpenBLAS; install "
              "libopenblas0 (Debian) for the usual baseline", file=sys.stderr)

    pairs = a.seq * (a.seq + 1) // 2 if a.causal else a.seq * a.seq
    flops = 4.0 * a.batch * a.heads * pairs * a.dim
    med, mn = statistics.median(times), min(times)
    gflops = flops / (med * 1e6)
    if a.csv:
        blas_short = blas.split(" (")[0]  # the library path is too long for a CSV field
        print("op,device,dtype,B,Hq,Hkv,Sq,Skv,D,causal,ms_median,ms_min,gflops,gbps,ratio_name,ratio")
        print(f"numpy,numpy {np.__version__} {blas_short},f32,{a.batch},{a.heads},{a.heads},{a.seq},{a.seq},"
              f"{a.dim},{int(a.causal)},{med:.6g},{mn:.6g},{gflops:.6g},,,")
    else:
        print(f"numpy attention: {med:.3f} ms, {gflops:.2f} GFLOP/s "
              f"(B{a.batch} H{a.heads} S{a.seq} d{a.dim} f32{' causal' if a.causal else ''}, "
              f"median of {a.iters} after {a.warmup} warm-up, min {mn:.3f} ms, numpy {np.__version__}, {blas})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
