"""Training from Python: attention_backward's gradients against a float64 numpy backward pass
written here from the definition (plain, causal, grouped-query, a mask with -inf entries, sinks,
dropout with the multipliers dropout_mask gives, slice offsets), central differences of attention itself,
bitwise repeatability and the device-tensor path, dropout_mask against the header's Philox rule,
and Philox-4x32-10's known answers.

Shapes are test_clattn_attention's (head_dim 16), so PoCL compiles few new kernel configurations."""

from __future__ import annotations

import numpy as np
import pytest
import clattn_reference as ref
from clattn_reference import randn

import clattn

B, HQ, HKV, SQ, SKV, D = 2, 4, 2, 24, 40, 16
# float32 arithmetic on O(1) values against float64: the forward's tolerance, a little wider for
# gradients, which sum over a row's keys or a key's rows
ATOL, RTOL = 2e-4, 1e-4


def qkv(rng, hq=HQ, hkv=HKV):
    return randn(rng, B, hq, SQ, D), randn(rng, B, hkv, SKV, D), randn(rng, B, hkv, SKV, D)


def reference_backward(q, k, v, dout, *, z=None, scale=0.0, sinks=None, **opts):
    """float64 forward and backward of attention, with dropout multipliers z (same shape as the
    probabilities; None: no dropout): o = (P∘z)·V, P the softmax of the logits (ref.attention
    gives it, sinks in its denominator). Backward from the definition:
        dV = (P∘z)ᵀ·dO,  dP = (dO·Vᵀ)∘z,  dS = P∘(dP − rowsum(P∘dP)),
        dQ = scale·dS·K,  dK = scale·dSᵀ·Q,  d sink_h = −Σ_rows e^(s_h − lse)·rowsum(P∘dP),
    grouped-query heads summing into their kv head. Returns out, lse, dq, dk, dv, dsinks."""
    q, k, v, dout = (np.asarray(a, dtype=np.float64) for a in (q, k, v, dout))
    _, lse, P = ref.attention(q, k, v, scale=scale, sinks=sinks, **opts)
    scale = scale or 1.0 / np.sqrt(q.shape[3])
    group = q.shape[1] // k.shape[1]
    kx = np.repeat(k, group, axis=1)   # query head h reads kv head h // group
    vx = np.repeat(v, group, axis=1)
    Pz = P if z is None else P * z
    out = Pz @ vx
    dP = dout @ vx.transpose(0, 1, 3, 2)
    if z is not None:
        dP = dP * z
    Dsum = np.sum(P * dP, axis=3, keepdims=True)        # = rowsum(dO ∘ O)
    dS = P * (dP - Dsum)
    dq = scale * dS @ kx
    dkx = scale * dS.transpose(0, 1, 3, 2) @ q
    dvx = Pz.transpose(0, 1, 3, 2) @ dout

    def fold(a):  # sum each kv head's query heads
        return a.reshape(a.shape[0], k.shape[1], group, *a.shape[2:]).sum(axis=2)

    dsinks = None
    if sinks is not None:
        s = np.asarray(sinks, dtype=np.float64).reshape(1, -1, 1, 1)
        with np.errstate(invalid="ignore"):
            share = np.where(np.isneginf(lse), 0.0, np.exp(s - lse))
        dsinks = -np.sum(share * Dsum, axis=(0, 2, 3))
    return out, lse, dq, fold(dkx), fold(dvx), dsinks


def _mask(rng):
    m = randn(rng, 1, HQ, SQ, SKV, scale=0.5)
    m[..., 7] = -np.inf                 # a key nobody sees: its dk and dv are 0
    m[:, 1, 3, :] = -np.inf             # a row that sees nothing: its dq is 0
    m[:, :, 10, ::3] = -np.inf
    return m


CASES = {
    "plain": dict(hkv=HQ, opts={}),
    "causal": dict(hkv=HQ, opts=dict(causal=True)),
    "gqa_scale": dict(hkv=HKV, opts=dict(causal=True, scale=0.3)),
    "mask_inf": dict(hkv=HKV, opts=dict(kv_lengths=[33, 40]), mask=True),
    "sinks": dict(hkv=HKV, opts=dict(causal=True, sinks=np.array([0.5, -1.0, 2.0, -np.inf], np.float32))),
    # with a mask and slice offsets (which move causal's diagonal and the dropout rows and keys):
    # the kernel configuration of the tests below too, compiled once
    "dropout": dict(hkv=HKV, opts=dict(causal=True, q_offset=6, k_offset=2, dropout_p=0.2,
                                       dropout_seed=0x1234_5678_9ABC, dropout_offset=7), mask=True),
}
# the options of the tests after the table: "dropout"'s kernel configuration
TRAIN_OPTS = dict(causal=True, q_offset=6, k_offset=2, dropout_p=0.2)


def reference_opts(opts):
    """opts for reference_backward: no dropout options (z carries them), and slice offsets written
    as the mask they amount to: row i sees key j iff j <= i + SKV - SQ + q_offset - k_offset."""
    r = {n: val for n, val in opts.items() if not n.startswith("dropout_") and not n.endswith("_offset")}
    shift = opts.get("q_offset", 0) - opts.get("k_offset", 0)
    if shift and r.pop("causal", False):
        diag = np.arange(SQ)[:, None] + SKV - SQ + shift
        m = r.get("mask", np.zeros((1, 1, SQ, SKV), np.float32))
        r["mask"] = np.where(np.arange(SKV)[None, :] <= diag, m, -np.inf).astype(np.float32)
    return r


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_backward_matches_float64(ctx, rng, case):
    c = CASES[case]
    q, k, v = qkv(rng, hkv=c["hkv"])
    opts = dict(c["opts"])
    if c.get("mask"):
        opts["mask"] = _mask(rng)
    out, lse = ctx.attention(q, k, v, lse=True, **opts)
    dout = randn(rng, *out.shape)
    grads = ctx.attention_backward(q, k, v, out, dout, lse, **opts)

    z = None
    if opts.get("dropout_p"):
        drop = dict(p=opts["dropout_p"], seed=opts["dropout_seed"], offset=opts["dropout_offset"])
        z = ctx.dropout_mask(B, HQ, SQ, SKV, q_offset=opts["q_offset"], k_offset=opts["k_offset"], **drop)
        assert not np.array_equal(z, ctx.dropout_mask(B, HQ, SQ, SKV, **drop)), "offsets move the rows and keys"
    ref_opts = reference_opts(opts)
    want = reference_backward(q, k, v, dout, z=z, **ref_opts)
    ref.assert_allclose(out, want[0], ATOL, RTOL, what=f"{case} out")
    ref.assert_allclose(lse, want[1], ATOL, RTOL, what=f"{case} lse")
    assert len(grads) == (4 if "sinks" in opts else 3)
    for name, got, w in zip(("dq", "dk", "dv", "dsinks"), grads, want[2:]):
        assert got.dtype == np.float32 and got.shape == w.shape, name
        ref.assert_allclose(got, w, ATOL, RTOL, what=f"{case} {name}")
    if c.get("mask"):
        assert np.all(grads[0][:, 1, 3] == 0), "a row that sees no key has no gradient"
        assert np.all(grads[1][..., 7, :] == 0) and np.all(grads[2][..., 7, :] == 0), "a hidden key"
    if z is not None:
        # the same dropout decisions in both passes: without them the gradients are the wrong ones
        plain = reference_backward(q, k, v, dout, **ref_opts)
        assert np.abs(grads[2] - plain[4]).max() > 100 * ATOL


def test_finite_differences_of_attention(ctx, rng):
    """attention_backward's gradient of loss = Σ W∘out against central differences of attention
    itself, for a few elements of q, k and v (grouped-query, causal, slice offsets, a mask,
    dropout: the forward with a fixed dropout offset is a deterministic function of q, k and v)."""
    q, k, v = qkv(rng)
    opts = dict(TRAIN_OPTS, mask=_mask(rng), dropout_seed=99, dropout_offset=3)
    W = randn(rng, B, HQ, SQ, D)
    out, lse = ctx.attention(q, k, v, lse=True, **opts)
    grads = ctx.attention_backward(q, k, v, out, W, lse, **opts)
    eps = 1e-2   # float32 forward: rounding noise ~1e-6·|loss| / eps, truncation ~eps²
    picks = {0: [(0, 0, 5, 3), (1, 3, 23, 15), (1, 2, 10, 0)],
             1: [(0, 0, 0, 0), (1, 1, 39, 8), (0, 1, 12, 4)],
             2: [(0, 0, 0, 0), (1, 1, 20, 11), (0, 1, 33, 2)]}
    for which, idxs in picks.items():
        for idx in idxs:
            ins = [q.copy(), k.copy(), v.copy()]
            losses = []
            for sign in (1, -1):
                ins[which] = [q, k, v][which].copy()
                ins[which][idx] += sign * eps
                o = ctx.attention(*ins, **opts)
                losses.append(float(np.sum(W.astype(np.float64) * o)))
            fd = (losses[0] - losses[1]) / (2 * eps)
            got = float(grads[which][idx])
            assert abs(got - fd) <= 2e-3 + 2e-3 * abs(fd), f"{'qkv'[which]}{idx}: backward {got}, differences {fd}"


def test_bitwise_repeatable_and_device_tensors(ctx, rng):
    """The same call twice gives bitwise the same gradients; device tensors in give DeviceTensors
    out (written into given outputs), equal bitwise to the numpy path."""
    q, k, v = qkv(rng)
    opts = dict(TRAIN_OPTS, mask=_mask(rng), dropout_seed=5, dropout_offset=1)
    out, lse = ctx.attention(q, k, v, lse=True, **opts)
    dout = randn(rng, *out.shape)
    first = ctx.attention_backward(q, k, v, out, dout, lse, **opts)
    second = ctx.attention_backward(q, k, v, out, dout, lse, **opts)
    for a, b in zip(first, second):
        assert np.array_equal(a, b)

    tq, tk, tv = ctx.to_device(q), ctx.to_device(k), ctx.to_device(v)
    t_out, t_lse = ctx.attention(tq, tk, tv, lse=True, **opts)
    assert isinstance(t_lse, clattn.DeviceTensor) and t_lse.shape == (B, HQ, SQ, 1)
    t_dk = ctx.empty(k.shape)
    t_grads = ctx.attention_backward(tq, tk, tv, t_out, ctx.to_device(dout), t_lse, dk=t_dk, **opts)
    assert all(isinstance(t, clattn.DeviceTensor) for t in t_grads) and t_grads[1] is t_dk
    for a, t in zip(first, t_grads):
        assert np.array_equal(a, t.numpy())

    # numpy outputs are filled in place; a [B][Hq][Sq] LSE is taken as well as [..][1]
    dq = np.empty_like(q)
    got = ctx.attention_backward(q, k, v, out, dout, lse[..., 0], dq=dq, **opts)
    assert got[0] is dq and np.array_equal(dq, first[0])


def test_sinks_gradient_shapes_and_frozen_sinks(ctx, rng):
    q, k, v = qkv(rng)
    sinks = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    out, lse = ctx.attention(q, k, v, lse=True, sinks=sinks)
    dout = randn(rng, *out.shape)
    dq, dk, dv, ds = ctx.attention_backward(q, k, v, out, dout, lse, sinks=sinks)
    assert ds.shape == (HQ,), "dsinks comes back in the shape the sinks were given"
    ref.assert_allclose(ds, reference_backward(q, k, v, dout, sinks=sinks)[5], ATOL, RTOL, what="dsinks")
    ds4 = ctx.attention_backward(q, k, v, out, dout, lse, sinks=sinks.reshape(1, HQ, 1, 1))[3]
    assert ds4.shape == (1, HQ, 1, 1) and np.array_equal(ds4.reshape(-1), ds)
    frozen = ctx.attention_backward(q, k, v, out, dout, lse, sinks=sinks, dsinks=False)
    assert len(frozen) == 3 and np.array_equal(frozen[0], dq)


def test_f16_inputs_f32_gradients(ctx, rng):
    q, k, v = (a.astype(np.float16) for a in qkv(rng))
    out, lse = ctx.attention(q, k, v, causal=True, lse=True)
    assert out.dtype == np.float16
    dout = randn(rng, *out.shape)             # float32: kept as f32 storage
    grads = ctx.attention_backward(q, k, v, out, dout, lse, causal=True, grad_dtype="f32")
    want = reference_backward(q, k, v, dout, causal=True)
    for name, got, w in zip(("dq", "dk", "dv"), grads, want[2:5]):
        assert got.dtype == np.float32
        # out was rounded to f16, which D = rowsum(dO∘O) inherits
        ref.assert_allclose(got, w, 3e-3, 3e-3, what=f"f16 {name}")


def test_refusals(ctx, rng):
    q, k, v = qkv(rng)
    out, lse = ctx.attention(q, k, v, lse=True)
    smod = "float score_mod(float s, int b, int h, int q, int k) { return s * 0.5f; }"
    with pytest.raises(clattn.ClattnError) as e:
        ctx.attention_backward(q, k, v, out, out, lse, score_mod=smod)
    assert e.value.status == "CLATTN_UNSUPPORTED" and "score_mod" in str(e.value)
    with pytest.raises(clattn.ClattnError) as e:
        ctx.attention(q, k, v, dropout_p=1.0)
    assert e.value.status == "CLATTN_INVALID_ARGUMENT" and "dropout_p" in str(e.value)
    with pytest.raises(ValueError, match="dropout_seed"):
        ctx.attention(q, k, v, dropout_p=0.1, dropout_seed=-1)
    with pytest.raises(ValueError, match="dropout_offset"):
        ctx.attention(q, k, v, dropout_p=0.1, dropout_offset=1 << 32)
    with pytest.raises(ValueError, match="dsinks"):
        ctx.attention_backward(q, k, v, out, out, lse, dsinks=np.zeros(HQ, np.float32))
    with pytest.raises(clattn.ClattnError, match="dropout_p is 0"):
        ctx.dropout_mask(1, 1, 1, 1, p=0.0, seed=1)


def _philox_keep(seed, offset, p, b, h, hq, r, c):
    """The header's rule for one (row, key): Philox-4x32-10 with key (seed low, seed high) and
    counter (16·floor(c/128) + c mod 16, r, b·hq + h, offset); key c reads the 16-bit half
    floor(c/16) mod 2 of word floor(c/32) mod 4 and is kept iff it is >= round(p·65536)."""
    x = clattn.philox4x32_10([16 * (c // 128) + c % 16, r % (1 << 32), b * hq + h, offset],
                             [seed & 0xFFFFFFFF, seed >> 32])
    half = (x[(c // 32) % 4] >> (16 * ((c // 16) % 2))) & 0xFFFF
    return half >= min(int(np.floor(p * 65536 + 0.5)), 65535)


def test_dropout_mask_follows_the_philox_rule(ctx):
    seed, offset, p = 0xDEADBEEF_00C0FFEE, 41, 0.3
    b_, hq, sq, skv = 2, 3, 3, 70
    kvl, q_off, k_off = [70, 52], 5, 9
    m = ctx.dropout_mask(b_, hq, sq, skv, p=p, seed=seed, offset=offset, kv_lengths=kvl, q_offset=q_off,
                         k_offset=k_off)
    assert m.shape == (b_, hq, sq, skv) and m.dtype == np.float32
    scale = np.float32(1.0 / (1.0 - p))
    assert set(np.unique(m).tolist()) == {0.0, float(scale)}
    for b in range(b_):
        for h in range(hq):
            for i in range(sq):
                r = i + kvl[b] - sq + q_off          # p + k_offset, p the diagonal position
                want = [_philox_keep(seed, offset, p, b, h, hq, r, j + k_off) for j in range(skv)]
                assert np.array_equal(m[b, h, i] != 0, np.array(want)), (b, h, i)


def test_dropout_mask_rate_streams_and_outputs(ctx):
    m = ctx.dropout_mask(2, 4, 32, 64, p=0.25, seed=7, offset=0)
    assert abs(float(np.mean(m == 0)) - 0.25) < 0.03
    assert not np.array_equal(m, ctx.dropout_mask(2, 4, 32, 64, p=0.25, seed=7, offset=1))
    assert not np.array_equal(m, ctx.dropout_mask(2, 4, 32, 64, p=0.25, seed=8, offset=0))
    t = ctx.dropout_mask(2, 4, 32, 64, p=0.25, seed=7, offset=0, out=ctx.empty((2, 4, 32, 64)))
    assert isinstance(t, clattn.DeviceTensor) and np.array_equal(t.numpy(), m)
    host = np.empty((2, 4, 32, 64), np.float32)
    assert ctx.dropout_mask(2, 4, 32, 64, p=0.25, seed=7, offset=0, out=host) is host
    assert np.array_equal(host, m)


def test_philox_known_answers():
    """Random123's kat_vectors for philox4x32_10 (needs the library, not a device)."""
    assert clattn.philox4x32_10([0, 0, 0, 0], [0, 0]) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert clattn.philox4x32_10([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2) == (0x408F276D, 0x41C83B0E, 0xA20BC7C6,
                                                                         0x6D5451FD)
    with pytest.raises(ValueError):
        clattn.philox4x32_10([0, 0, 0], [0, 0])
    with pytest.raises(ValueError):
        clattn.philox4x32_10([0, 0, 0, 1 << 32], [0, 0])
