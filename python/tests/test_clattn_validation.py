"""Python-side validation: what the binding refuses before the library sees it, with a ValueError
that names the argument, and without touching the caller's arrays (docs/python.md, Errors).

Every refusal here happens before a kernel is built or run, so these tests cost no compilation."""

from __future__ import annotations

import numpy as np
import pytest
from clattn_reference import randn

import clattn

B, HQ, HKV, SQ, SKV, D = 2, 4, 2, 8, 12, 16


@pytest.fixture
def arrays(rng):
    q, k, v = randn(rng, B, HQ, SQ, D), randn(rng, B, HKV, SKV, D), randn(rng, B, HKV, SKV, D)
    return dict(q=q, k=k, v=v, out=randn(rng, B, HQ, SQ, D), lse=randn(rng, B, HQ, SQ, 1))


def _int(a, dt=np.int32):
    return np.rint(a * 4).astype(dt)


# (argument named in the message, the call); each passes one integer or bool array where float data
# belongs, as an input or as a numpy output to fill
INT_ARRAYS = {
    "attention-k": ("k", lambda c, a: c.attention(a["q"], _int(a["k"], np.int64), a["v"])),
    "attention-v-bool": ("v", lambda c, a: c.attention(a["q"], a["k"], a["v"] > 0)),
    "attention-k-int16": ("k", lambda c, a: c.attention(a["q"], _int(a["k"], np.int16), a["v"])),
    "attention-v-uint16-f32": ("v", lambda c, a: c.attention(a["q"], a["k"], a["v"].view(np.uint16)[..., ::2])),
    "attention-mask": ("mask", lambda c, a: c.attention(a["q"], a["k"], a["v"],
                                                        mask=np.zeros((1, 1, SQ, SKV), np.int32))),
    "attention-sinks": ("sinks", lambda c, a: c.attention(a["q"], a["k"], a["v"], sinks=np.zeros(HQ, np.int32))),
    "attention-alibi": ("alibi_slopes", lambda c, a: c.attention(a["q"], a["k"], a["v"],
                                                                 alibi_slopes=np.ones(HQ, np.int64))),
    "attention-out": ("out", lambda c, a: c.attention(a["q"], a["k"], a["v"], out=a["int_out"])),
    "attention-lse": ("lse", lambda c, a: c.attention(a["q"], a["k"], a["v"], lse=a["int_lse"])),
    "attention-probabilities": ("probabilities", lambda c, a: c.attention(
        a["q"], a["k"], a["v"], probabilities=np.zeros((B, HQ, SQ, SKV), np.int32))),
    "backward-k": ("k", lambda c, a: c.attention_backward(a["q"], _int(a["k"]), a["v"], a["out"], a["out"],
                                                          a["lse"])),
    "backward-out": ("out", lambda c, a: c.attention_backward(a["q"], a["k"], a["v"], _int(a["out"]), a["out"],
                                                              a["lse"])),
    "backward-dout": ("dout", lambda c, a: c.attention_backward(a["q"], a["k"], a["v"], a["out"], _int(a["out"]),
                                                                a["lse"])),
    "backward-lse": ("lse", lambda c, a: c.attention_backward(a["q"], a["k"], a["v"], a["out"], a["out"],
                                                              _int(a["lse"]))),
    "backward-dq": ("dq", lambda c, a: c.attention_backward(a["q"], a["k"], a["v"], a["out"], a["out"], a["lse"],
                                                            dq=a["int_out"])),
    "backward-dsinks": ("dsinks", lambda c, a: c.attention_backward(
        a["q"], a["k"], a["v"], a["out"], a["out"], a["lse"], sinks=np.zeros(HQ, np.float32),
        dsinks=np.zeros(HQ, np.int32))),
    "scores-k": ("k", lambda c, a: c.scores(a["q"], _int(a["k"]))),
    "scores-out": ("out", lambda c, a: c.scores(a["q"], a["k"], out=np.zeros((B, HQ, SQ, SKV), np.int32))),
    "softmax-x": ("x", lambda c, a: c.softmax(_int(a["q"]))),
    "softmax-mask": ("mask", lambda c, a: c.softmax(a["q"], mask=np.zeros((1, 1, SQ, D), np.int64))),
    "softmax-out": ("out", lambda c, a: c.softmax(a["q"], out=a["int_out"])),
    "merge-parts_out": ("parts_out[1]", lambda c, a: c.merge([a["out"], _int(a["out"])], [a["lse"], a["lse"]])),
    "merge-parts_lse": ("parts_lse[0]", lambda c, a: c.merge([a["out"], a["out"]], [_int(a["lse"]), a["lse"]])),
    "merge-out": ("out", lambda c, a: c.merge([a["out"], a["out"]], [a["lse"], a["lse"]], out=a["int_out"])),
    "merge-lse": ("lse", lambda c, a: c.merge([a["out"], a["out"]], [a["lse"], a["lse"]], lse=a["int_lse"])),
    "attention_host-v": ("v", lambda c, a: c.attention_host(a["q"], a["k"], _int(a["v"]))),
    "dropout_mask-out": ("out", lambda c, a: c.dropout_mask(B, HQ, SQ, SKV, p=0.5, seed=1,
                                                            out=np.zeros((B, HQ, SQ, SKV), np.int32))),
}


@pytest.mark.parametrize("case", list(INT_ARRAYS))
def test_integer_arrays_refused_naming_the_argument(ctx, arrays, case):
    """Integer and bool data (and uint16 without dtype="bf16") are refused for every array argument
    of every entry point, inputs and numpy outputs alike, and an output array is left as it was."""
    name, call = INT_ARRAYS[case]
    arrays["int_out"] = np.full((B, HQ, SQ, D), 7, np.int32)
    arrays["int_lse"] = np.full((B, HQ, SQ, 1), 7, np.int32)
    with pytest.raises(ValueError) as e:
        call(ctx, arrays)
    assert str(e.value).startswith(name + " "), str(e.value)
    assert np.all(arrays["int_out"] == 7) and np.all(arrays["int_lse"] == 7)


def test_tensor_creation_refuses_bad_shapes_and_i32_misuse(ctx, arrays):
    """Tensors are 4-D with non-negative extents; "i32" tensors are 1-D integer key lengths, and
    refused, by name, where attention data belong."""
    for shape in ((1, 2, -3, 4), (1, 2, 3), (1, 2, 3, 4, 5), (1, 2, 3.5, 4)):
        with pytest.raises(ValueError, match="shape"):
            ctx.empty(shape)
        with pytest.raises(ValueError, match="shape"):
            ctx.zeros(shape)
    with pytest.raises(ValueError, match="4-D"):
        ctx.to_device(arrays["q"][0])
    with pytest.raises(ValueError, match="i32"):
        ctx.to_device(arrays["q"] * 1.7, "i32")              # floats are not key lengths
    with pytest.raises(ValueError, match="1-D"):
        ctx.to_device(np.ones((1, 1, 2, 2), np.int32))       # nor is a 4-D integer array
    with pytest.raises(ValueError, match="1-D"):
        ctx.empty((2, 2), "i32")
    with pytest.raises(ValueError, match="int32"):
        ctx.to_device(np.array([2**31], np.int64))           # would wrap
    lens = ctx.to_device(np.array([3, 4], np.int32))
    assert lens.dtype == "i32" and lens.shape == (2,)
    assert ctx.empty((0, 1, 1, 1)).shape == (0, 1, 1, 1)     # empty extents are fine here
    with pytest.raises(ValueError, match=r"^q .*i32"):
        ctx.attention(lens, arrays["k"], arrays["v"])
    with pytest.raises(ValueError, match=r"^out .*i32"):
        ctx.attention(arrays["q"], arrays["k"], arrays["v"], out=lens)
    with pytest.raises(ValueError, match="dtype"):
        ctx.attention(arrays["q"], arrays["k"], arrays["v"], dtype="i32")


def test_output_shape_errors_name_the_argument(ctx, arrays):
    q, k, v, out, lse = (arrays[n] for n in ("q", "k", "v", "out", "lse"))
    keep = out.copy()
    for name, kw in (("lse", dict(lse=np.zeros((B, HQ, SQ + 1, 1), np.float32))),
                     ("probabilities", dict(probabilities=np.zeros((B, HQ, SQ, SKV + 1), np.float32)))):
        with pytest.raises(ValueError, match=rf"^{name} has shape"):
            ctx.attention(q, k, v, out=out, **kw)
        assert np.array_equal(out, keep)
    for name in ("dq", "dk", "dv"):
        bad = np.full((B, HQ, SQ - 1, D), 7.0, np.float32)
        with pytest.raises(ValueError, match=rf"^{name} has shape"):
            ctx.attention_backward(q, k, v, out, out, lse, **{name: bad})
        assert np.all(bad == 7.0)
    with pytest.raises(ValueError, match=r"^lse has shape"):
        ctx.merge([out, out], [lse, lse], lse=np.zeros((B, HQ, SQ + 1, 1), np.float32))
    frozen = np.full((B, HQ, SQ, D), 7.0, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match=r"^out .*read-only"):
        ctx.attention(q, k, v, out=frozen)


def test_scalar_arguments_are_integers_and_known(ctx):
    """Integers where integers are documented (no silent truncation of 1.5), known dtypes by name,
    and a device spec that is a string."""
    with pytest.raises(ValueError, match="device"):
        clattn.Context(device=3)
    with pytest.raises(ValueError, match="spec"):
        clattn.select_device(3)
    with pytest.raises(ValueError, match="f32, f16 or bf16"):
        ctx.dropout_mask(1, 1, 2, 4, p=0.5, seed=1, dtype="i32")
    with pytest.raises(ValueError, match="grad_dtype"):
        ctx.attention_backward(*(np.zeros((1, 1, 2, 4), np.float32),) * 5, np.zeros((1, 1, 2, 1), np.float32),
                               grad_dtype="i32")
    with pytest.raises(ValueError, match="ctr"):
        clattn.philox4x32_10((1.5, 0, 0, 0), (0, 0))
    with pytest.raises(ValueError, match="key"):
        clattn.philox4x32_10((1, 0, 0, 0), (True, 0))
    assert clattn.philox4x32_10((np.uint32(1), np.int64(0), 0, 0), (0, 0)) == clattn.philox4x32_10((1, 0, 0, 0),
                                                                                                   (0, 0))
    with pytest.raises(ValueError, match="heads"):
        clattn.alibi_slopes(3.5, 8)
    assert np.array_equal(clattn.alibi_slopes(np.int64(4), 8), clattn.alibi_slopes(4, 8))
    with pytest.raises(ValueError, match="chunk"):
        ctx.attention(*(np.zeros((1, 1, 2, 4), np.float32),) * 3, chunk=2.5)
    with pytest.raises(ValueError, match="dropout_seed"):
        ctx.attention(*(np.zeros((1, 1, 2, 4), np.float32),) * 3, dropout_p=0.1, dropout_seed=1.5)
    with clattn.Context() as c:
        n = len(c.get_params("decode").values)
        with pytest.raises(ValueError, match="decode"):
            c.set_params("decode", [1.5] + [1] * (n - 1))
        with pytest.raises(ValueError, match="values"):
            c.set_params("decode", "abc")
        with pytest.raises(ValueError, match="ROWS"):
            c.set_params("softmax", {"ROWS": 1.5})
        assert c.get_params("decode").source != "override"   # nothing was set


def test_kv_lengths_need_exactly_batch_values(ctx, arrays):
    """Host kv_lengths: exactly batch values; a device buffer: at least batch (a server sizes it for
    its largest batch), of which the first batch are read."""
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    for bad in ([1, 2, 3], [1], np.array([4, 4, 4], np.int32)):
        with pytest.raises(ValueError, match=r"kv_lengths .*exactly"):
            ctx.attention(q, k, v, kv_lengths=bad)
    with pytest.raises(ValueError, match=r"kv_lengths .*needs batch"):
        ctx.attention(q, k, v, kv_lengths=ctx.to_device(np.array([4], np.int32)))
    longer = ctx.attention(q, k, v, kv_lengths=ctx.to_device(np.array([4, 7, 1000], np.int32)))
    np.testing.assert_array_equal(longer, ctx.attention(q, k, v, kv_lengths=[4, 7]))
    with pytest.raises(ValueError, match=r"kv_lengths .*exactly"):
        ctx.softmax(q, kv_lengths=[1, 2, 3])
    with pytest.raises(ValueError, match=r"kv_lengths .*exactly"):
        ctx.dropout_mask(B, HQ, SQ, SKV, p=0.5, seed=1, kv_lengths=[1, 2, 3])


def test_views_checked_against_the_buffer(ctx, arrays):
    t = ctx.to_device(arrays["k"])                           # 2*2*12*16 elements
    n = t.size
    for kw in (dict(shape=(B, HKV, 4 * SKV, D)),             # past the end
               dict(offset=-5),                              # before the start
               dict(offset=n),                               # one past the end
               dict(offset=10**6),
               dict(shape=(B, HKV, -1, D)),
               dict(strides=(HKV * SKV * D, SKV * D, 2 * D)),   # rows twice as far apart
               dict(offset=(SKV - 1) * D, shape=(1, 1, SKV, D), strides=(0, 0, -D))):   # the library's rule
        with pytest.raises(ValueError, match="view"):
            t.view(**kw)
    # what fits is still fine, up to the last element
    last = t.view(offset=n - D, shape=(1, 1, 1, D))
    assert np.array_equal(last.numpy()[0, 0, 0], arrays["k"][-1, -1, -1])
    assert np.array_equal(t.view(shape=(1, 1, SKV, D), strides=(0, 0, D)).numpy(), arrays["k"][:1, :1])
    assert t.seq(2, 5).shape == (B, HKV, 3, D)
    # a raw cl_mem wrapped with a shape: the same check, against that buffer's size
    for kw in (dict(shape=(B, HKV, SKV + 1, D)), dict(shape=(B, HKV, SKV, D), offset=1),
               dict(shape=(1, 1, SKV, D), strides=(0, 0, -D))):
        with pytest.raises(ValueError, match="wrap"):
            ctx.wrap(t.cl_mem, dtype="f32", **kw)
    w = ctx.wrap(t.cl_mem, shape=(B, HKV, SKV, D), dtype="f32")
    assert np.array_equal(w.numpy(), arrays["k"])
    assert ctx.wrap(t.cl_mem, shape=(1, 1, 2 * B * HKV * SKV, D // 2), dtype="f16").shape[2] == 2 * B * HKV * SKV


def test_per_head_lists_of_python_ints(ctx, arrays):
    """sinks and alibi_slopes given as lists of Python ints are per-head values, taken as floats (a
    numpy integer array is refused like any other integer data)."""
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    want = ctx.attention(q, k, v, sinks=np.zeros(HQ, np.float32), alibi_slopes=np.ones(HQ, np.float32))
    np.testing.assert_array_equal(ctx.attention(q, k, v, sinks=[0] * HQ, alibi_slopes=[1] * HQ), want)


def test_device_tensor_fill_and_to_device(ctx, arrays):
    """An 'i32' tensor's fill takes integers only; to_device of a device tensor with another dtype
    is refused (it would be returned unconverted)."""
    t = ctx.to_device(np.array([3, 4], np.int32))
    with pytest.raises(ValueError, match="fill"):
        t.fill(1.5)
    with pytest.raises(ValueError, match="int32"):
        t.fill(2**31)
    np.testing.assert_array_equal(t.numpy(), [3, 4])
    np.testing.assert_array_equal(t.fill(7).numpy(), [7, 7])
    f = ctx.to_device(arrays["k"])
    assert ctx.to_device(f) is f and ctx.to_device(f, "f32") is f
    with pytest.raises(ValueError, match="already on the device as f32"):
        ctx.to_device(f, "f16")
