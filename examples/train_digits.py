#!/usr/bin/env python3
"""Train a small attention model with clattn's forward and backward passes, and the same model in
float64 numpy beside it.

Task: a sequence of 24 digits; say whether it holds more 3s than 7s (class 0), as many (1) or
fewer (2). Model: a digit embedding (10 x 32, nothing positional: counting ignores order), one
attention layer of 4 heads of 16 whose query is a learned vector per head (one query row,
"attention pooling") over keys and values projected from the embeddings, dropout on the attention
probabilities, an output projection to 3 logits, softmax cross-entropy, Adam.

The attention's forward (with its log-sum-exp) and backward run on clattn
(Context.attention(..., lse=True, dropout_p=...), Context.attention_backward); the projections,
the loss and Adam are float32 numpy. The twin is the same model in float64 numpy with its own
attention forward and backward, from the same initial weights, on the same batches, with the same
dropout decisions (clattn's Context.dropout_mask, which gives the multipliers the attention calls
draw). Both are evaluated without dropout on a held-out set; their test accuracies should agree
within a point or two, and their loss curves lie on top of each other.

    python examples/train_digits.py                    # full run, train_digits.png
    python examples/train_digits.py --quick --png /tmp/curves.png
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

# The matrices here are tiny (3072 x 32 at most), too small for BLAS threads to help; OpenBLAS's
# threads spin between calls and fight PoCL's worker threads for the cores (20x slower on a busy
# 2-core machine). Only effective before numpy is first imported, i.e. when run as a script.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

SEQ = 24            # digits per sequence
DIGITS = 10
D_MODEL = 32
HEADS = 4
HEAD_DIM = 16
CLASSES = 3
DROPOUT_P = 0.1     # on the attention probabilities, in training only
BATCH = 128
TRAIN, TEST = 8192, 2048
LR = 1e-2
STEPS, QUICK_STEPS = 600, 150


# ---- data ---------------------------------------------------------------------------------------

def make_data(rng: np.random.Generator, n: int) -> Tuple[np.ndarray, np.ndarray]:
    """n sequences of SEQ digits and their labels, the three classes equally likely.

    Per sequence: the class, the smaller of the two counts (0..6) and, unless they are equal, the
    gap (1..4, so a quarter of the unequal sequences differ by a single digit); the other
    positions are digits other than 3 and 7; then the order is shuffled.
    """
    y = rng.integers(0, CLASSES, n)
    low = rng.integers(0, 7, n)
    gap = np.where(y == 1, 0, rng.integers(1, 5, n))
    c3 = np.where(y == 2, low, low + gap)
    c7 = np.where(y == 0, low, low + gap)
    others = np.array([0, 1, 2, 4, 5, 6, 8, 9])
    x = others[rng.integers(0, len(others), (n, SEQ))]
    pos = np.arange(SEQ)[None, :]
    x = np.where(pos < c3[:, None], 3, np.where(pos < (c3 + c7)[:, None], 7, x))
    return rng.permuted(x, axis=1), y


# ---- model ----------------------------------------------------------------------------------------

def init_params(rng: np.random.Generator) -> Dict[str, np.ndarray]:
    """float64 initial weights, which both runs start from."""
    hd = HEADS * HEAD_DIM
    return {
        "E": rng.standard_normal((DIGITS, D_MODEL)),
        "Wk": rng.standard_normal((D_MODEL, hd)) / np.sqrt(D_MODEL),
        "Wv": rng.standard_normal((D_MODEL, hd)) / np.sqrt(D_MODEL),
        "query": rng.standard_normal((HEADS, HEAD_DIM)),
        "Wo": rng.standard_normal((hd, CLASSES)) / np.sqrt(hd),
        "bo": np.zeros(CLASSES),
    }


def heads(a: np.ndarray) -> np.ndarray:
    """[N][SEQ][HEADS·HEAD_DIM] -> [N][HEADS][SEQ][HEAD_DIM], the layout attention takes."""
    return a.reshape(a.shape[0], a.shape[1], HEADS, HEAD_DIM).transpose(0, 2, 1, 3)


def unheads(a: np.ndarray) -> np.ndarray:
    return a.transpose(0, 2, 1, 3).reshape(a.shape[0], a.shape[2], HEADS * HEAD_DIM)


class ClattnAttention:
    """Attention through clattn, float32: the forward keeps its output and LSE for the backward."""

    name = "clattn"

    def __init__(self, ctx, seed: int) -> None:
        self.ctx, self.seed = ctx, seed

    def forward(self, q, k, v, offset: Optional[int]):
        opts = {} if offset is None else dict(dropout_p=DROPOUT_P, dropout_seed=self.seed, dropout_offset=offset)
        out, lse = self.ctx.attention(q, k, v, lse=True, **opts)
        return out, (q, k, v, out, lse, opts)

    def backward(self, saved, dout):
        q, k, v, out, lse, opts = saved
        return self.ctx.attention_backward(q, k, v, out, np.ascontiguousarray(dout, np.float32), lse, **opts)


class NumpyAttention:
    """The float64 twin: softmax(q·kᵀ/√d)∘z · v and its gradients written out, z the dropout
    multipliers clattn's Context.dropout_mask gives for the same seed and offset (the ones the
    clattn run's attention draws)."""

    name = "float64 numpy"

    def __init__(self, ctx, seed: int) -> None:
        self.ctx, self.seed = ctx, seed

    def forward(self, q, k, v, offset: Optional[int]):
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(HEAD_DIM)
        e = np.exp(s - s.max(axis=3, keepdims=True))
        p = e / e.sum(axis=3, keepdims=True)
        z = None
        if offset is not None:
            z = self.ctx.dropout_mask(*p.shape, p=DROPOUT_P, seed=self.seed, offset=offset).astype(np.float64)
        pz = p if z is None else p * z
        return pz @ v, (q, k, v, p, z)

    def backward(self, saved, dout):
        q, k, v, p, z = saved
        pz = p if z is None else p * z
        dv = pz.transpose(0, 1, 3, 2) @ dout
        dp = dout @ v.transpose(0, 1, 3, 2)
        if z is not None:
            dp = dp * z
        ds = p * (dp - np.sum(p * dp, axis=3, keepdims=True)) / np.sqrt(HEAD_DIM)
        return ds @ k, ds.transpose(0, 1, 3, 2) @ q, dv


def forward_backward(params: Dict[str, np.ndarray], x: np.ndarray, y: Optional[np.ndarray], attention,
                     offset: Optional[int]) -> Tuple[np.ndarray, float, Optional[Dict[str, np.ndarray]]]:
    """Logits, and with labels y the mean cross-entropy and every parameter's gradient. Dropout
    with offset (training), none with offset None (evaluation)."""
    n = x.shape[0]
    emb = params["E"][x]                                           # [N][SEQ][D_MODEL]
    k, v = heads(emb @ params["Wk"]), heads(emb @ params["Wv"])
    q = np.broadcast_to(params["query"][None, :, None, :], (n, HEADS, 1, HEAD_DIM))
    o, saved = attention.forward(q, k, v, offset)                  # [N][HEADS][1][HEAD_DIM]
    feat = o.reshape(n, HEADS * HEAD_DIM)
    logits = feat @ params["Wo"] + params["bo"]
    if y is None:
        return logits, 0.0, None
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    loss = float(-logp[np.arange(n), y].mean())
    dlogits = np.exp(logp)
    dlogits[np.arange(n), y] -= 1
    dlogits /= n
    grads = {"Wo": feat.T @ dlogits, "bo": dlogits.sum(axis=0)}
    dout = (dlogits @ params["Wo"].T).reshape(o.shape)
    dq, dk, dv = attention.backward(saved, dout)
    grads["query"] = dq.sum(axis=0)[:, 0, :]
    dk = unheads(dk).reshape(n * SEQ, -1)
    dv = unheads(dv).reshape(n * SEQ, -1)
    flat = emb.reshape(n * SEQ, D_MODEL)
    grads["Wk"], grads["Wv"] = flat.T @ dk, flat.T @ dv
    demb = dk @ params["Wk"].T + dv @ params["Wv"].T
    grads["E"] = np.eye(DIGITS, dtype=demb.dtype)[x.reshape(-1)].T @ demb   # each digit's rows summed
    return logits, loss, {name: g.astype(params[name].dtype) for name, g in grads.items()}


def train(params0: Dict[str, np.ndarray], dtype, attention, x: np.ndarray, y: np.ndarray,
          batches: np.ndarray, lr: float) -> Tuple[Dict[str, np.ndarray], List[float]]:
    """Adam (β 0.9, 0.999) over the given batches of indices, the learning rate decaying to 0 on a
    cosine (so the last steps settle rather than jump); dropout offset = step number."""
    params = {name: p.astype(dtype) for name, p in params0.items()}
    m = {name: np.zeros_like(p) for name, p in params.items()}
    s = {name: np.zeros_like(p) for name, p in params.items()}
    b1, b2, eps = 0.9, 0.999, 1e-8
    losses = []
    for step, idx in enumerate(batches):
        _, loss, grads = forward_backward(params, x[idx], y[idx], attention, offset=step)
        losses.append(loss)
        t = step + 1
        rate = lr * 0.5 * (1.0 + np.cos(np.pi * step / len(batches)))
        for name, g in grads.items():
            m[name] = b1 * m[name] + (1 - b1) * g
            s[name] = b2 * s[name] + (1 - b2) * g * g
            mhat, shat = m[name] / (1 - b1 ** t), s[name] / (1 - b2 ** t)
            params[name] = (params[name] - rate * mhat / (np.sqrt(shat) + eps)).astype(dtype)
    return params, losses


def evaluate(params, attention, x: np.ndarray, y: np.ndarray) -> Tuple[float, float]:
    """Accuracy and mean cross-entropy without dropout."""
    logits, _, _ = forward_backward(params, x, None, attention, offset=None)
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(np.mean(np.argmax(logits, axis=1) == y)), float(-logp[np.arange(len(y)), y].mean())


def smooth(a: Sequence[float], n: int = 25) -> np.ndarray:
    """Running mean over n steps (the curve of a noisy minibatch loss)."""
    a = np.asarray(a, dtype=np.float64)
    c = np.cumsum(np.insert(a, 0, 0.0))
    lo = np.maximum(np.arange(len(a)) + 1 - n, 0)
    return (c[1:] - c[lo]) / (np.arange(len(a)) + 1 - lo)


def plot(path: str, runs: Dict[str, List[float]], title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for (name, losses), style in zip(runs.items(), ("-", "--")):
        ax.plot(smooth(losses), style, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross-entropy, mean of 25 steps)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, help=f"training steps of {BATCH} sequences (default {STEPS}, "
                    f"--quick {QUICK_STEPS})")
    ap.add_argument("--quick", action="store_true", help="fewer steps (the tests)")
    ap.add_argument("--seed", type=int, default=0, help="data, initial weights and dropout seed (default 0)")
    ap.add_argument("--lr", type=float, default=LR, help=f"Adam's learning rate (default {LR})")
    ap.add_argument("--device", help="clattn device spec: gpu, cpu, P:D or a name substring "
                    "(default: CLATTN_DEVICE, else the first GPU, else any device)")
    ap.add_argument("--png", default="train_digits.png", help="where to write the loss curves "
                    "(default train_digits.png)")
    ap.add_argument("--json", help="also write the results as JSON here")
    args = ap.parse_args(argv)
    steps = args.steps if args.steps is not None else (QUICK_STEPS if args.quick else STEPS)

    import clattn
    try:
        ctx = clattn.Context(args.device)
    except clattn.ClattnError as e:
        print(f"train_digits.py: no clattn context: {e.status}: {e}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    x_train, y_train = make_data(rng, TRAIN)
    x_test, y_test = make_data(rng, TEST)
    params0 = init_params(rng)
    dropout_seed = int(rng.integers(0, 1 << 63))
    batches = np.stack([rng.choice(TRAIN, BATCH, replace=False) for _ in range(steps)])

    results = {}
    curves = {}
    for attention, dtype in ((ClattnAttention(ctx, dropout_seed), np.float32),
                             (NumpyAttention(ctx, dropout_seed), np.float64)):
        t0 = time.perf_counter()
        params, losses = train(params0, dtype, attention, x_train, y_train, batches, args.lr)
        seconds = time.perf_counter() - t0
        test_accuracy, test_loss = evaluate(params, attention, x_test, y_test)
        results[attention.name] = {
            "test_accuracy": test_accuracy,
            "test_loss": test_loss,
            "first_loss": float(np.mean(losses[:10])),
            "last_loss": float(np.mean(losses[-50:])),
            "seconds": seconds,
        }
        curves[attention.name] = losses
    device = ctx.device_name
    ctx.close()

    a, b = results["clattn"], results["float64 numpy"]
    plot(args.png, {f"clattn (float32), test accuracy {100 * a['test_accuracy']:.1f}%": curves["clattn"],
                    f"float64 numpy twin, test accuracy {100 * b['test_accuracy']:.1f}%": curves["float64 numpy"]},
         f"count 3s vs 7s: {steps} steps of {BATCH}, dropout {DROPOUT_P} on attention")
    # the per-step losses of the two runs: float32 against float64 rounding alone separates them
    gap = float(np.max(np.abs(np.asarray(curves["clattn"]) - np.asarray(curves["float64 numpy"]))))
    summary = {"steps": steps, "seed": args.seed, "device": device, "png": args.png, "clattn": a, "numpy": b,
               "max_loss_difference": gap}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(f"train_digits: {steps} steps; test accuracy clattn {100 * a['test_accuracy']:.1f}%, float64 numpy "
          f"{100 * b['test_accuracy']:.1f}% (chance 33.3%); loss {a['first_loss']:.3f} -> {a['last_loss']:.3f} "
          f"/ {b['first_loss']:.3f} -> {b['last_loss']:.3f}, per-step losses within {gap:.1e}; "
          f"{a['seconds']:.1f} s / {b['seconds']:.1f} s; curves in {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
