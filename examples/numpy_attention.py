"""What the examples compare clattn with: its attention in numpy, in the inputs' precision."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = False,
                    kv_lengths: Optional[Sequence[int]] = None, scale: float = 0.0) -> np.ndarray:
    """clattn's attention in numpy, in the inputs' precision: q [B][Hq][Sq][D], k, v
    [B][Hkv][Skv][D], query head h reading kv head h // (Hq / Hkv); causal bottom-right aligned
    (row i sees key j iff j <= i + L - Sq, L the batch's keys); kv_lengths hides keys past L."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    scale = float(scale or 1.0 / np.sqrt(D))  # a Python float keeps float32 inputs float32
    qg = q.reshape(B, Hkv, g * Sq, D)                         # a kv head's query rows together
    s = (qg @ k.swapaxes(-1, -2)) * scale                     # [B][Hkv][g Sq][Skv] (BLAS)
    s = s.reshape(B, Hkv, g, Sq, Skv)
    j = np.arange(Skv)
    for b in range(B):
        L = Skv if kv_lengths is None else int(min(max(kv_lengths[b], 0), Skv))
        hide = np.broadcast_to(j >= L, (Sq, Skv))
        if causal:
            hide = hide | (j[None, :] > np.arange(Sq)[:, None] + (L - Sq))
        s[b][:, :, hide] = -np.inf
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    den = p.sum(axis=-1, keepdims=True)
    p = np.divide(p, den, out=np.zeros_like(p), where=den > 0)   # a row with no key gives 0
    o = p.reshape(B, Hkv, g * Sq, Skv) @ v
    return o.reshape(B, Hq, Sq, v.shape[3])
