"""`python -m clattn` prints what clattn-info prints."""

from __future__ import annotations

import subprocess
import sys

import clattn


def test_python_m_clattn(ctx):
    r = subprocess.run([sys.executable, "-m", "clattn"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"clattn-info (clattn {clattn.version()})")
    for needle in ("Platform 0:", "Device 0:0", "compute units", "device key", "matrix units",
                   "kernel cache", "tuning store", "  fused", "  decode", "CLATTN_DEVICE:",
                   "clattn_create(NULL) picks:", "<- clattn default", "why:"):
        assert needle in out, needle
    assert ctx.device_name in out


def test_python_m_clattn_device_spec(ctx):
    r = subprocess.run([sys.executable, "-m", "clattn", "--device", "no-such-device-xyz"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "resolves to: none" in r.stdout


def test_opencl_library_override_is_used_or_refused(tmp_path):
    """CLATTN_OPENCL_LIBRARY names the ICD loader: a path that does not load, or a library
    without OpenCL in it, is an OSError naming the variable, never a silent fallback."""
    import os
    code = "import clattn._lib as L; L.cl()"
    for bad in (str(tmp_path / "no-such-libOpenCL.so"), "libm.so.6"):
        env = dict(os.environ, CLATTN_OPENCL_LIBRARY=bad)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode != 0 and "OSError" in r.stderr and "CLATTN_OPENCL_LIBRARY" in r.stderr, r.stderr
