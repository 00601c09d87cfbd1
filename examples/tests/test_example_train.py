"""examples/train_digits.py: a model trained through clattn's attention forward and backward
against its float64 numpy twin (same weights, batches and dropout decisions)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

EXAMPLE = Path(__file__).resolve().parent.parent / "train_digits.py"


def test_quick_training_run(ctx, need, tmp_path):
    """The command line, as a user runs it (a subprocess: the script limits BLAS threads before
    numpy loads, which an in-process import cannot)."""
    need("matplotlib")
    import clattn
    png, res = tmp_path / "curves.png", tmp_path / "results.json"
    env = dict(os.environ)
    # the clattn package this test imported, whether installed or from PYTHONPATH
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(clattn.__file__).resolve().parent.parent),
                                                      env.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, str(EXAMPLE), "--quick", "--png", str(png), "--json", str(res)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("train_digits:") and len(r.stdout.splitlines()) == 1, r.stdout
    data = png.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
    out = json.loads(res.read_text())
    a, b = out["clattn"], out["numpy"]
    assert a["test_accuracy"] >= 0.8, f"chance is 1/3; clattn reached {a['test_accuracy']}"
    assert abs(a["test_accuracy"] - b["test_accuracy"]) <= 0.03, (a, b)
    assert a["last_loss"] < 0.5 * a["first_loss"], a
    # the same weights, batches and dropout decisions: only float32 rounding separates the runs, so
    # their losses agree step by step
    assert out["max_loss_difference"] < 1e-3, out["max_loss_difference"]


def test_loss_agreement_has_teeth(ctx):
    """A wrong gradient parts the runs' losses within a few steps: the clattn run with dk and dv
    zeroed (so the keys' and values' projections and the embedding learn nothing through them), or
    with dropout masks the twin does not share, against the float64 twin."""
    import train_digits as td
    rng = np.random.default_rng(0)
    x, y = td.make_data(rng, 512)
    params0 = td.init_params(rng)
    batches = np.stack([rng.choice(512, td.BATCH, replace=False) for _ in range(10)])

    class NoKVGradient(td.ClattnAttention):
        def backward(self, saved, dout):
            dq, dk, dv = super().backward(saved, dout)
            return dq, np.zeros_like(dk), np.zeros_like(dv)

    def losses(attention, dtype):
        return np.array(td.train(params0, dtype, attention, x, y, batches, td.LR)[1])

    twin = losses(td.NumpyAttention(ctx, 1), np.float64)
    assert np.max(np.abs(losses(td.ClattnAttention(ctx, 1), np.float32) - twin)) < 1e-4
    assert np.max(np.abs(losses(NoKVGradient(ctx, 1), np.float32) - twin)) > 1e-2
    assert np.max(np.abs(losses(td.ClattnAttention(ctx, 2), np.float32) - twin)) > 1e-2
