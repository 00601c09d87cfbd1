"""scores, softmax, merge, ALiBi slopes, devices, parameters, reports and errors."""

from __future__ import annotations

import numpy as np
import pytest
import clattn_reference as ref
from clattn_reference import randn
from test_clattn_attention import B, HQ, SKV, SQ, qkv

import clattn


def test_scores(ctx, rng):
    q, k, _ = qkv(rng)
    kvl = [31, 40]
    got = ctx.scores(q, k, causal=True, kv_lengths=kvl, scale=0.5)
    want = ref.attention(q, k, k, causal=True, kv_lengths=kvl, scale=0.5, scores_only=True)
    assert got.shape == (B, HQ, SQ, SKV) and got.dtype == np.float32
    ref.assert_allclose(got, want, 1e-4, 1e-5, what="scores")


def test_scores_variants(ctx, rng):
    q, k, _ = qkv(rng)
    slopes = clattn.alibi_slopes(HQ, 8.0)
    kw = dict(causal=True, window=(6, 0), softcap=2.0, alibi_slopes=slopes)
    got = ctx.scores(q, k, **kw)
    ref.assert_allclose(got, ref.attention(q, k, k, scores_only=True, **kw), 1e-4, 1e-5, what="scores variants")


def test_softmax(ctx, rng):
    x = randn(rng, B, HQ, SQ, SKV, scale=3.0)
    mask = randn(rng, 1, HQ, 1, SKV)
    mask[..., 0] = -np.inf
    got = ctx.softmax(x, scale=0.7, causal=True, mask=mask, kv_lengths=[30, 40])
    want = ref.softmax(x, scale=0.7, causal=True, mask=mask, kv_lengths=[30, 40])
    ref.assert_allclose(got, want, 1e-5, what="softmax")
    t = ctx.to_device(x)
    assert ctx.softmax(t, out=t) is t  # in place
    ref.assert_allclose(t.numpy(), ref.softmax(x), 1e-5, what="in place")


def test_merge_matches_whole(ctx, rng):
    """Attention split over two disjoint key ranges, merged by LSE, equals the whole."""
    q, k, v = qkv(rng, sq=4)
    whole, wlse, _ = ref.attention(q, k, v)
    cut = 13
    o1, l1 = ctx.attention(q, k[:, :, :cut], v[:, :, :cut], lse=True)
    o2, l2 = ctx.attention(q, k[:, :, cut:], v[:, :, cut:], lse=True)
    out, lse = ctx.merge([o1, o2], [l1, l2])
    ref.assert_allclose(out, whole, 1e-4, what="merged")
    ref.assert_allclose(lse, wlse, 1e-4, 1e-5, what="merged lse")
    # device tensors, 3-D lse arrays accepted for numpy parts
    t_out, t_lse = ctx.merge([ctx.to_device(o1), ctx.to_device(o2)], [ctx.to_device(l1), ctx.to_device(l2)])
    assert isinstance(t_out, clattn.DeviceTensor)
    ref.assert_allclose(t_out.numpy(), whole, 1e-4, what="merged device")
    only = ctx.merge([o1, o2], [l1[..., 0], l2[..., 0]], lse=False)
    ref.assert_allclose(only, whole, 1e-4, what="merged 3-D lse")


def test_alibi_slopes():
    for h, bias in ((8, 8.0), (12, 8.0), (5, 4.0)):
        np.testing.assert_allclose(clattn.alibi_slopes(h, bias), ref.alibi_slopes(h, bias), rtol=1e-6)
    with pytest.raises(clattn.ClattnError) as e:
        clattn.alibi_slopes(0, 8.0)
    assert e.value.status == "CLATTN_INVALID_ARGUMENT" and e.value.code == clattn.Status.INVALID_ARGUMENT
    assert str(e.value)


def test_devices_and_selection(ctx):
    devs = clattn.devices()
    assert devs and all(":" in d.spec for d in devs)
    assert sum(d.default for d in devs) == 1
    default = [d for d in devs if d.default][0]
    sel = clattn.select_device()
    assert sel == default.spec and sel.name == default.name and sel.why
    assert clattn.select_device(sel) == sel
    assert ctx.device_spec == sel and ctx.device_name == sel.name
    with pytest.raises(clattn.ClattnError) as e:
        clattn.select_device("no-such-device-xyz")
    assert e.value.status == "CLATTN_NO_DEVICE" and "no-such-device-xyz" in str(e.value)
    with pytest.raises(clattn.ClattnError) as e:
        clattn.Context("no-such-device-xyz")
    assert e.value.status == "CLATTN_NO_DEVICE"


def test_version():
    v = clattn.version()
    assert v.count(".") == 2
    major, minor, patch = (int(x) for x in v.split("."))
    assert clattn.version_number() == major * 10000 + minor * 100 + patch


def test_reports_and_stats(ctx):
    assert ctx.matrix_report and isinstance(ctx.cache_report, str) and isinstance(ctx.tuning_report, str)
    assert ctx.device_key.count(":") >= 3
    s = ctx.program_stats()
    assert s.builds + s.disk_hits + s.memory_hits > 0  # earlier tests ran kernels
    try:
        assert ctx.tuning_path.endswith(".tuning")
    except clattn.ClattnError as e:  # no tuning directory
        assert e.status == "CLATTN_IO_ERROR"


def test_params_roundtrip():
    with clattn.Context() as c:
        p = c.get_params("softmax", seq_q=SQ, seq_kv=SKV)
        assert list(p.values) == ["WG", "ROWS"] and p.source
        c.set_params("softmax", {"ROWS": 1})
        q = c.get_params("softmax", seq_q=SQ, seq_kv=SKV)
        assert q.source == "override" and q.values["ROWS"] == 1 and q.values["WG"] == p.values["WG"]
        c.set_params("softmax", list(p.values.values()))
        assert c.get_params("softmax").values == p.values
        c.set_params("softmax", None)
        assert c.get_params("softmax", seq_q=SQ, seq_kv=SKV).source == p.source
        d = c.get_params("decode", seq_q=1, seq_kv=4096, heads_q=8, heads_kv=2)
        assert d.kernel in ("tiled", "direct", "rows", "rows_sync", "lanes", "lanes_local")
        with pytest.raises(clattn.ClattnError) as e:
            c.set_params("softmax", [1])  # wrong count
        assert e.value.status == "CLATTN_INVALID_ARGUMENT"
        with pytest.raises(ValueError):
            c.get_params("nonsense")


def test_invalid_argument_message(ctx, rng):
    q, k, v = qkv(rng, hkv=3, hq=4)  # 3 does not divide 4
    with pytest.raises(clattn.ClattnError) as e:
        ctx.attention(q, k, v)
    assert e.value.status == "CLATTN_INVALID_ARGUMENT" and "heads" in str(e.value)
    q, k, v = qkv(rng)
    with pytest.raises(clattn.ClattnError) as e:
        ctx.attention(q, k, v, softcap=-1.0)
    assert "softcap" in str(e.value)
    with pytest.raises(clattn.ClattnError) as e:
        ctx.attention(q, k, v[:, :, :, :5].copy(), head_dim_v=8)
    assert e.value.status == "CLATTN_INVALID_ARGUMENT"


def test_build_failed_has_log(ctx, rng):
    q, k, v = qkv(rng)
    bad = "float score_mod(float s, int b, int h, int q, int k) { return s + no_such_name; }"
    with pytest.raises(clattn.ClattnError) as e:
        ctx.attention(q, k, v, score_mod=bad)
    assert e.value.status == "CLATTN_BUILD_FAILED" and e.value.code == 4
    assert "no_such_name" in e.value.build_log
    # the context stays usable
    ctx.attention(q, k, v)


def test_closed_context():
    c = clattn.Context()
    t = c.empty((1, 1, 2, 4))
    c.close()
    c.close()  # twice is fine
    with pytest.raises(ValueError):
        c.attention(np.zeros((1, 1, 2, 4), np.float32), np.zeros((1, 1, 2, 4), np.float32),
                    np.zeros((1, 1, 2, 4), np.float32))
    with pytest.raises(ValueError):
        t.numpy()
    t.release()


def test_python_side_errors(ctx):
    with pytest.raises(ValueError):
        ctx.attention(np.zeros((2, 4, 8), np.float32), np.zeros((2, 4, 8), np.float32),
                      np.zeros((2, 4, 8), np.float32))
    with pytest.raises(ValueError):
        ctx.to_device(np.zeros(4, np.uint16))  # bf16 bits need dtype="bf16"
    with pytest.raises(ValueError):
        ctx.empty((1, 1, 4, 4), "f64")
    t = ctx.empty((1, 1, 4, 4))
    with pytest.raises(ValueError):
        t.write(np.zeros((1, 1, 4, 5)))
    with pytest.raises(ValueError):
        t.write_seq(np.zeros((1, 1, 2, 4)), 3)
    with pytest.raises(ValueError):
        ctx.attention(t, t, t, algorithm="fastest")


def test_released_tensor_raises(ctx, rng):
    """A released tensor, or a view of one, raises ValueError instead of handing OpenCL a freed
    buffer (which crashed the interpreter in a call)."""
    q, k, v = qkv(rng)
    t = ctx.to_device(k)
    view = t.seq(0, SKV // 2)
    t.release()
    for bad in (t, view):
        with pytest.raises(ValueError, match="released"):
            ctx.attention(q, bad, bad)
        with pytest.raises(ValueError, match="released"):
            bad.numpy()
        with pytest.raises(ValueError, match="released"):
            bad.write(np.zeros(bad.shape, np.float32))
    lens = ctx.to_device(np.full(B, SKV // 2, np.int32), "i32")
    lens.release()
    with pytest.raises(ValueError, match="released"):
        ctx.attention(q, k, v, kv_lengths=lens)


def test_kv_lengths_integers_clamped(ctx, rng):
    """kv_lengths past int32 clamp as the library clamps (to seq_kv, or 0), never wrap; floats
    are refused rather than truncated."""
    q, k, v = qkv(rng, b=1)
    full = ctx.attention(q, k, v)
    for big in (2**31, 2**32 + 3, 2**70, np.uint64(2**63 + 5)):
        ref.assert_allclose(ctx.attention(q, k, v, kv_lengths=[big]), full, 0.0, what=f"kv_lengths {big}")
    empty = ctx.attention(q, k, v, kv_lengths=[-2**32 + 5])
    assert np.all(empty == 0.0)
    for bad in ([5.7], [True], ["3"]):
        with pytest.raises(ValueError, match="integers"):
            ctx.attention(q, k, v, kv_lengths=bad)


def test_integer_inputs_and_bad_window_raise_valueerror(ctx, rng):
    q, k, v = qkv(rng)
    for dt in (np.int32, np.int64):
        with pytest.raises(ValueError, match="kv_lengths only"):
            ctx.attention(q.astype(dt), k, v)
    for w in (5, (1, 2, 3), (1.5, 0), "ab"):
        with pytest.raises(ValueError, match="window"):
            ctx.attention(q, k, v, window=w)


def test_uint16_attention_input_asks_for_bf16(ctx, rng):
    q, k, v = qkv(rng)
    with pytest.raises(ValueError, match="bf16"):
        ctx.attention(q.view(np.uint16)[..., ::2].copy(), k, v)
