"""Zero-copy interop with pyopencl: a context on pyopencl's queue, its arrays as tensors, results
written into pyopencl arrays. Skipped when pyopencl is not installed."""

from __future__ import annotations

import numpy as np
import pytest
import clattn_reference as ref
from test_clattn_attention import TOL, qkv

import clattn

cl = pytest.importorskip("pyopencl")
cla = pytest.importorskip("pyopencl.array")


@pytest.fixture(scope="module")
def queue(ctx):
    # the device the session's context uses, so that kernels built there are reused
    dev = [d for p in cl.get_platforms() for d in p.get_devices() if d.int_ptr == ctx.cl_device]
    if not dev:
        pytest.skip("pyopencl does not see the context's device")
    c = cl.Context(dev)
    return cl.CommandQueue(c)


def test_from_queue_and_arrays(queue, rng):
    q, k, v = qkv(rng)
    with clattn.Context.from_queue(queue) as ctx:
        assert ctx.cl_queue == queue.int_ptr and ctx.cl_context == queue.context.int_ptr
        aq, ak, av = (cla.to_device(queue, a) for a in (q, k, v))
        out = cla.empty(queue, q.shape, np.float32)
        res = ctx.attention(aq, ak, av, causal=True, out=out)
        assert isinstance(res, clattn.DeviceTensor) and res.cl_mem == out.base_data.int_ptr
        want = ref.attention(q, k, v, causal=True)[0]
        ref.assert_allclose(out.get(), want, TOL["f32"], what="pyopencl out")
        # a result tensor handed back to pyopencl without a copy
        t = ctx.attention(aq, ak, av, causal=True)
        back = t.to_pyopencl(queue)
        ref.assert_allclose(back.get(), want, TOL["f32"], what="to_pyopencl")
        # a pyopencl buffer plus a shape
        buf = cl.Buffer(queue.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=q)
        tq = ctx.wrap(buf, shape=q.shape, dtype="f32")
        np.testing.assert_array_equal(tq.numpy(), q)
        # kv_lengths as a pyopencl int32 array
        kvl = cla.to_device(queue, np.array([30, 40], dtype=np.int32))
        got = ctx.attention(aq, ak, av, causal=True, kv_lengths=kvl).numpy()
        ref.assert_allclose(got, ref.attention(q, k, v, causal=True, kv_lengths=[30, 40])[0], TOL["f32"],
                            what="pyopencl kv_lengths")


def test_strided_pyopencl_view(queue, rng):
    """A [B][S][H][D] pyopencl array transposed to [B][H][S][D] is passed by its strides."""
    q, k, v = qkv(rng)
    with clattn.Context.from_queue(queue) as ctx:
        arrs = [cla.to_device(queue, np.ascontiguousarray(a.transpose(0, 2, 1, 3))).transpose((0, 2, 1, 3))
                for a in (q, k, v)]
        got = ctx.attention(*arrs, causal=True).numpy()
        ref.assert_allclose(got, ref.attention(q, k, v, causal=True)[0], TOL["f32"], what="strided")


def test_pyopencl_dtype_not_converted(queue, rng):
    """A pyopencl array is read as what it holds: another storage type for it (k of f16 with f32
    data, float64) is refused by name, not met with a stride error."""
    q, k, v = qkv(rng)
    with clattn.Context.from_queue(queue) as ctx:
        ak16 = cla.to_device(queue, k.astype(np.float16))
        with pytest.raises(ValueError, match=r"^k: a pyopencl array of float16 cannot be read as f32"):
            ctx.attention(q, ak16, v)
        with pytest.raises(ValueError, match=r"pyopencl array of float64"):
            ctx.wrap(cla.to_device(queue, q.astype(np.float64)))
