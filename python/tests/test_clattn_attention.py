"""attention() against the float64 reference: plain, causal, grouped-query, key lengths, masks,
dtypes, LSE, probabilities, every variant, and the device-tensor paths (views, growing KV cache).

Shapes are shared between tests so that PoCL compiles each kernel configuration once (head_dim 16,
head_dim_v 16 or 8)."""

from __future__ import annotations

import numpy as np
import pytest
import clattn_reference as ref
from clattn_reference import randn

import clattn

B, HQ, HKV, SQ, SKV, D = 2, 4, 2, 24, 40, 16
TOL = {"f32": 1e-4, "f16": 3e-3, "bf16": 2.5e-2}


def qkv(rng, sq=SQ, skv=SKV, d=D, dv=D, hq=HQ, hkv=HKV, b=B):
    return randn(rng, b, hq, sq, d), randn(rng, b, hkv, skv, d), randn(rng, b, hkv, skv, dv)


def stored(a, dtype):
    """The values the device holds for a float32 array stored as dtype."""
    if dtype == "f16":
        return a.astype(np.float16).astype(np.float64)
    if dtype == "bf16":
        return clattn.from_bf16(clattn.to_bf16(a)).astype(np.float64)
    return a.astype(np.float64)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_gqa_prefill_with_lse(ctx, rng, causal):
    q, k, v = qkv(rng)
    out, lse = ctx.attention(q, k, v, causal=causal, lse=True)
    want, wlse, _ = ref.attention(q, k, v, causal=causal)
    assert out.dtype == np.float32 and out.shape == (B, HQ, SQ, D)
    ref.assert_allclose(out, want, TOL["f32"], what="out")
    ref.assert_allclose(lse, wlse, 1e-4, 1e-5, what="lse")


def test_head_dim_v_and_scale(ctx, rng):
    q, k, v = qkv(rng, dv=8)
    out = ctx.attention(q, k, v, scale=0.3, causal=True)
    ref.assert_allclose(out, ref.attention(q, k, v, scale=0.3, causal=True)[0], TOL["f32"], what="Dv 8")


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_storage_dtypes(ctx, rng, dtype):
    q, k, v = qkv(rng)
    out = ctx.attention(q, k, v, causal=True, dtype=dtype)
    assert out.dtype == (np.float16 if dtype == "f16" else np.float32)
    want = ref.attention(stored(q, dtype), stored(k, dtype), stored(v, dtype), causal=True)[0]
    ref.assert_allclose(out, want, TOL[dtype], TOL[dtype], what=dtype)


def test_f16_arrays_select_f16(ctx, rng):
    q, k, v = (a.astype(np.float16) for a in qkv(rng))
    out = ctx.attention(q, k, v, causal=True)
    assert out.dtype == np.float16
    ref.assert_allclose(out, ref.attention(q, k, v, causal=True)[0], TOL["f16"], TOL["f16"], what="f16 in")


def test_kv_lengths_and_mask(ctx, rng):
    q, k, v = qkv(rng)
    mask = randn(rng, 1, 1, SQ, SKV, scale=0.5)
    mask[..., 3] = -np.inf
    mask[0, 0, 5, :] = -np.inf  # a fully hidden row: 0 and LSE -inf
    kvl = [29, 40]
    out, lse = ctx.attention(q, k, v, causal=True, mask=mask, kv_lengths=kvl, lse=True)
    want, wlse, _ = ref.attention(q, k, v, causal=True, mask=mask, kv_lengths=kvl)
    ref.assert_allclose(out, want, TOL["f32"], what="out")
    ref.assert_allclose(lse, wlse, 1e-4, 1e-5, what="lse")
    assert np.all(out[:, :, 5] == 0) and np.all(np.isneginf(lse[:, :, 5]))


def test_decode_kv_lengths(ctx, rng):
    q, k, v = qkv(rng, sq=1, skv=64)
    kvl = np.array([17, 64], dtype=np.int32)
    out, lse = ctx.attention(q, k, v, kv_lengths=kvl, lse=True)
    want, wlse, _ = ref.attention(q, k, v, kv_lengths=kvl)
    ref.assert_allclose(out, want, TOL["f32"], what="decode")
    ref.assert_allclose(lse, wlse, 1e-4, 1e-5, what="decode lse")


def test_unfused_probabilities(ctx, rng):
    q, k, v = qkv(rng)
    out, lse, p = ctx.attention(q, k, v, causal=True, lse=True, probabilities=True)
    want, wlse, wp = ref.attention(q, k, v, causal=True)
    ref.assert_allclose(out, want, TOL["f32"], what="out")
    ref.assert_allclose(lse, wlse, 1e-4, 1e-5, what="lse")
    ref.assert_allclose(p, wp, 1e-5, what="probabilities")
    out2 = ctx.attention(q, k, v, causal=True, algorithm="unfused")
    ref.assert_allclose(out2, want, TOL["f32"], what="unfused")


def test_window_and_chunk(ctx, rng):
    q, k, v = qkv(rng)
    for kw in (dict(window=(7, 0), causal=True), dict(window=(5, 3)), dict(window=(None, 2)),
               dict(chunk=8, causal=True)):
        out = ctx.attention(q, k, v, **kw)
        ref.assert_allclose(out, ref.attention(q, k, v, **kw)[0], TOL["f32"], what=str(kw))


def test_softcap_sinks_alibi(ctx, rng):
    q, k, v = qkv(rng)
    q *= 3.0
    sinks = np.array([0.5, -np.inf, 2.0, 1.0], dtype=np.float32)
    slopes = clattn.alibi_slopes(HQ, 8.0)
    kw = dict(causal=True, softcap=2.5, sinks=sinks, alibi_slopes=slopes, kv_lengths=[0, 33])
    out, lse = ctx.attention(q, k, v, lse=True, **kw)
    want, wlse, _ = ref.attention(q, k, v, **kw)
    ref.assert_allclose(out, want, TOL["f32"], what="out")
    ref.assert_allclose(lse, wlse, 1e-4, 1e-5, what="lse")
    # batch 0 has no visible key: o = 0 and LSE = the sink (-inf where there is none)
    assert np.all(out[0] == 0)
    np.testing.assert_allclose(lse[0, :, 0, 0], sinks, rtol=1e-6)


# nonlinear, so that its place after the mask and ALiBi matters
SCORE_MOD = ("float score_mod(float s, int b, int h, int q, int k)"
             "{ return 3.0f * tanh(s / 3.0f) - 0.05f * (float)(h + 1) * (float)abs(q - k); }")
MASK_MOD = "int mask_mod(int b, int h, int q, int k) { return (q / 8 == k / 8) || ((k & 1) == b); }"


def test_score_mod_and_mask_mod(ctx, rng):
    q, k, v = qkv(rng)

    def smod(x, b, h, p, j):
        return 3.0 * np.tanh(x / 3.0) - 0.05 * (h + 1) * np.abs(p - j)

    def mmod(b, h, p, j):
        return (p // 8 == j // 8) | ((j & 1) == b)

    mask = randn(rng, 1, 1, SQ, SKV)
    kw = dict(causal=True, mask=mask, alibi_slopes=clattn.alibi_slopes(HQ, 4.0))
    out = ctx.attention(q, k, v, score_mod=SCORE_MOD, mask_mod=MASK_MOD, **kw)
    want = ref.attention(q, k, v, score_mod=smod, mask_mod=mmod, **kw)[0]
    ref.assert_allclose(out, want, TOL["f32"], what="mods")


def test_device_tensors_and_out(ctx, rng):
    q, k, v = qkv(rng)
    tq, tk, tv = ctx.to_device(q), ctx.to_device(k), ctx.to_device(v)
    assert isinstance(tq, clattn.DeviceTensor) and tq.shape == q.shape and tq.dtype == "f32"
    t_out = ctx.attention(tq, tk, tv, causal=True)
    assert isinstance(t_out, clattn.DeviceTensor)
    want = ref.attention(q, k, v, causal=True)[0]
    ref.assert_allclose(t_out.numpy(), want, TOL["f32"], what="device")
    dst = ctx.empty(q.shape, "f32")
    res, t_lse = ctx.attention(tq, tk, tv, causal=True, out=dst, lse=True)
    assert res is dst and t_lse.shape == (B, HQ, SQ, 1)
    ref.assert_allclose(dst.numpy(), want, TOL["f32"], what="out=")
    host = np.empty_like(q)
    assert ctx.attention(q, k, v, causal=True, out=host) is host
    ref.assert_allclose(host, want, TOL["f32"], what="numpy out=")


def test_bshd_views(ctx, rng):
    """A [B][S][H][D] buffer seen as [B][H][S][D] through strides (clattn_tensor_bshd)."""
    q, k, v = qkv(rng)
    def bshd(a):
        b, h, s, d = a.shape
        t = ctx.to_device(np.ascontiguousarray(a.transpose(0, 2, 1, 3)))
        return t.view(offset=0, shape=(b, h, s, d), strides=(s * h * d, d, h * d))
    tq, tk, tv = bshd(q), bshd(k), bshd(v)
    np.testing.assert_array_equal(tq.numpy(), q)
    out = ctx.attention(tq, tk, tv, causal=True).numpy()
    ref.assert_allclose(out, ref.attention(q, k, v, causal=True)[0], TOL["f32"], what="bshd")
    tq.write(q[::-1].copy())  # a strided write goes through the rect path
    np.testing.assert_array_equal(tq.numpy(), q[::-1])


def test_growing_kv_cache(ctx, rng):
    """Prefill 20 keys, then decode one token at a time from a cache of capacity 40, the keys
    written with write_seq and seen through seq(0, n) views or kv_lengths."""
    cap, n0 = SKV, 20
    q, k, v = qkv(rng, sq=1, skv=cap, b=1)
    kc, vc = ctx.empty((1, HKV, cap, D)), ctx.empty((1, HKV, cap, D))
    kc.write_seq(k[:, :, :n0], 0)
    vc.write_seq(v[:, :, :n0], 0)
    for n in range(n0, n0 + 3):
        kc.write_seq(k[:, :, n:n + 1], n)
        vc.write_seq(v[:, :, n:n + 1], n)
        want = ref.attention(q, k[:, :, :n + 1], v[:, :, :n + 1], causal=True)[0]
        got = ctx.attention(ctx.to_device(q), kc.seq(0, n + 1), vc.seq(0, n + 1), causal=True).numpy()
        ref.assert_allclose(got, want, TOL["f32"], what=f"view n={n + 1}")
        got2 = ctx.attention(q, kc, vc, causal=True, kv_lengths=[n + 1])
        ref.assert_allclose(got2, want, TOL["f32"], what=f"kv_lengths n={n + 1}")
    np.testing.assert_array_equal(kc.seq(0, n0 + 3).numpy(), k[:, :, :n0 + 3])


def test_bf16_tensor_roundtrip(ctx, rng):
    a = randn(rng, 1, 2, 3, 4)
    t = ctx.to_device(a, "bf16")
    assert t.dtype == "bf16"
    np.testing.assert_array_equal(t.numpy(raw=True), clattn.to_bf16(a))
    np.testing.assert_array_equal(t.numpy(), clattn.from_bf16(clattn.to_bf16(a)))
    assert np.all(np.abs(t.numpy() - a) <= np.abs(a) * 2.0 ** -8)
    # round to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 and goes to 1 (even)
    ties = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, np.inf, -np.inf], dtype=np.float32)
    np.testing.assert_array_equal(clattn.from_bf16(clattn.to_bf16(ties)), [1.0, 1 + 2.0 ** -6, np.inf, -np.inf])
    assert np.isnan(clattn.from_bf16(clattn.to_bf16(np.array([np.nan], np.float32))))[0]


def test_attention_host(ctx, rng):
    q, k, v = qkv(rng)
    out, lse = ctx.attention_host(q, k, v, causal=True, lse=True)
    want, wlse, _ = ref.attention(q, k, v, causal=True)
    ref.assert_allclose(out, want, TOL["f32"], what="host")
    ref.assert_allclose(lse, wlse[..., 0], 1e-4, 1e-5, what="host lse")
