"""A float64 numpy reference of clattn's operations, written from include/clattn.h and
docs/variants.md (not from the kernels): visibility rules, the logit steps in their order (scale,
softcap, additive mask, ALiBi, score_mod), sinks in
the denominator, empty rows giving 0 and LSE -inf (or the sink)."""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import numpy as np

NEG_INF = -np.inf


def _broadcast_get(a: Optional[np.ndarray], b: int, h: int) -> Optional[np.ndarray]:
    """The [Sq|1][Skv] slice of a [B|1][H|1][Sq|1][Skv] array for batch b, head h."""
    if a is None:
        return None
    return a[b if a.shape[0] > 1 else 0, h if a.shape[1] > 1 else 0]


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = False, scale: float = 0.0,
              mask: Optional[np.ndarray] = None, kv_lengths: Optional[Sequence[int]] = None,
              window: Optional[Tuple[Optional[int], Optional[int]]] = None, chunk: int = 0,
              softcap: float = 0.0, sinks: Optional[np.ndarray] = None,
              alibi_slopes: Optional[np.ndarray] = None,
              score_mod: Optional[Callable[[np.ndarray, int, int, np.ndarray, np.ndarray], np.ndarray]] = None,
              mask_mod: Optional[Callable[[int, int, np.ndarray, np.ndarray], np.ndarray]] = None,
              scores_only: bool = False):
    """Returns (out [B][Hq][Sq][Dv], lse [B][Hq][Sq][1], probabilities [B][Hq][Sq][Skv]) in
    float64, or the logits [B][Hq][Sq][Skv] (hidden keys -inf) with scores_only.

    score_mod(x, b, h, p, j) and mask_mod(b, h, p, j) take numpy grids of positions (p the
    diagonal position of each row, j each key) and return the modified logits / visibility."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    B, Hq, Sq, D = q.shape
    Hkv, Skv, Dv = k.shape[1], k.shape[2], v.shape[3]
    group = Hq // Hkv
    if scale == 0.0:
        scale = 1.0 / np.sqrt(D)
    mask = None if mask is None else np.asarray(mask, dtype=np.float64)
    sinks = None if sinks is None else np.asarray(sinks, dtype=np.float64).reshape(-1)
    slopes = None
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, dtype=np.float64)
        slopes = slopes.reshape(1, -1) if slopes.ndim == 1 else slopes.reshape(slopes.shape[0], slopes.shape[1])
    out = np.zeros((B, Hq, Sq, Dv))
    lse = np.zeros((B, Hq, Sq, 1))
    probs = np.zeros((B, Hq, Sq, Skv))
    logits_all = np.zeros((B, Hq, Sq, Skv))
    j = np.arange(Skv)[None, :]
    for b in range(B):
        L = Skv if kv_lengths is None else int(min(max(kv_lengths[b], 0), Skv))
        p = (np.arange(Sq) + L - Sq)[:, None]
        vis = np.broadcast_to(j < L, (Sq, Skv)).copy()
        if causal:
            vis &= j <= p
        if window is not None:
            left, right = window
            if left is not None and left >= 0:
                vis &= j >= p - left
            if right is not None and right >= 0:
                vis &= j <= p + right
        if chunk:
            vis &= (j // chunk) == (p // chunk)
        for h in range(Hq):
            hv = h // group
            vh = vis.copy()
            if mask_mod is not None:
                vh &= np.asarray(mask_mod(b, h, p, j), dtype=bool)
            m = _broadcast_get(mask, b, h)
            if m is not None:
                vh &= np.broadcast_to(m, (Sq, Skv)) != NEG_INF
            # the logit steps in the header's order: scale, softcap, mask, ALiBi, score_mod
            x = scale * (q[b, h] @ k[b, hv].T)
            if softcap:
                x = softcap * np.tanh(x / softcap)
            if m is not None:
                with np.errstate(invalid="ignore"):
                    x = x + np.where(np.broadcast_to(m, (Sq, Skv)) == NEG_INF, 0.0, m)
            if slopes is not None:
                x = x - slopes[b if slopes.shape[0] > 1 else 0, h] * np.abs(p - j)
            if score_mod is not None:
                x = score_mod(x, b, h, np.broadcast_to(p, (Sq, Skv)), np.broadcast_to(j, (Sq, Skv)))
            x = np.where(vh, x, NEG_INF)
            logits_all[b, h] = x
            s = NEG_INF if sinks is None else sinks[h]
            with np.errstate(invalid="ignore", divide="ignore"):
                M = np.maximum(np.max(x, axis=1, initial=NEG_INF), s)[:, None]
                e = np.where(vh, np.exp(x - np.where(np.isfinite(M), M, 0.0)), 0.0)
                den = e.sum(axis=1, keepdims=True) + (np.exp(s - M) if np.isfinite(s) else 0.0)
                P = np.where(den > 0, e / np.where(den > 0, den, 1.0), 0.0)
                l = np.where(den > 0, M + np.log(np.where(den > 0, den, 1.0)), NEG_INF)
            out[b, h] = P @ v[b, hv]
            lse[b, h] = l
            probs[b, h] = P
    if scores_only:
        return logits_all
    return out, lse, probs


def softmax(x: np.ndarray, *, scale: float = 0.0, causal: bool = False, mask: Optional[np.ndarray] = None,
            kv_lengths: Optional[Sequence[int]] = None) -> np.ndarray:
    """Row softmax of scale·x + mask over the last axis (scale 0 means 1); hidden entries 0."""
    x = np.asarray(x, dtype=np.float64)
    B, H, R, C = x.shape
    s = 1.0 if scale == 0.0 else scale
    out = np.zeros_like(x)
    j = np.arange(C)[None, :]
    for b in range(B):
        L = C if kv_lengths is None else int(min(max(kv_lengths[b], 0), C))
        vis = np.broadcast_to(j < L, (R, C)).copy()
        if causal:
            vis &= j <= (np.arange(R) + L - R)[:, None]
        for h in range(H):
            y = s * x[b, h]
            m = _broadcast_get(None if mask is None else np.asarray(mask, dtype=np.float64), b, h)
            vh = vis.copy()
            if m is not None:
                vh &= np.broadcast_to(m, (R, C)) != NEG_INF
                y = y + np.where(np.broadcast_to(m, (R, C)) == NEG_INF, 0.0, m)
            y = np.where(vh, y, NEG_INF)
            M = np.max(y, axis=1, initial=NEG_INF, keepdims=True)
            e = np.where(vh, np.exp(y - np.where(np.isfinite(M), M, 0.0)), 0.0)
            den = e.sum(axis=1, keepdims=True)
            out[b, h] = np.where(den > 0, e / np.where(den > 0, den, 1.0), 0.0)
    return out


def alibi_slopes(heads: int, max_bias: float) -> np.ndarray:
    """BLOOM's / ggml's ALiBi slopes (docs/variants.md)."""
    n = 2 ** int(np.floor(np.log2(heads)))
    m0 = 2.0 ** (-max_bias / n)
    m1 = 2.0 ** (-max_bias / (2 * n))
    return np.array([m0 ** (h + 1) if h < n else m1 ** (2 * (h - n) + 1) for h in range(heads)])


def assert_allclose(got: np.ndarray, want: np.ndarray, atol: float, rtol: float = 0.0, what: str = "") -> None:
    """|got - want| <= atol + rtol*|want| everywhere (equal infinities pass); reports the first bad index."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    same_inf = np.isinf(got) & np.isinf(want) & (np.sign(got) == np.sign(want))
    with np.errstate(invalid="ignore"):
        bad = ~same_inf & ~(np.abs(got - want) <= atol + rtol * np.abs(want))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} values off; first at {idx}: "
                             f"got {got[idx]!r}, want {want[idx]!r} (atol {atol}, rtol {rtol})")


def randn(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    """Standard normal float32 values (times scale), from a fixed-seed generator."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)
