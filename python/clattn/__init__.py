"""clattn: transformer attention on any OpenCL device, from Python.

A ctypes binding of the C library libclattn (include/clattn.h): no compiled extension. numpy arrays
in and out for the simple path; DeviceTensors (or pyopencl arrays, zero-copy) for data that stays
on the device.

    import numpy as np, clattn
    with clattn.Context() as ctx:                      # CLATTN_DEVICE, else the first GPU, else any
        q = np.random.rand(1, 8, 128, 64).astype(np.float32)
        k = np.random.rand(1, 2, 128, 64).astype(np.float32)   # grouped-query: 4 q heads per kv head
        out = ctx.attention(q, k, k, causal=True)

Training: ``ctx.attention(..., lse=True, dropout_p=...)`` then ``ctx.attention_backward(q, k, v,
out, dout, lse, ...)`` with the same options gives dq, dk, dv (examples/train_digits.py).

Errors raise :class:`ClattnError` with ``.status`` ("CLATTN_INVALID_ARGUMENT", ...), ``.code`` and
the library's message. See docs/python.md.
"""

from ._core import (DTYPES, OPERATIONS, ClattnError, Context, Device, DeviceTensor, Params,
                    ProgramStatistics, SelectedDevice, Status, alibi_slopes, devices, from_bf16,
                    philox4x32_10, select_device, to_bf16, version, version_number)
from ._lib import library_path

__version__ = "0.4.0"

__all__ = ["Context", "DeviceTensor", "ClattnError", "Status", "Device", "SelectedDevice", "Params",
           "ProgramStatistics", "devices", "select_device", "alibi_slopes", "version", "version_number",
           "library_path", "to_bf16", "from_bf16", "philox4x32_10", "DTYPES", "OPERATIONS", "__version__"]
