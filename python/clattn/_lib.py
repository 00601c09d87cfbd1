"""ctypes declarations of libclattn's C API (include/clattn.h) and the OpenCL calls the package uses.

Loading order of libclattn, the first that loads wins:

1. the path in the ``CLATTN_LIBRARY`` environment variable (development: a build folder's
   ``libclattn.so``), and nothing else when it is set, so a wrong path is an error rather than a
   silent fall-back to another copy;
2. the copy bundled into the package when it was installed (``clattn/_bundled/``);
3. the system loader (``ctypes.util.find_library("clattn")``: an installed ``libclattn.so``).

OpenCL itself comes from the ICD loader ``libOpenCL.so.1`` (``CLATTN_OPENCL_LIBRARY`` overrides),
used for device buffers and the device queries of ``python -m clattn``.

The structures mirror the C header field by field; ``tests/test_clattn_abi.py`` compiles a C program
against the header and compares every size and offset with these, so a header change that the
binding misses fails a test rather than corrupting memory.

The training calls (clattn_attention_backward, clattn_dropout_mask, clattn_philox4x32_10) are
looked up without being required: a libclattn from before them (0.3, the same ABI) still loads
for everything else, and :func:`need` names the missing symbol when one of them is called.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int,
                    c_int32, c_int64, c_size_t, c_uint, c_uint32, c_uint64, c_void_p)
from pathlib import Path
from typing import Optional

__all__ = ["lib", "cl", "Tensor", "AttentionDesc", "SoftmaxDesc", "ProgramStats", "ProblemClass",
           "KernelParams", "library_path", "MAX_KERNEL_PARAMS"]

MAX_KERNEL_PARAMS = 12

# ---- structures (include/clattn.h) ----------------------------------------------------------


class Tensor(Structure):
    """clattn_tensor: a [batch][heads][seq][dim] view on a cl_mem, counts in elements."""

    _fields_ = [("buffer", c_void_p), ("dtype", c_int), ("offset", c_int64),
                ("shape", c_int64 * 4), ("stride", c_int64 * 3)]


class AttentionDesc(Structure):
    """clattn_attention_desc."""

    _fields_ = [("batch", c_int64), ("heads_q", c_int64), ("heads_kv", c_int64),
                ("seq_q", c_int64), ("seq_kv", c_int64), ("head_dim", c_int64),
                ("head_dim_v", c_int64), ("scale", c_float), ("causal", c_int),
                ("mask", POINTER(Tensor)), ("kv_lengths", c_void_p), ("lse", POINTER(Tensor)),
                ("probabilities", POINTER(Tensor)), ("algorithm", c_int),
                ("window", c_int), ("window_left", c_int64), ("window_right", c_int64),
                ("chunk", c_int64), ("softcap", c_float), ("sinks", POINTER(Tensor)),
                ("alibi_slopes", POINTER(Tensor)), ("score_mod", c_char_p),
                ("mask_mod", c_char_p),
                # the C union { const clattn_kv_layout *kv; int64_t kv_slot_; } (paged, packed or
                # quantized K/V: not exposed here, zero), then a slice's offsets
                ("kv_slot_", c_int64), ("q_offset", c_int64), ("k_offset", c_int64),
                # dropout on the attention probabilities (off at dropout_p 0)
                ("dropout_seed", c_uint64), ("dropout_p", c_float), ("dropout_offset", c_uint32),
                # zero; room for later options, each off at zero, so the size stays
                ("reserved", c_int64 * 11)]


class SoftmaxDesc(Structure):
    """clattn_softmax_desc."""

    _fields_ = [("batch", c_int64), ("heads", c_int64), ("rows", c_int64), ("cols", c_int64),
                ("scale", c_float), ("causal", c_int), ("mask", POINTER(Tensor)),
                ("kv_lengths", c_void_p)]


class ProgramStats(Structure):
    """clattn_program_stats."""

    _fields_ = [("memory_hits", c_uint), ("disk_hits", c_uint), ("disk_rejects", c_uint),
                ("disk_writes", c_uint), ("builds", c_uint), ("build_seconds", c_double),
                ("build_seconds_max", c_double), ("build_slowest", c_char * 1100),
                ("disk_untrusted", c_uint), ("reserved", c_uint * 7)]


class ProblemClass(Structure):
    """clattn_problem_class."""

    _fields_ = [("operation", c_int), ("dtype", c_int), ("head_dim", c_int64),
                ("seq_q", c_int64), ("seq_kv", c_int64), ("causal", c_int), ("masked", c_int)]


class KernelParams(Structure):
    """clattn_kernel_params."""

    _fields_ = [("count", c_int), ("values", c_int * MAX_KERNEL_PARAMS), ("source", c_int),
                ("origin", c_char * 512)]


# ---- loading ---------------------------------------------------------------------------------

_BUNDLED_DIR = Path(__file__).resolve().parent / "_bundled"


def _candidates() -> list:
    env = os.environ.get("CLATTN_LIBRARY")
    if env:
        return [("CLATTN_LIBRARY", env)]
    found = []
    if _BUNDLED_DIR.is_dir():
        for name in sorted(_BUNDLED_DIR.iterdir()):
            if name.name.startswith("libclattn") and (".so" in name.name or name.suffix in (".dylib", ".dll")):
                found.append(("bundled", str(name)))
    system = ctypes.util.find_library("clattn")
    if system:
        found.append(("system", system))
    return found


def _load_clattn() -> tuple:
    errors = []
    for origin, path in _candidates():
        try:
            return ctypes.CDLL(path), path, origin
        except OSError as e:  # a copy being rebuilt, or a missing dependency: try the next
            errors.append(f"{origin} {path}: {e}")
    hint = ("set CLATTN_LIBRARY to a built libclattn.so (cmake --build <dir> --target clattn), or "
            "reinstall the package with `pip install ./python` from the source tree")
    raise OSError("clattn: cannot load libclattn (" + ("; ".join(errors) or "no copy found") + "); " + hint)


def _load_opencl() -> ctypes.CDLL:
    given = os.environ.get("CLATTN_OPENCL_LIBRARY") or ""
    if given:
        # The library named is the one used, or an error: falling back would run another OpenCL
        # than the caller chose.
        try:
            dll = ctypes.CDLL(given)
        except OSError as e:
            raise OSError(f"clattn: CLATTN_OPENCL_LIBRARY={given!r} does not load: {e}") from e
        if not hasattr(dll, "clGetPlatformIDs"):
            raise OSError(f"clattn: CLATTN_OPENCL_LIBRARY={given!r} is not an OpenCL library "
                          "(no clGetPlatformIDs)")
        return dll
    names = ["libOpenCL.so.1", "libOpenCL.so",
             ctypes.util.find_library("OpenCL") or "", "OpenCL.dll",
             "/System/Library/Frameworks/OpenCL.framework/OpenCL"]
    errors = []
    for n in names:
        if not n:
            continue
        try:
            return ctypes.CDLL(n)
        except OSError as e:
            errors.append(str(e))
    raise OSError("clattn: cannot load the OpenCL ICD loader (libOpenCL.so.1): " + "; ".join(errors))


def _proto(dll: ctypes.CDLL, name: str, restype, *argtypes, required: bool = True):
    try:
        fn = getattr(dll, name)
    except AttributeError:
        if required:
            raise
        return None
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


class _Lib:
    """The loaded libclattn with prototypes set; attribute access gives the C functions."""

    def __init__(self) -> None:
        dll, self.path, self.origin = _load_clattn()
        self.dll = dll
        P = _proto
        T = POINTER(Tensor)
        ev = c_void_p
        self.clattn_version_number = P(dll, "clattn_version_number", c_uint)
        self.clattn_version_string = P(dll, "clattn_version_string", c_char_p)
        self.clattn_status_string = P(dll, "clattn_status_string", c_char_p, c_int)
        self.clattn_status_name = P(dll, "clattn_status_name", c_char_p, c_int)
        self.clattn_dtype_size = P(dll, "clattn_dtype_size", c_size_t, c_int)
        self.clattn_dtype_name = P(dll, "clattn_dtype_name", c_char_p, c_int)
        self.clattn_alibi_slopes = P(dll, "clattn_alibi_slopes", c_int, c_int, c_float, POINTER(c_float))
        self.clattn_create = P(dll, "clattn_create", c_int, c_char_p, POINTER(c_void_p))
        self.clattn_create_from_queue = P(dll, "clattn_create_from_queue", c_int, c_void_p, POINTER(c_void_p))
        self.clattn_release = P(dll, "clattn_release", None, c_void_p)
        self.clattn_last_error = P(dll, "clattn_last_error", c_char_p, c_void_p)
        self.clattn_last_cl_error = P(dll, "clattn_last_cl_error", c_int32, c_void_p)
        self.clattn_last_build_log = P(dll, "clattn_last_build_log", c_char_p, c_void_p)
        self.clattn_select_device = P(dll, "clattn_select_device", c_int, c_char_p, POINTER(c_void_p),
                                      POINTER(c_void_p), c_char_p, c_size_t)
        self.clattn_device_key = P(dll, "clattn_device_key", c_int, c_void_p, c_char_p, c_size_t)
        self.clattn_queue = P(dll, "clattn_queue", c_void_p, c_void_p)
        self.clattn_cl_context = P(dll, "clattn_cl_context", c_void_p, c_void_p)
        self.clattn_device = P(dll, "clattn_device", c_void_p, c_void_p)
        self.clattn_get_program_stats = P(dll, "clattn_get_program_stats", c_int, c_void_p, POINTER(ProgramStats))
        self.clattn_attention = P(dll, "clattn_attention", c_int, c_void_p, POINTER(AttentionDesc), T, T, T, T,
                                  c_uint, c_void_p, POINTER(ev))
        self.clattn_scores = P(dll, "clattn_scores", c_int, c_void_p, POINTER(AttentionDesc), T, T, T,
                               c_uint, c_void_p, POINTER(ev))
        self.clattn_softmax = P(dll, "clattn_softmax", c_int, c_void_p, POINTER(SoftmaxDesc), T, T,
                                c_uint, c_void_p, POINTER(ev))
        self.clattn_merge = P(dll, "clattn_merge", c_int, c_void_p, c_int, T, T, T, T,
                              c_uint, c_void_p, POINTER(ev))
        self.clattn_attention_backward = P(dll, "clattn_attention_backward", c_int, c_void_p,
                                           POINTER(AttentionDesc), T, T, T, T, T, T, T, T, T, T,
                                           c_uint, c_void_p, POINTER(ev), required=False)
        self.clattn_dropout_mask = P(dll, "clattn_dropout_mask", c_int, c_void_p, POINTER(AttentionDesc), T,
                                     c_uint, c_void_p, POINTER(ev), required=False)
        self.clattn_philox4x32_10 = P(dll, "clattn_philox4x32_10", None, POINTER(c_uint32), POINTER(c_uint32),
                                      POINTER(c_uint32), required=False)
        self.clattn_attention_host = P(dll, "clattn_attention_host", c_int, c_void_p, POINTER(AttentionDesc),
                                       c_int, c_void_p, c_void_p, c_void_p, c_void_p, POINTER(c_float))
        self.clattn_operation_name = P(dll, "clattn_operation_name", c_char_p, c_int)
        self.clattn_param_count = P(dll, "clattn_param_count", c_int, c_int)
        self.clattn_param_name = P(dll, "clattn_param_name", c_char_p, c_int, c_int)
        self.clattn_param_max = P(dll, "clattn_param_max", c_int, c_int, c_int)
        self.clattn_param_value_name = P(dll, "clattn_param_value_name", c_char_p, c_int, c_int, c_int)
        self.clattn_params_source_name = P(dll, "clattn_params_source_name", c_char_p, c_int)
        self.clattn_set_params = P(dll, "clattn_set_params", c_int, c_void_p, c_int, POINTER(c_int), c_int)
        self.clattn_get_params = P(dll, "clattn_get_params", c_int, c_void_p, POINTER(ProblemClass),
                                   POINTER(KernelParams))
        self.clattn_get_call_params = P(dll, "clattn_get_call_params", c_int, c_void_p, POINTER(ProblemClass),
                                        c_int64, c_int64, c_int64, POINTER(KernelParams))
        self.clattn_tuning_report = P(dll, "clattn_tuning_report", c_char_p, c_void_p)
        self.clattn_cache_report = P(dll, "clattn_cache_report", c_char_p, c_void_p)
        self.clattn_matrix_report = P(dll, "clattn_matrix_report", c_char_p, c_void_p)
        self.clattn_reload_tuning = P(dll, "clattn_reload_tuning", c_int, c_void_p)
        self.clattn_tuning_path = P(dll, "clattn_tuning_path", c_int, c_void_p, c_char_p, c_size_t)


class _CL:
    """The OpenCL 1.2 entry points the package calls, through the ICD loader."""

    def __init__(self) -> None:
        dll = _load_opencl()
        self.dll = dll
        P = _proto
        ci = POINTER(c_int32)
        sz3 = POINTER(c_size_t)
        self.clGetPlatformIDs = P(dll, "clGetPlatformIDs", c_int32, c_uint, POINTER(c_void_p), POINTER(c_uint))
        self.clGetPlatformInfo = P(dll, "clGetPlatformInfo", c_int32, c_void_p, c_uint, c_size_t, c_void_p,
                                   POINTER(c_size_t))
        self.clGetDeviceIDs = P(dll, "clGetDeviceIDs", c_int32, c_void_p, c_uint64, c_uint, POINTER(c_void_p),
                                POINTER(c_uint))
        self.clGetDeviceInfo = P(dll, "clGetDeviceInfo", c_int32, c_void_p, c_uint, c_size_t, c_void_p,
                                 POINTER(c_size_t))
        self.clCreateBuffer = P(dll, "clCreateBuffer", c_void_p, c_void_p, c_uint64, c_size_t, c_void_p, ci)
        self.clRetainMemObject = P(dll, "clRetainMemObject", c_int32, c_void_p)
        self.clReleaseMemObject = P(dll, "clReleaseMemObject", c_int32, c_void_p)
        self.clGetMemObjectInfo = P(dll, "clGetMemObjectInfo", c_int32, c_void_p, c_uint, c_size_t, c_void_p,
                                    POINTER(c_size_t))
        self.clEnqueueWriteBuffer = P(dll, "clEnqueueWriteBuffer", c_int32, c_void_p, c_void_p, c_uint, c_size_t,
                                      c_size_t, c_void_p, c_uint, c_void_p, c_void_p)
        self.clEnqueueReadBuffer = P(dll, "clEnqueueReadBuffer", c_int32, c_void_p, c_void_p, c_uint, c_size_t,
                                     c_size_t, c_void_p, c_uint, c_void_p, c_void_p)
        self.clEnqueueWriteBufferRect = P(dll, "clEnqueueWriteBufferRect", c_int32, c_void_p, c_void_p, c_uint,
                                          sz3, sz3, sz3, c_size_t, c_size_t, c_size_t, c_size_t, c_void_p,
                                          c_uint, c_void_p, c_void_p)
        self.clEnqueueFillBuffer = P(dll, "clEnqueueFillBuffer", c_int32, c_void_p, c_void_p, c_void_p, c_size_t,
                                     c_size_t, c_size_t, c_uint, c_void_p, c_void_p, required=False)
        self.clFinish = P(dll, "clFinish", c_int32, c_void_p)
        self.clFlush = P(dll, "clFlush", c_int32, c_void_p)
        self.clGetContextInfo = P(dll, "clGetContextInfo", c_int32, c_void_p, c_uint, c_size_t, c_void_p,
                                  POINTER(c_size_t))


_lock = threading.Lock()
_lib: Optional[_Lib] = None
_cl: Optional[_CL] = None


def lib() -> _Lib:
    """The loaded libclattn (loaded on first use)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = _Lib()
    return _lib


def cl() -> _CL:
    """The loaded OpenCL ICD loader (loaded on first use)."""
    global _cl
    if _cl is None:
        with _lock:
            if _cl is None:
                _cl = _CL()
    return _cl


def library_path() -> str:
    """The path of the libclattn that was loaded and where it was found, e.g. 'bundled: /...'."""
    L = lib()
    return f"{L.origin}: {L.path}"


def need(name: str):
    """The C function `name` of the loaded libclattn; an OSError naming the library and its version
    when that copy predates it (the optional training calls)."""
    L = lib()
    fn = getattr(L, name, None)
    if fn is None:
        raise OSError(f"clattn: the loaded libclattn ({L.origin}: {L.path}, version "
                      f"{decode(L.clattn_version_string())}) has no {name}; rebuild it from this source "
                      f"tree or point CLATTN_LIBRARY at a newer build")
    return fn


def decode(s: Optional[bytes]) -> str:
    """A C string from the library as text ('' for NULL); undecodable bytes are replaced."""
    return s.decode("utf-8", "replace") if s else ""

