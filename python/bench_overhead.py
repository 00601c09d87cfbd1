#!/usr/bin/env python3
"""What the Python binding adds per call: the same clattn_attention at a tiny shape, timed in C
(bench_overhead.c, compiled here into a small shared library and called in the same process, on
the same context and buffers, runs interleaved with Python's) and through clattn.Context.attention
with DeviceTensors (and out= given, as the C call has its output buffer).

    python python/bench_overhead.py [--shape B,H,SQ,SKV,D] [--iters N] [--repeats R]

Prints microseconds per call, the median of R runs of N calls, in C, in Python and the
difference, for
  held:    N calls back to back with the queue held behind a user event, so that no kernel runs
           meanwhile (the cost of the call alone: the binding's overhead is this line's difference);
  issue:   N calls back to back, the clock stopped before the clFinish that follows;
  enqueue: the same with that clFinish (issue, and the kernels PoCL runs meanwhile);
  sync:    each call followed by clFinish (issue + run + wait: what a blocking loop sees);
then the binding's own work (the Python call with the C function replaced by a no-op), Python
without out= (a new output buffer each call: clCreateBuffer) and with numpy arrays in and out
(copies, blocking).
Needs a C compiler, the OpenCL headers, include/clattn.h and the generated clattn_export.h
(a build folder of the library: CLATTN_LIBRARY's, else build/ci/release).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def build_c() -> ctypes.CDLL:
    """bench_overhead.c as a shared library (it needs the header and the generated export header)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        sys.exit("bench_overhead: no C compiler")
    lib = Path(os.environ.get("CLATTN_LIBRARY", "/nonexistent"))
    inc = None
    for folder in (lib.parent, ROOT / "build" / "ci" / "release", *sorted((HERE / "build").glob("cmake-*"))):
        if (folder / "include" / "clattn_export.h").exists():
            inc = folder / "include"
            break
    if inc is None:
        sys.exit("bench_overhead: no generated clattn_export.h (build the library with CMake first)")
    so = Path(tempfile.mkdtemp()) / "bench_overhead_c.so"
    subprocess.check_call([cc, "-O2", "-std=c11", "-shared", "-fPIC", f"-I{ROOT / 'include'}", f"-I{inc}",
                           str(HERE / "bench_overhead.c"), "-o", str(so), "-lOpenCL"])
    dll = ctypes.CDLL(str(so))
    dll.bench_attention.restype = ctypes.c_double
    dll.bench_attention.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int, ctypes.c_int]
    return dll


def time_calls(fn, iters: int, repeats: int, finish) -> tuple:
    """Median µs per call of (issue: the calls alone, enqueue: calls + the final finish)."""
    fn()
    finish()
    issue, enq = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        ti = time.perf_counter()
        finish()
        t1 = time.perf_counter()
        issue.append((ti - t0) / iters * 1e6)
        enq.append((t1 - t0) / iters * 1e6)
    return statistics.median(issue), statistics.median(enq)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1,1,1,16,16", help="B,H,SQ,SKV,D (default 1,1,1,16,16: a decode step)")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=11)
    args = ap.parse_args()
    B, H, SQ, SKV, D = (int(x) for x in args.shape.split(","))

    if not os.environ.get("CLATTN_LIBRARY") and sys.path and Path(sys.path[0]).resolve() == HERE:
        sys.path.pop(0)  # not python/clattn (no bundled library) but the installed package
    import clattn
    from clattn import _lib
    L = _lib.lib()
    cdll = build_c()
    fn_attention = ctypes.cast(L.clattn_attention, ctypes.c_void_p)
    fn_queue = ctypes.cast(L.clattn_queue, ctypes.c_void_p)

    with clattn.Context() as ctx:
        rng = np.random.default_rng(0)
        q = rng.standard_normal((B, H, SQ, D), dtype=np.float32)
        k = rng.standard_normal((B, H, SKV, D), dtype=np.float32)
        tq, tk, tv = ctx.to_device(q), ctx.to_device(k), ctx.to_device(k)
        to = ctx.empty((B, H, SQ, D))
        fin = ctx.finish

        def c_run(mode: int) -> float:
            r = cdll.bench_attention(fn_attention, fn_queue, ctx.handle, *(ctypes.addressof(t._st) for t in (tq, tk, tv, to)),
                                     args.iters, mode)
            if r < 0:
                sys.exit("bench_overhead: the C call failed")
            return r

        cl = _lib.cl().dll
        cl.clCreateUserEvent.restype = ctypes.c_void_p
        cl.clCreateUserEvent.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)]
        cl.clEnqueueBarrierWithWaitList.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p),
                                                    ctypes.c_void_p]
        cl.clSetUserEventStatus.argtypes = [ctypes.c_void_p, ctypes.c_int32]
        cl.clReleaseEvent.argtypes = [ctypes.c_void_p]

        def py_run(mode: int) -> float:
            gate = None
            if mode == 3:  # hold the queue behind a user event: no kernel runs while we issue
                err = ctypes.c_int32(0)
                gate = ctypes.c_void_p(cl.clCreateUserEvent(ctx.cl_context, ctypes.byref(err)))
                cl.clEnqueueBarrierWithWaitList(ctx.cl_queue, 1, ctypes.byref(gate), None)
            t0 = time.perf_counter()
            for _ in range(args.iters):
                ctx.attention(tq, tk, tv, causal=True, out=to)
                if mode == 2:
                    fin()
            t1 = time.perf_counter()
            if gate is not None:
                cl.clSetUserEventStatus(gate, 0)  # CL_COMPLETE
                cl.clReleaseEvent(gate)
            fin()
            if mode == 1:
                t1 = time.perf_counter()
            return (t1 - t0) / args.iters * 1e6

        c_run(2), py_run(2)  # warm-up: kernel build
        res = {m: ([], []) for m in range(4)}
        for _ in range(args.repeats):  # interleaved, so that both see the same load
            for m in range(4):
                res[m][0].append(c_run(m))
                res[m][1].append(py_run(m))
        (c_iss, py_iss), (c_enq, py_enq), (c_sync, py_sync), (c_held, py_held) = (
            (statistics.median(res[m][0]), statistics.median(res[m][1])) for m in range(4))
        py_alloc = time_calls(lambda: ctx.attention(tq, tk, tv, causal=True), args.iters, args.repeats, fin)[0]
        py_numpy = time_calls(lambda: ctx.attention(q, k, k, causal=True), max(args.iters // 10, 10),
                              args.repeats, fin)[0]
        # The binding's own work: the same Python call with the C function replaced by a no-op.
        real = ctx._lib

        class Stub:
            def __getattr__(self, name):
                return getattr(real, name)

        stub = Stub()
        stub.clattn_attention = lambda *a: 0
        ctx._lib = stub
        py_own = time_calls(lambda: ctx.attention(tq, tk, tv, causal=True, out=to), args.iters, args.repeats,
                            lambda: None)[0]
        ctx._lib = real
        device = ctx.device_name
    lib = L.path
    print(f"clattn_attention B{B} H{H} Sq{SQ} Skv{SKV} d{D} causal f32 on {device}, libclattn {lib}")
    print(f"median of {args.repeats} runs of {args.iters} calls, microseconds per call:")
    print(f"  {'':40} {'C':>8} {'Python':>8} {'extra':>8}")
    print(f"  {'call alone (queue held, nothing runs)':40} {c_held:8.2f} {py_held:8.2f} {py_held - c_held:8.2f}")
    print(f"  {'issue (N calls back to back)':40} {c_iss:8.2f} {py_iss:8.2f} {py_iss - c_iss:8.2f}")
    print(f"  {'enqueue (N calls, then one clFinish)':40} {c_enq:8.2f} {py_enq:8.2f} {py_enq - c_enq:8.2f}")
    print(f"  {'sync (clFinish after each call)':40} {c_sync:8.2f} {py_sync:8.2f} {py_sync - c_sync:8.2f}")
    print(f"  {'binding alone (C call stubbed out)':40} {'':8} {py_own:8.2f}")
    print(f"  {'issue, a new output tensor each call':40} {'':8} {py_alloc:8.2f} {py_alloc - c_iss:8.2f}")
    print(f"  {'numpy in and out (copies, blocks)':40} {'':8} {py_numpy:8.2f} {py_numpy - c_sync:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
