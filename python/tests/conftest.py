"""Shared fixtures: one context for the whole run (kernel programs built once), fixed-seed inputs.

Without an OpenCL device the device tests skip, unless CLATTN_REQUIRE_DEVICE=1 (CI), which makes
them fail instead, as the C suite does."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import clattn  # noqa: E402


def _no_device(reason: str):
    if os.environ.get("CLATTN_REQUIRE_DEVICE") == "1":
        pytest.fail(f"no usable OpenCL device and CLATTN_REQUIRE_DEVICE=1: {reason}")
    pytest.skip(f"no usable OpenCL device: {reason}")


@pytest.fixture(scope="session")
def ctx():
    try:
        c = clattn.Context()
    except clattn.ClattnError as e:
        _no_device(f"{e.status}: {e}")
    yield c
    c.close()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def pytest_report_header(config):
    try:
        return [f"clattn {clattn.version()} from {clattn.library_path()}, package {Path(clattn.__file__).parent}"]
    except OSError as e:
        return [f"clattn: {e}"]
