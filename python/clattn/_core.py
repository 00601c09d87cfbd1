"""Contexts, device tensors and the operations: the Python face of include/clattn.h."""

from __future__ import annotations

import ctypes
import enum
import math
from ctypes import byref, c_float, c_int, c_int32, c_size_t, c_uint, c_void_p, pointer
from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib
from ._lib import AttentionDesc, KernelParams, ProblemClass, ProgramStats, SoftmaxDesc, Tensor, decode

__all__ = ["Status", "ClattnError", "Context", "DeviceTensor", "ProgramStatistics", "Params", "Device",
           "SelectedDevice", "devices", "select_device", "alibi_slopes", "version", "version_number",
           "to_bf16", "from_bf16", "philox4x32_10", "DTYPES", "OPERATIONS"]

# ---- constants ----------------------------------------------------------------------------------

#: Storage types by name: the C enum value, bytes per element and the numpy type a tensor holds.
#: bf16 is stored as uint16 bit patterns (the upper half of a float32); "i32" is only for
#: kv_lengths buffers.
DTYPES: Dict[str, Tuple[int, int, np.dtype]] = {
    "f32": (0, 4, np.dtype(np.float32)),
    "f16": (1, 2, np.dtype(np.float16)),
    "bf16": (2, 2, np.dtype(np.uint16)),
    "i32": (-1, 4, np.dtype(np.int32)),
}
_DTYPE_BY_CODE = {0: "f32", 1: "f16", 2: "bf16"}
OPERATIONS = ("scores", "pv", "softmax", "fused", "decode", "merge")
_ALGORITHMS = {"auto": 0, "fused": 1, "unfused": 2}

# OpenCL numbers used here (CL/cl.h); fixed by the Khronos registry.
_CL_MEM_READ_WRITE = 1 << 0
_CL_MEM_COPY_HOST_PTR = 1 << 5
_CL_MEM_SIZE = 0x1102
_CL_DEVICE_NAME = 0x102B
_CL_DEVICE_TYPE = 0x1000
_CL_PLATFORM_NAME = 0x0902
_CL_DEVICE_TYPE_ALL = 0xFFFFFFFF
_CL_DEVICE_NOT_FOUND = -1
_CL_PLATFORM_NOT_FOUND_KHR = -1001


class Status(enum.IntEnum):
    """clattn_status, the values of CLATTN_STATUS_LIST."""

    SUCCESS = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED = 2
    NO_DEVICE = 3
    BUILD_FAILED = 4
    OPENCL_ERROR = 5
    OUT_OF_MEMORY = 6
    IO_ERROR = 7


class ClattnError(Exception):
    """A failed clattn call.

    Attributes:
        status: the status's symbolic name, e.g. "CLATTN_INVALID_ARGUMENT".
        code: its integer value (a :class:`Status` where known).
        build_log: the kernel build log for CLATTN_BUILD_FAILED, else "".
        cl_error: the raw cl_int of the last failing OpenCL call on the context (0 if none).

    ``str(e)`` is the library's message (clattn_last_error), which names the argument and value.
    """

    def __init__(self, code: int, message: str, build_log: str = "", cl_error: int = 0) -> None:
        super().__init__(message)
        try:
            self.code: int = Status(code)
        except ValueError:
            self.code = code
        try:
            self.status: str = decode(_lib.lib().clattn_status_name(code))
        except OSError:
            self.status = f"CLATTN_{Status(code).name}" if code in Status._value2member_map_ else str(code)
        self.build_log: str = build_log
        self.cl_error: int = cl_error

    @property
    def message(self) -> str:
        """The library's message (the same as str(e))."""
        return str(self)


def _raise(code: int, ctx_handle: Optional[int]) -> None:
    L = _lib.lib()
    msg = decode(L.clattn_last_error(ctx_handle))
    log = decode(L.clattn_last_build_log(ctx_handle)) if ctx_handle else ""
    clerr = int(L.clattn_last_cl_error(ctx_handle)) if ctx_handle else 0
    raise ClattnError(code, msg or decode(L.clattn_status_string(code)), log, clerr)


def _check_cl(err: int, what: str) -> None:
    if err != 0:
        raise ClattnError(Status.OPENCL_ERROR, f"{what} failed (OpenCL error {err})", cl_error=err)


# ---- bf16 -----------------------------------------------------------------------------------------


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float values to bf16 bit patterns (uint16), rounded to nearest even as the library stores.

    NaN stays NaN (quiet), infinities stay infinite, values past bf16's largest round to infinity.
    """
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded = np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)
    return rounded


def from_bf16(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) to float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, str):
        name = dtype.lower()
        if name in ("float32", "fp32"):
            name = "f32"
        elif name in ("float16", "fp16", "half"):
            name = "f16"
        elif name == "bfloat16":
            name = "bf16"
        elif name == "int32":
            name = "i32"
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}: f32, f16 or bf16 (or i32 for kv_lengths)")
        return name
    d = np.dtype(dtype)
    if d == np.float32 or d == np.float64:
        return "f32"
    if d == np.float16:
        return "f16"
    if d == np.int32 or d == np.int64:
        return "i32"
    if d == np.uint16:
        raise ValueError("a uint16 array is ambiguous: pass dtype='bf16' to read it as bf16 bit patterns")
    raise ValueError(f"no clattn dtype for numpy {d}: f32, f16 or bf16")


def _float_dtype(name: str, dtype: Any) -> str:
    """The argument `name`, a dtype of attention data: "f32", "f16" or "bf16" ("i32" is refused: it
    is only for kv_lengths)."""
    try:
        dt = _dtype_name(dtype)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    if dt == "i32":
        raise ValueError(f"{name} must be f32, f16 or bf16 (got {dtype!r}; i32 is for kv_lengths only)")
    return dt


def _int(name: str, value: Any, bools: bool = False) -> int:
    """value as an int: a Python or numpy integer (a bool only with bools); ValueError otherwise,
    where int() would truncate 1.5 to 1 or read "3" as 3."""
    if type(value) is int:   # the common case first: this runs several times per call
        return value
    if isinstance(value, (bool, np.bool_)):
        if bools:
            return int(value)
    elif isinstance(value, (int, np.integer)):
        return int(value)
    raise ValueError(f"{name} must be an integer (got {value!r})")


def _extents(what: str, shape: Any, dtype: str) -> Tuple[int, ...]:
    """shape as the extents of a tensor of dtype: 4 non-negative integers [B, H, S, D], or 1 for
    "i32" key lengths; ValueError starting with `what` otherwise."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise ValueError(f"{what} {shape!r} is not a sequence of extents") from None
    if len(dims) != (1 if dtype == "i32" else 4):
        rule = "'i32' tensors (kv_lengths) are 1-D" if dtype == "i32" else "clattn tensors are 4-D [B][H][S][D]"
        raise ValueError(f"{what} {dims}: {rule}")
    try:
        dims = tuple(_int("", n) for n in dims)   # the message is formatted only on failure (views are hot)
    except ValueError:
        raise ValueError(f"{what} {dims}: extents are integers") from None
    if min(dims) < 0:
        raise ValueError(f"{what} {dims} has a negative extent")
    return dims


def _host_data(name: str, a: Any, dtype: Optional[str], lengths: bool = False) -> Tuple[np.ndarray, str]:
    """The host data of argument `name` and the storage type it goes to the device as: dtype, else
    its own (float16 -> f16, other floats -> f32, integers -> i32). ValueError, naming the argument,
    unless it is 4-D floating-point data (uint16 bf16 bit patterns with dtype "bf16" only) or, with
    lengths, 1-D integer key lengths within int32: nothing is truncated or wrapped on the way."""
    arr = np.asarray(a)
    kind = arr.dtype.kind
    ints = kind in "iu" and arr.dtype != np.uint16   # uint16: bf16 bit patterns, or ambiguous
    if dtype is not None:
        dt = _dtype_name(dtype)
    else:
        dt = "i32" if ints else "f16" if arr.dtype == np.float16 else "f32"
    if dt == "i32" and lengths:
        if kind not in "iu":
            raise ValueError(f"{name} holds {arr.dtype} data: an 'i32' tensor holds kv_lengths, integers")
        if arr.size and not (-2**31 <= arr.min() and arr.max() < 2**31):
            raise ValueError(f"{name} holds values outside int32 (an 'i32' tensor would wrap them)")
    elif arr.dtype == np.uint16 and dt != "bf16":
        raise ValueError(f"{name} is a uint16 array, which is ambiguous: pass dtype='bf16' to read it as bf16 "
                         "bit patterns")
    elif dt == "i32" or not (kind == "f" or arr.dtype == np.uint16):
        raise ValueError(f"{name} holds {arr.dtype} data: attention data are floating point, stored as f32, f16 "
                         "or bf16 (integers are kv_lengths only)")
    _extents(f"{name} has shape", arr.shape, dt)
    return arr, dt


def _fill_target(name: str, a: np.ndarray, shape: Tuple[int, ...], any_shape: bool = False) -> np.ndarray:
    """A numpy array the caller gave to be filled with a result of shape (any shape of as many
    elements with any_shape); ValueError, naming it, unless it is a writeable float array of that
    shape (an integer one would truncate the result)."""
    if a.dtype.kind != "f":
        raise ValueError(f"{name} is a numpy {a.dtype} array: results are floating point (give a float32 or "
                         "float16 array to fill)")
    if any_shape and a.size != int(np.prod(shape)):
        raise ValueError(f"{name} has {a.size} elements, the result {int(np.prod(shape))}")
    if not any_shape and a.shape != shape:
        raise ValueError(f"{name} has shape {a.shape}, the result {shape}")
    if not a.flags.writeable:
        raise ValueError(f"{name} is a read-only array")
    return a


def _device_spec(name: str, spec: Any) -> Optional[bytes]:
    """A device spec as the C string clattn_create and clattn_select_device take (None reads
    CLATTN_DEVICE); ValueError for anything but None or a str."""
    if spec is not None and not isinstance(spec, str):
        raise ValueError(f"{name} must be None or a device spec string (\"gpu\", \"cpu\", \"accelerator\", "
                         f"\"P:D\" or a name substring), got {spec!r}")
    return spec.encode() if spec else None


def _window_pair(window: Any) -> Tuple[int, int]:
    """window=(left, right) as the descriptor's two fields (None: unbounded, -1); ValueError for
    anything but a pair of ints or None."""
    try:
        left, right = window
        return (-1 if left is None else _int("window", left)), (-1 if right is None else _int("window", right))
    except (TypeError, ValueError):
        raise ValueError(f"window is a pair (left, right) of ints or None (got {window!r})") from None


def _algorithm(algorithm: str) -> int:
    """The descriptor's algorithm field of "auto", "fused" or "unfused" (ValueError otherwise)."""
    try:
        return _ALGORITHMS[algorithm]
    except (KeyError, TypeError):
        raise ValueError(f"algorithm must be one of {', '.join(_ALGORITHMS)} (got {algorithm!r})") from None


def _host_array(a: Any, dtype: str) -> np.ndarray:
    """a as a C-contiguous array in the storage format of dtype."""
    arr = np.asarray(a)
    if dtype == "bf16":
        if arr.dtype == np.uint16:
            return np.ascontiguousarray(arr)
        return to_bf16(arr)
    return np.ascontiguousarray(arr, dtype=DTYPES[dtype][2])


def _stored_dtype(x: Any, dt: str) -> Optional[str]:
    """The storage type of a numpy input that keeps its own (attention_backward's out and dout):
    float16 stays f16, uint16 is bf16 bit patterns (only with inputs of dtype bf16), other floats
    are f32. None for a device tensor, which has its own."""
    if isinstance(x, DeviceTensor) or hasattr(x, "base_data"):
        return None
    a = np.asarray(x)
    if a.dtype == np.uint16 and dt == "bf16":
        return "bf16"
    return "f16" if a.dtype == np.float16 else "f32"


def _uint(name: str, value: Any, bits: int) -> int:
    """value as an unsigned integer of `bits` bits; ValueError outside that range (ctypes would
    wrap a negative or too large value silently)."""
    v = _int(name, value)
    if not 0 <= v < (1 << bits):
        raise ValueError(f"{name} is {value!r}: an unsigned {bits}-bit integer, 0 .. {(1 << bits) - 1}")
    return v


def _set_dropout(d: AttentionDesc, p: float, seed: Any, offset: Any) -> None:
    """The descriptor's dropout fields; the library checks p (0 <= p < 1)."""
    d.dropout_p = float(p)
    d.dropout_seed = _uint("dropout_seed", seed, 64)
    d.dropout_offset = _uint("dropout_offset", offset, 32)


def philox4x32_10(ctr: Sequence[int], key: Sequence[int]) -> Tuple[int, int, int, int]:
    """Philox-4x32-10 (Random123's philox4x32 with 10 rounds) of the counter ctr (4 uint32) and
    key (2 uint32), on the host (clattn_philox4x32_10): the generator behind dropout_p, whose
    decisions include/clattn.h derives from these four words (at dropout_seed). Returns 4 ints."""
    ctr, key = list(ctr), list(key)
    if len(ctr) != 4 or len(key) != 2:
        raise ValueError(f"philox4x32_10 takes 4 counter words and 2 key words (got {len(ctr)} and {len(key)})")
    c = (ctypes.c_uint32 * 4)(*(_uint("ctr", x, 32) for x in ctr))
    k = (ctypes.c_uint32 * 2)(*(_uint("key", x, 32) for x in key))
    o = (ctypes.c_uint32 * 4)()
    _lib.need("clattn_philox4x32_10")(c, k, o)
    return (int(o[0]), int(o[1]), int(o[2]), int(o[3]))


# ---- devices --------------------------------------------------------------------------------------


def _info_str(getter, obj: int, param: int) -> str:
    size = c_size_t(0)
    if getter(obj, param, 0, None, byref(size)) != 0 or size.value == 0:
        return ""
    buf = ctypes.create_string_buffer(size.value + 1)
    if getter(obj, param, size.value, buf, None) != 0:
        return ""
    return buf.value.decode("utf-8", "replace").strip()


def _platforms() -> List[int]:
    cl = _lib.cl()
    n = c_uint(0)
    err = cl.clGetPlatformIDs(0, None, byref(n))
    if err == _CL_PLATFORM_NOT_FOUND_KHR or n.value == 0:
        return []
    _check_cl(err, "clGetPlatformIDs")
    ids = (c_void_p * n.value)()
    _check_cl(cl.clGetPlatformIDs(n.value, ids, None), "clGetPlatformIDs")
    return [int(i or 0) for i in ids]


def _devices_of(platform: int) -> List[int]:
    cl = _lib.cl()
    n = c_uint(0)
    err = cl.clGetDeviceIDs(platform, _CL_DEVICE_TYPE_ALL, 0, None, byref(n))
    if err != 0 or n.value == 0:
        return []
    ids = (c_void_p * n.value)()
    if cl.clGetDeviceIDs(platform, _CL_DEVICE_TYPE_ALL, n.value, ids, None) != 0:
        return []
    return [int(i or 0) for i in ids]


def _type_name(bits: int) -> str:
    names = [(4, "GPU"), (2, "CPU"), (8, "ACCELERATOR"), (16, "CUSTOM"), (1, "DEFAULT")]
    got = [n for b, n in names if bits & b]
    return "|".join(got) if got else hex(bits)


def _device_type(device: int) -> str:
    v = ctypes.c_uint64(0)
    if _lib.cl().clGetDeviceInfo(device, _CL_DEVICE_TYPE, 8, byref(v), None) != 0:
        return "n/a"
    return _type_name(v.value)


def _spec_of(device: int) -> str:
    for p, plat in enumerate(_platforms()):
        for d, dev in enumerate(_devices_of(plat)):
            if dev == device:
                return f"{p}:{d}"
    return ""


class Device(NamedTuple):
    """One OpenCL device as clattn numbers it."""

    spec: str        #: "P:D", a device spec clattn_create takes
    platform: str    #: the platform's name
    name: str        #: the device's name
    type: str        #: "GPU", "CPU", "ACCELERATOR", ...
    default: bool    #: whether clattn_create(None) picks it (CLATTN_DEVICE, else the first GPU, else any)


class SelectedDevice(str):
    """The "P:D" spec of a selected device (a str), with its name and the library's reason."""

    name: str
    why: str

    def __new__(cls, spec: str, name: str, why: str) -> "SelectedDevice":
        s = super().__new__(cls, spec)
        s.name = name
        s.why = why
        return s


def _select(spec: Optional[str]) -> Tuple[int, int, str]:
    L = _lib.lib()
    plat, dev = c_void_p(), c_void_p()
    why = ctypes.create_string_buffer(512)
    st = L.clattn_select_device(_device_spec("spec", spec), byref(plat), byref(dev), why, 512)
    if st != 0:
        _raise(st, None)
    return int(plat.value or 0), int(dev.value or 0), why.value.decode("utf-8", "replace")


def select_device(spec: Optional[str] = None) -> SelectedDevice:
    """Resolves a device spec exactly as Context(spec) would, creating nothing.

    spec: None or "" reads CLATTN_DEVICE, then "gpu", "cpu", "accelerator", "P:D", or a
    case-insensitive substring of the platform or device name.

    Returns the device's "P:D" spec (a str) with ``.name`` and ``.why`` (the library's reason).
    Raises ClattnError (NO_DEVICE, UNSUPPORTED, INVALID_ARGUMENT) when nothing matches.
    """
    _, dev, why = _select(spec)
    return SelectedDevice(_spec_of(dev), _info_str(_lib.cl().clGetDeviceInfo, dev, _CL_DEVICE_NAME), why)


def devices() -> List[Device]:
    """Every OpenCL device the ICD loader shows, with its "P:D" spec and whether it is the default.

    An empty list when no OpenCL platform is installed.
    """
    try:
        _, default_dev, _ = _select(None)
    except ClattnError:
        default_dev = 0
    out = []
    cl = _lib.cl()
    for p, plat in enumerate(_platforms()):
        pname = _info_str(cl.clGetPlatformInfo, plat, _CL_PLATFORM_NAME)
        for d, dev in enumerate(_devices_of(plat)):
            out.append(Device(f"{p}:{d}", pname, _info_str(cl.clGetDeviceInfo, dev, _CL_DEVICE_NAME),
                              _device_type(dev), dev == default_dev))
    return out


def version() -> str:
    """The linked library's version, "MAJOR.MINOR.PATCH" (clattn_version_string)."""
    return decode(_lib.lib().clattn_version_string())


def version_number() -> int:
    """MAJOR*10000 + MINOR*100 + PATCH of the linked library."""
    return int(_lib.lib().clattn_version_number())


def alibi_slopes(heads: int, max_bias: float = 8.0) -> np.ndarray:
    """The standard ALiBi slopes (BLOOM's and ggml's formula) of `heads` heads, float32[heads].

    Pass them as ``alibi_slopes=`` (a 1-D array of heads_q values is taken as [1][heads_q][1][1]).
    """
    heads = _int("heads", heads)
    out = np.zeros(max(heads, 0), dtype=np.float32)
    st = _lib.lib().clattn_alibi_slopes(heads, float(max_bias),
                                        out.ctypes.data_as(ctypes.POINTER(c_float)) if out.size else None)
    if st != 0:
        _raise(st, None)
    return out


# ---- device tensors ---------------------------------------------------------------------------------


class DeviceTensor:
    """A tensor in an OpenCL buffer of a context: a [batch][heads][seq][dim] view (clattn_tensor).

    Made by :meth:`Context.empty`, :meth:`Context.to_device`, :meth:`view`, the operations (their
    outputs), or :meth:`Context.wrap` around a pyopencl array or buffer (zero-copy). Element
    (b, h, s, d) lives at ``offset + b*strides[0] + h*strides[1] + s*strides[2] + d``, counts in
    elements. The buffer is released when the last tensor on it goes (or :meth:`release`).

    1-D "i32" tensors hold kv_lengths; every other tensor is 4-D.
    """

    __slots__ = ("_ctx", "_mem", "_base", "_keep", "_owns", "dtype", "shape", "strides", "offset",
                 "_view", "_nbytes", "__weakref__")

    def __init__(self, ctx: "Context", mem: int, dtype: str, shape: Sequence[int],
                 strides: Optional[Sequence[int]] = None, offset: int = 0,
                 base: Optional["DeviceTensor"] = None, owns: bool = True, keep: Any = None) -> None:
        self._ctx = ctx
        self._mem = mem
        self._base = base
        self._keep = keep
        self._owns = owns and base is None
        self._nbytes: Optional[int] = None   # the buffer's size, asked once (on the base: _buffer_bytes)
        self.dtype: str = dtype
        self.shape: Tuple[int, ...] = tuple(int(s) for s in shape)
        if strides is None:
            strides = _contiguous_strides(self.shape)
        self.strides: Tuple[int, ...] = tuple(int(s) for s in strides)
        self.offset: int = int(offset)
        st = Tensor()
        st.buffer = mem
        st.dtype = DTYPES[dtype][0]
        st.offset = self.offset
        if len(self.shape) == 4:
            st.shape[:] = self.shape
            st.stride[:] = self.strides
        self._view = st

    def _live(self) -> int:
        """The cl_mem handle; ValueError once this tensor or the tensor it views was released (the
        handle would reach OpenCL freed)."""
        t: Optional[DeviceTensor] = self
        while t is not None:
            if not t._mem:
                raise ValueError("this DeviceTensor's buffer was released (release() on it or on the "
                                 "tensor it views)")
            t = t._base
        return self._mem

    @property
    def _st(self) -> Tensor:
        """The clattn_tensor a C call takes (ValueError once released)."""
        self._live()
        return self._view

    # -- properties
    @property
    def context(self) -> "Context":
        """The context whose OpenCL context holds the buffer."""
        return self._ctx

    @property
    def cl_mem(self) -> int:
        """The cl_mem handle (an int), for interop; owned by this tensor (or the object it wraps)."""
        return self._mem

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return DTYPES[self.dtype][1]

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy type of the stored elements (uint16 for bf16)."""
        return DTYPES[self.dtype][2]

    @property
    def size(self) -> int:
        """Number of elements in the view."""
        return math.prod(self.shape)   # not np.prod: 3 µs, and view() checks every view's span

    def is_contiguous(self) -> bool:
        """Whether the view is dense row-major ([b][h][s][d] with no gaps)."""
        want = _contiguous_strides(self.shape)
        return all(n == 1 or s == w for n, s, w in zip(self.shape, self.strides, want))

    def __repr__(self) -> str:
        extra = "" if self.is_contiguous() and self.offset == 0 else f", offset={self.offset}, strides={self.strides}"
        return f"DeviceTensor(shape={self.shape}, dtype={self.dtype!r}{extra})"

    # -- views
    def view(self, offset: Optional[int] = None, shape: Optional[Sequence[int]] = None,
             strides: Optional[Sequence[int]] = None) -> "DeviceTensor":
        """Another view of the same buffer (no copy), as a clattn_tensor describes one.

        offset: element index of (0, 0, 0, 0) in the buffer (absolute, not relative to this view);
        default this view's. shape: 4 extents, default this view's. strides: 3 element strides
        (batch, head, seq), default this view's. ValueError when the view reaches outside the
        buffer (a negative offset or stride, an extent past its end).
        """
        if len(self.shape) != 4:
            raise ValueError("view() needs a 4-D tensor")
        shape = _extents("view shape", self.shape if shape is None else shape, self.dtype)
        strides = tuple(_int("view strides: each", s) for s in (self.strides if strides is None else strides))
        if len(strides) != 3 or min(strides) < 0:
            raise ValueError(f"view strides {strides}: a view has 3 non-negative strides (batch, head, seq)")
        offset = self.offset if offset is None else _int("view offset", offset)
        t = DeviceTensor(self._ctx, self._live(), self.dtype, shape, strides, offset, base=self._base or self,
                         keep=self._keep)
        return t._within_buffer("view")

    def _within_buffer(self, what: str) -> "DeviceTensor":
        """self, or a ValueError naming `what` (view, wrap) where the view reaches outside its buffer."""
        lo, hi = self._span()
        n = self._buffer_bytes() // self.itemsize
        if lo < 0 or hi > n:
            raise ValueError(f"{what} offset {self.offset}, shape {tuple(self.shape)}, strides {self.strides} reaches "
                             f"elements {lo}..{hi - 1} of a buffer of {n} {self.dtype} elements")
        return self

    def _buffer_bytes(self) -> int:
        """The size of the buffer this tensor views, asked of OpenCL once and kept on the base tensor
        (all views of a buffer share it)."""
        base = self._base or self
        if base._nbytes is None:
            size = c_size_t(0)
            _check_cl(_lib.cl().clGetMemObjectInfo(self._live(), _CL_MEM_SIZE, ctypes.sizeof(size), byref(size),
                                                   None), "clGetMemObjectInfo")
            base._nbytes = size.value
        return base._nbytes

    def seq(self, start: int, stop: int) -> "DeviceTensor":
        """The view of sequence positions start..stop-1 (a KV cache's first n keys: seq(0, n))."""
        start, stop = _int("seq start", start), _int("seq stop", stop)
        if len(self.shape) != 4 or not 0 <= start <= stop <= self.shape[2]:
            raise ValueError(f"seq({start}, {stop}) is outside 0..{self.shape[2] if len(self.shape) == 4 else '?'}")
        # a part of this view, so inside the buffer as this view is: view()'s check is not needed (a
        # decode loop takes two of these per step)
        return DeviceTensor(self._ctx, self._live(), self.dtype, (self.shape[0], self.shape[1], stop - start,
                            self.shape[3]), self.strides, self.offset + start * self.strides[2],
                            base=self._base or self, keep=self._keep)

    # -- host transfers
    def _span(self) -> Tuple[int, int]:
        """First and one-past-last element the view touches."""
        if self.size == 0:
            return self.offset, self.offset
        if len(self.shape) != 4:
            return self.offset, self.offset + self.size
        last = self.offset + sum((n - 1) * s for n, s in zip(self.shape[:3], self.strides) if s > 0) + self.shape[3]
        lo = self.offset + sum((n - 1) * s for n, s in zip(self.shape[:3], self.strides) if s < 0)
        return lo, last

    def numpy(self, raw: bool = False) -> np.ndarray:
        """Reads the view back (blocking; after every command enqueued before on the queue).

        Returns float32 for f32 and bf16 (bf16 widened exactly; raw=True gives the uint16 bit
        patterns), float16 for f16, int32 for i32.
        """
        q = self._ctx._queue_handle()
        es = self.itemsize
        lo, hi = self._span()
        host = np.empty(max(hi - lo, 0), dtype=self.numpy_dtype)
        if host.size:
            _check_cl(_lib.cl().clEnqueueReadBuffer(q, self._live(), 1, lo * es, host.nbytes, host.ctypes.data,
                                                    0, None, None), "clEnqueueReadBuffer")
        if len(self.shape) == 4 and not (self.is_contiguous() and lo == self.offset):
            st = [s * es for s in self.strides] + [es]
            host = np.lib.stride_tricks.as_strided(host[self.offset - lo:], shape=self.shape,
                                                   strides=st).copy()
        else:
            host = host.reshape(self.shape)
        if self.dtype == "bf16" and not raw:
            return from_bf16(host)
        return host

    def write(self, a: Any) -> "DeviceTensor":
        """Writes a whole array of this view's shape into the view (blocking). Returns self.

        Floats are converted to the storage type (bf16: rounded to nearest even; a uint16 array
        is taken as bf16 bit patterns); an "i32" tensor takes integers.
        """
        host = _host_array(*_host_data("write: the array", a, self.dtype, lengths=True))
        if host.shape != self.shape:
            raise ValueError(f"write: array shape {host.shape} differs from the tensor's {self.shape}")
        if host.size == 0:
            return self
        cl = _lib.cl()
        q = self._ctx._queue_handle()
        es = self.itemsize
        if len(self.shape) != 4 or self.is_contiguous():
            _check_cl(cl.clEnqueueWriteBuffer(q, self._live(), 1, self.offset * es, host.nbytes, host.ctypes.data,
                                              0, None, None), "clEnqueueWriteBuffer")
            return self
        B, H, S, D = self.shape
        sb, sh, ss = self.strides
        for dim, (n, s) in enumerate(zip((B, H, S), (sb, sh, ss))):
            if n > 1 and s == 0:
                raise ValueError("write: a view with a stride-0 (broadcast) dimension cannot be written")
        rows_dense = S == 1 or ss == D
        if ss < D and S > 1:
            raise ValueError("write: rows of the view overlap (seq stride below dim)")
        region = (c_size_t * 3)(D * es, S, 1)
        zero = (c_size_t * 3)(0, 0, 0)
        try:
            for b in range(B):
                for h in range(H):
                    off = (self.offset + b * sb + h * sh) * es
                    src = host[b, h]
                    if rows_dense:
                        err = cl.clEnqueueWriteBuffer(q, self._live(), 0, off, src.nbytes, src.ctypes.data,
                                                      0, None, None)
                        _check_cl(err, "clEnqueueWriteBuffer")
                    else:
                        origin = (c_size_t * 3)(off, 0, 0)
                        err = cl.clEnqueueWriteBufferRect(q, self._live(), 0, origin, zero, region, ss * es, 0,
                                                          D * es, 0, src.ctypes.data, 0, None, None)
                        _check_cl(err, "clEnqueueWriteBufferRect")
        finally:
            cl.clFinish(q)  # the host array must outlive the non-blocking writes
        return self

    def write_seq(self, a: Any, start: int) -> "DeviceTensor":
        """Writes a [B][H][n][D] array into sequence positions start..start+n-1 of this
        [B][H][S][D] tensor (a growing KV cache: the new keys of a step). Blocking. Returns self."""
        arr = np.asarray(a)
        if arr.ndim != 4 or len(self.shape) != 4:
            raise ValueError("write_seq takes a 4-D [B][H][n][D] array into a 4-D tensor")
        n = arr.shape[2]
        if start < 0 or start + n > self.shape[2]:
            raise ValueError(f"write_seq: positions {start}..{start + n - 1} are outside 0..{self.shape[2] - 1}")
        self.seq(start, start + n).write(arr)
        return self

    def fill(self, value: float = 0.0) -> "DeviceTensor":
        """Sets every element of a contiguous tensor to value (an integer within int32 for "i32";
        blocking). Returns self."""
        if not self.is_contiguous():
            raise ValueError("fill needs a contiguous tensor")
        if self.dtype == "i32":
            value = _int("fill: an 'i32' tensor's value", value)   # 1.5 refused, never truncated
            if not -2**31 <= value < 2**31:
                raise ValueError(f"fill: {value} is outside int32")
        self.write(np.full(self.shape, value, dtype=np.float32 if self.dtype != "i32" else np.int32))
        return self

    def to_pyopencl(self, queue: Any) -> Any:
        """This tensor as a pyopencl.array.Array on queue (zero-copy, retains the buffer)."""
        import pyopencl as pcl
        import pyopencl.array as pcla
        buf = pcl.Buffer.from_int_ptr(self._live(), retain=True)
        es = self.itemsize
        st = tuple(s * es for s in self.strides) + ((es,) if len(self.shape) == 4 else ())
        return pcla.Array(queue, self.shape, self.numpy_dtype, data=buf, offset=self.offset * es, strides=st)

    def release(self) -> None:
        """Releases the buffer now if this tensor owns it (views keep their base alive otherwise)."""
        mem, self._mem = self._mem, 0
        if mem and self._owns:
            try:
                _lib.cl().clReleaseMemObject(mem)
            except Exception:  # interpreter shutdown
                pass
        self._owns = False

    def __del__(self) -> None:
        if getattr(self, "_owns", False):
            self.release()


def _contiguous_strides(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    if len(shape) != 4:
        out, acc = [], 1
        for n in reversed(shape[1:]):
            acc *= n
            out.append(acc)
        return tuple(reversed(out))
    _, H, S, D = shape
    return (H * S * D, S * D, D)


TensorLike = Union[np.ndarray, DeviceTensor, Any]


# ---- context --------------------------------------------------------------------------------------


@dataclass
class ProgramStatistics:
    """clattn_program_stats: what getting the kernel programs has cost this context."""

    memory_hits: int
    disk_hits: int
    disk_rejects: int
    disk_writes: int
    builds: int
    build_seconds: float
    build_seconds_max: float
    build_slowest: str
    disk_untrusted: int


@dataclass
class Params:
    """The kernel parameters a problem class would use (clattn_get_params), and their origin."""

    operation: str
    values: Dict[str, int]
    source: str   #: "generic", "vendor", "built-in", "user file", "environment", "override"
    origin: str   #: e.g. the tuning file and its entry line
    kernel: Optional[str] = None  #: the DIRECT parameter's kernel name where it has one

    def __str__(self) -> str:
        vals = " ".join(f"{k}={v}" for k, v in self.values.items())
        return f"{vals}  [{self.source}: {self.origin}]"


def _op_index(op: Union[str, int]) -> int:
    try:
        o = OPERATIONS.index(op.lower()) if isinstance(op, str) else _int("op", op)
    except ValueError:
        o = -1
    if not 0 <= o < len(OPERATIONS):
        raise ValueError(f"unknown operation {op!r}: one of {', '.join(OPERATIONS)}, or its index")
    return o


class Context:
    """A clattn context: one OpenCL device, its in-order queue, kernel programs and tuning.

    ``Context(device=None)`` creates one with clattn_create: device None or "" reads
    CLATTN_DEVICE, then "gpu", "cpu", "accelerator", "P:D" or a name substring. Use it as a
    context manager or call :meth:`close`. One thread at a time per context (as in C).

    Operations take numpy arrays (copied in, computed, read back: blocking) or DeviceTensors
    (enqueued, not waited for; results are DeviceTensors; :meth:`DeviceTensor.numpy` waits).
    """

    def __init__(self, device: Optional[str] = None, *, _handle: Optional[int] = None) -> None:
        L = _lib.lib()
        self._h: Optional[int] = None
        self._keep: Any = None
        if _handle is not None:
            self._h = _handle
        else:
            h = c_void_p()
            st = L.clattn_create(_device_spec("device", device), byref(h))
            if st != 0:
                _raise(st, None)
            self._h = int(h.value)
        self._lib = L
        self._cl = _lib.cl()
        self._queue = int(L.clattn_queue(self._h) or 0)
        self._clctx = int(L.clattn_cl_context(self._h) or 0)

    @classmethod
    def from_queue(cls, queue: Any) -> "Context":
        """A context enqueueing on the caller's in-order queue: a pyopencl.CommandQueue or a raw
        cl_command_queue handle (int). The queue is retained; use the same queue for your own
        pyopencl work so that the order of commands is kept."""
        handle = getattr(queue, "int_ptr", queue)
        h = c_void_p()
        st = _lib.lib().clattn_create_from_queue(c_void_p(int(handle)), byref(h))
        if st != 0:
            _raise(st, None)
        ctx = cls(_handle=int(h.value))
        ctx._keep = queue
        return ctx

    # -- lifetime
    def close(self) -> None:
        """Releases the context (clattn_release). Tensors made on it keep their buffers."""
        h, self._h = self._h, None
        if h:
            try:
                self._lib.clattn_release(h)
            except Exception:
                pass

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_h", None):
            self.close()

    def _handle(self) -> int:
        if not self._h:
            raise ValueError("the clattn Context is closed")
        return self._h

    def _queue_handle(self) -> int:
        if not self._h:
            raise ValueError("the clattn Context is closed")
        return self._queue

    def _fail(self, st: int) -> None:
        _raise(st, self._h)

    # -- handles and reports
    @property
    def handle(self) -> int:
        """The clattn_context pointer (an int)."""
        return self._handle()

    @property
    def cl_queue(self) -> int:
        """The cl_command_queue handle (an int)."""
        return self._queue_handle()

    @property
    def cl_context(self) -> int:
        """The cl_context handle (an int)."""
        self._handle()
        return self._clctx

    @property
    def cl_device(self) -> int:
        """The cl_device_id handle (an int)."""
        return int(self._lib.clattn_device(self._handle()) or 0)

    @property
    def device_name(self) -> str:
        """The device's name (CL_DEVICE_NAME)."""
        return _info_str(self._cl.clGetDeviceInfo, self.cl_device, _CL_DEVICE_NAME)

    @property
    def device_spec(self) -> str:
        """The device's "P:D" spec ("" when the ICD loader lists it nowhere)."""
        return _spec_of(self.cl_device)

    @property
    def device_key(self) -> str:
        """The tuning store's key of the device (clattn_device_key)."""
        buf = ctypes.create_string_buffer(4096)
        st = self._lib.clattn_device_key(self.cl_device, buf, 4096)
        if st != 0:
            _raise(st, None)
        return buf.value.decode("utf-8", "replace")

    @property
    def matrix_report(self) -> str:
        """One line on the matrix units (clattn_matrix_report)."""
        return decode(self._lib.clattn_matrix_report(self._handle()))

    @property
    def cache_report(self) -> str:
        """One line on the kernel binary cache (clattn_cache_report)."""
        return decode(self._lib.clattn_cache_report(self._handle()))

    @property
    def tuning_report(self) -> str:
        """What reading the tuning store found (clattn_tuning_report)."""
        return decode(self._lib.clattn_tuning_report(self._handle()))

    @property
    def tuning_path(self) -> str:
        """The user tuning file of this device (it may not exist yet)."""
        buf = ctypes.create_string_buffer(8192)
        st = self._lib.clattn_tuning_path(self._handle(), buf, 8192)
        if st != 0:
            self._fail(st)
        return buf.value.decode("utf-8", "replace")

    def reload_tuning(self) -> None:
        """Re-reads the user tuning file (clattn_reload_tuning)."""
        st = self._lib.clattn_reload_tuning(self._handle())
        if st != 0:
            self._fail(st)

    def program_stats(self) -> ProgramStatistics:
        """Kernel builds and cache hits so far (clattn_get_program_stats)."""
        s = ProgramStats()
        st = self._lib.clattn_get_program_stats(self._handle(), byref(s))
        if st != 0:
            self._fail(st)
        return ProgramStatistics(s.memory_hits, s.disk_hits, s.disk_rejects, s.disk_writes, s.builds,
                                 s.build_seconds, s.build_seconds_max,
                                 s.build_slowest.decode("utf-8", "replace"), s.disk_untrusted)

    def finish(self) -> None:
        """Waits for everything enqueued on the context's queue (clFinish)."""
        _check_cl(self._cl.clFinish(self._queue_handle()), "clFinish")

    # -- parameters
    def get_params(self, op: Union[str, int], dtype: str = "f32", head_dim: int = 64, seq_q: int = 1024,
                   seq_kv: int = 1024, causal: bool = False, masked: bool = False, *,
                   heads_q: Optional[int] = None, heads_kv: Optional[int] = None,
                   head_dim_v: int = 0) -> Params:
        """The parameters a call of this problem class would use now, and where they come from.

        op: "scores", "pv", "softmax", "fused", "decode" or "merge". head_dim is ignored (0) for
        softmax and merge. With heads_q and heads_kv, answers as clattn_get_call_params (decode
        counts packed query rows).
        """
        o = _op_index(op)
        pc = ProblemClass()
        pc.operation = o
        pc.dtype = DTYPES[_float_dtype("dtype", dtype)][0]
        pc.head_dim = 0 if OPERATIONS[o] in ("softmax", "merge") else head_dim
        pc.seq_q, pc.seq_kv, pc.causal, pc.masked = seq_q, seq_kv, int(causal), int(masked)
        kp = KernelParams()
        if heads_q is not None or heads_kv is not None:
            hq = heads_q if heads_q is not None else heads_kv
            hkv = heads_kv if heads_kv is not None else heads_q
            st = self._lib.clattn_get_call_params(self._handle(), byref(pc), hq, hkv, head_dim_v, byref(kp))
        else:
            st = self._lib.clattn_get_params(self._handle(), byref(pc), byref(kp))
        if st != 0:
            self._fail(st)
        L = self._lib
        values = {decode(L.clattn_param_name(o, i)): int(kp.values[i]) for i in range(kp.count)}
        kernel = None
        for i in range(kp.count):
            name = L.clattn_param_value_name(o, i, kp.values[i])
            if name:
                kernel = decode(name)
        return Params(OPERATIONS[o], values, decode(L.clattn_params_source_name(kp.source)),
                      kp.origin.decode("utf-8", "replace"), kernel)

    def set_params(self, op: Union[str, int], values: Union[None, Sequence[int], Dict[str, Union[int, str]]]) -> None:
        """Overrides the parameters of op for every later call on this context.

        values: a full list in the operation's order (clattn_param_name), or a dict by name whose
        missing names keep the values get_params gives now (a kernel choice may be given by its
        name, {"DIRECT": "lanes"}), or None to remove the override.
        """
        o = _op_index(op)
        L = self._lib
        if values is None:
            st = L.clattn_set_params(self._handle(), o, None, 0)
            if st != 0:
                self._fail(st)
            return
        n = L.clattn_param_count(o)
        names = [decode(L.clattn_param_name(o, i)) for i in range(n)]
        if isinstance(values, dict):
            current = self.get_params(o).values
            vals = []
            unknown = set(values) - set(names)
            if unknown:
                raise ValueError(f"unknown parameter(s) {sorted(unknown)} of {OPERATIONS[o]}: {', '.join(names)}")
            for i, name in enumerate(names):
                v = values.get(name, current.get(name, 0))
                if isinstance(v, str):
                    for cand in range(L.clattn_param_max(o, i) + 1):
                        if decode(L.clattn_param_value_name(o, i, cand)) == v:
                            v = cand
                            break
                    else:
                        raise ValueError(f"{name}={v!r} names no kernel of {OPERATIONS[o]}")
                vals.append(_int(f"{OPERATIONS[o]} parameter {name}", v, bools=True))
        elif isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise ValueError(f"values is a list of {OPERATIONS[o]}'s parameters in order ({', '.join(names)}), "
                             f"a dict by name or None (got {values!r})")
        else:
            vals = [_int(f"{OPERATIONS[o]} parameter {names[i] if i < n else i}", v, bools=True)
                    for i, v in enumerate(values)]
        arr = (c_int * max(len(vals), 1))(*vals)
        st = L.clattn_set_params(self._handle(), o, arr, len(vals))
        if st != 0:
            self._fail(st)

    # -- tensors
    def _alloc(self, nbytes: int, host: Optional[np.ndarray] = None) -> int:
        err = c_int32(0)
        flags = _CL_MEM_READ_WRITE | (_CL_MEM_COPY_HOST_PTR if host is not None else 0)
        mem = self._cl.clCreateBuffer(self.cl_context, flags, max(nbytes, 1),
                                      host.ctypes.data if host is not None else None, byref(err))
        if err.value != 0 or not mem:
            code = Status.OUT_OF_MEMORY if err.value in (-4, -5, -6, -61) else Status.OPENCL_ERROR
            raise ClattnError(code, f"clCreateBuffer of {nbytes} bytes failed (OpenCL error {err.value})",
                              cl_error=err.value)
        return int(mem)

    def empty(self, shape: Sequence[int], dtype: str = "f32") -> DeviceTensor:
        """A new contiguous device tensor of shape ([B, H, S, D], or [B] for "i32"), contents
        undefined."""
        name = _dtype_name(dtype)
        shape = _extents("shape", shape, name)
        return DeviceTensor(self, self._alloc(int(np.prod(shape)) * DTYPES[name][1]), name, shape)

    def zeros(self, shape: Sequence[int], dtype: str = "f32") -> DeviceTensor:
        """A new contiguous device tensor of zeros."""
        name = _dtype_name(dtype)
        return self.to_device(np.zeros(_extents("shape", shape, name), dtype=DTYPES[name][2]), name)

    def to_device(self, a: Any, dtype: Optional[str] = None) -> DeviceTensor:
        """Copies a host array into a new contiguous device tensor (blocking).

        dtype: "f32", "f16", "bf16" (or "i32"); default from the array (float64 -> f32, int -> i32;
        a uint16 array needs dtype="bf16"). Floats are converted, bf16 rounded to nearest even.
        A float tensor takes a 4-D float array, an "i32" one a 1-D integer array (ValueError else).
        """
        if isinstance(a, DeviceTensor):
            if dtype is not None and _dtype_name(dtype) != a.dtype:
                raise ValueError(f"to_device: the tensor is already on the device as {a.dtype}, not {dtype!r} "
                                 "(no conversion on the device: a.numpy() and to_device that)")
            return a
        return self._upload(*_host_data("the array", a, dtype, lengths=True))

    def _upload(self, arr: np.ndarray, dtype: str) -> DeviceTensor:
        """A checked host array (_host_data) in a new device tensor of storage type dtype."""
        host = _host_array(arr, dtype)
        return DeviceTensor(self, self._alloc(host.nbytes, host), dtype, host.shape)

    def wrap(self, obj: Any, shape: Optional[Sequence[int]] = None, dtype: Optional[str] = None,
             strides: Optional[Sequence[int]] = None, offset: int = 0) -> DeviceTensor:
        """A DeviceTensor viewing someone else's buffer, zero-copy: a pyopencl.array.Array (shape,
        strides, offset and dtype taken from it), or a pyopencl.Buffer / raw cl_mem int with shape
        (and dtype, strides in elements, offset in elements), checked against the buffer's size as
        view() is. The object is kept alive by the tensor and never released by it. It must live in
        this context's OpenCL context."""
        if isinstance(obj, DeviceTensor):
            return obj
        if hasattr(obj, "base_data") and hasattr(obj, "strides") and hasattr(obj, "queue"):  # pyopencl Array
            a = obj
            name = _dtype_name(dtype if dtype is not None else a.dtype)
            if (a.dtype != np.uint16 and _dtype_name(a.dtype) != name) or a.dtype.itemsize != DTYPES[name][1]:
                # (uint16: bf16 bits, which dtype="bf16" names; float64 has no device type)
                raise ValueError(f"a pyopencl array of {a.dtype} cannot be read as {name} (no conversion on the "
                                 "device)")
            es = DTYPES[name][1]
            if a.ndim != 4:
                raise ValueError(f"a pyopencl array for clattn must be 4-D [B][H][S][D] (got {a.shape})")
            if a.strides[3] != es:
                raise ValueError("the last dimension of a pyopencl array must be contiguous")
            st = [s // es for s in a.strides[:3]]
            return DeviceTensor(self, int(a.base_data.int_ptr), name, a.shape, st, a.offset // es,
                                owns=False, keep=a)
        if shape is None:
            raise ValueError("wrap: a buffer needs shape=")
        handle = int(getattr(obj, "int_ptr", obj))
        name = _dtype_name(dtype or "f32")
        shape = _extents("shape", shape, name)
        if strides is not None:
            strides = tuple(_int("strides: each", s) for s in strides)
        return DeviceTensor(self, handle, name, shape, strides, _int("offset", offset), owns=False,
                            keep=obj)._within_buffer("wrap:")

    def _tensor(self, x: Any, dtype: Optional[str], temps: list, name: str) -> DeviceTensor:
        """x, the attention data of argument `name`, as a DeviceTensor: itself, a wrapped pyopencl
        array, or a host upload of storage type dtype (kept in temps). ValueError, naming the
        argument, for an "i32" tensor or host data that is not 4-D floats (_host_data)."""
        if isinstance(x, DeviceTensor) or (hasattr(x, "base_data") and hasattr(x, "queue")):
            try:
                t = x if isinstance(x, DeviceTensor) else self.wrap(x, dtype=dtype)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
            if t.dtype == "i32":
                raise ValueError(f"{name} is an 'i32' tensor, which holds kv_lengths: attention data are f32, f16 "
                                 "or bf16")
            return t
        t = self._upload(*_host_data(name, x, dtype))
        temps.append(t)
        return t

    def _small(self, x: Any, heads: int, temps: list, name: str) -> DeviceTensor:
        """sinks / alibi_slopes: a 1-D array of per-head values becomes f32 [1][heads][1][1]."""
        if isinstance(x, DeviceTensor) or hasattr(x, "base_data"):
            return self._tensor(x, "f32", temps, name)
        arr = np.asarray(x)
        if arr.dtype.kind in "iu" and not isinstance(x, np.ndarray):
            arr = np.asarray(x, dtype=np.float64)   # a list of Python ints ([0, 0]): per-head values
        if arr.ndim == 1:
            arr = arr.reshape(1, -1, 1, 1)
        elif arr.ndim == 2:
            arr = arr.reshape(arr.shape[0], arr.shape[1], 1, 1)
        return self._tensor(arr, "f32", temps, name)

    def _kvlen(self, x: Any, batch: int, temps: list) -> int:
        """kv_lengths as the cl_mem the descriptor takes: `batch` values, exactly from the host, at least
        in a device buffer (ValueError else)."""
        if x is None:
            return 0
        if isinstance(x, DeviceTensor):
            if x.dtype != "i32" or x.offset != 0:
                raise ValueError("kv_lengths as a DeviceTensor must be an 'i32' tensor at offset 0")
            n, mem = x.size, x._live()
        elif hasattr(x, "base_data"):  # pyopencl array
            if x.offset != 0 or x.dtype != np.int32:
                raise ValueError("kv_lengths as a pyopencl array must be int32 and start at offset 0")
            n, mem = x.size, int(x.base_data.int_ptr)
        else:
            # Integers only, clamped into int32 here (the library clamps to 0..seq_kv): a cast would
            # wrap 2**32 + 3 to 3, truncate 5.7 to 5.
            vals = [min(max(_int("kv_lengths holds integers: each value", v), 0), 2**31 - 1)
                    for v in np.asarray(x, dtype=object).reshape(-1)]
            n, mem = len(vals), None
        if mem is None and n != batch:
            raise ValueError(f"kv_lengths has {n} values: it needs exactly batch ({batch}), one per batch entry")
        if n < batch:  # a device buffer may be longer (a server's, sized for its largest batch): the first batch
            raise ValueError(f"kv_lengths has {n} values: it needs batch ({batch}), one per batch entry")
        if mem is None:
            x = self._upload(np.array(vals, dtype=np.int32), "i32")
            mem = x.cl_mem
        temps.append(x)
        return mem

    def _out(self, given: Any, shape: Tuple[int, ...], dtype: str, temps: list,
             name: str) -> Tuple[DeviceTensor, Optional[np.ndarray]]:
        """The output tensor of argument `name`: a given DeviceTensor / pyopencl array, a numpy
        array to fill after the call (_fill_target), or a new one."""
        if given is None or given is True:
            return self.empty(shape, dtype), None
        if isinstance(given, np.ndarray):
            host = _fill_target(name, given, shape)
            return self.empty(shape, dtype), host
        if not (isinstance(given, DeviceTensor) or hasattr(given, "base_data")):
            raise ValueError(f"{name} is a DeviceTensor, a pyopencl array or a numpy array to fill (got "
                             f"{type(given).__name__})")
        return self._tensor(given, None, temps, name), None

    @staticmethod
    def _deliver(t: DeviceTensor, host: Optional[np.ndarray], as_numpy: bool) -> Any:
        if host is not None:
            host[...] = t.numpy()
            return host
        if as_numpy:
            return t.numpy()
        return t

    # -- operations
    def attention(self, q: TensorLike, k: TensorLike, v: TensorLike, *, causal: bool = False,
                  scale: float = 0.0, mask: Optional[TensorLike] = None, kv_lengths: Any = None,
                  lse: Any = False, probabilities: Any = False, algorithm: str = "auto",
                  head_dim_v: Optional[int] = None,
                  window: Optional[Tuple[Optional[int], Optional[int]]] = None, chunk: int = 0,
                  softcap: float = 0.0, sinks: Optional[TensorLike] = None,
                  alibi_slopes: Optional[TensorLike] = None, score_mod: Optional[str] = None,
                  mask_mod: Optional[str] = None, q_offset: int = 0, k_offset: int = 0,
                  dropout_p: float = 0.0, dropout_seed: int = 0, dropout_offset: int = 0,
                  out: Any = None, dtype: Optional[str] = None) -> Any:
        """softmax(Q·Kᵀ·scale + mask)·V (clattn_attention), with every option of the C descriptor.

        q: [B][Hq][Sq][D], k: [B][Hkv][Skv][D], v: [B][Hkv][Skv][Dv], Hkv dividing Hq (grouped
        query: head h reads kv head h // (Hq/Hkv)); numpy arrays, DeviceTensors or pyopencl arrays.
        dtype: the storage type for numpy inputs ("f32", "f16", "bf16"; default from q).

        causal: bottom-right aligned (row i sees key j iff j <= i + L - Sq, L the batch's keys).
        scale: 0 means 1/sqrt(D). mask: additive f32/f16 [B|1][Hq|1][Sq|1][Skv], -inf hides.
        kv_lengths: per-batch int32 key counts (a sequence, array, or 'i32' DeviceTensor).
        lse: True (or a tensor/array to write) for the f32 [B][Hq][Sq][1] log-sum-exp (what
        :meth:`attention_backward` needs).
        probabilities: True (or a tensor/array) for the [B][Hq][Sq][Skv] softmax (unfused path).
        algorithm: "auto", "fused" or "unfused". head_dim_v: defaults to v's last extent.
        window: (left, right) sliding window around the diagonal position, None or negative
        unbounded. chunk: chunked local attention. softcap: c·tanh(x/c) of the scaled logits.
        sinks: f32 per query head ([Hq] or [1][Hq][1][1]). alibi_slopes: f32 [Hq],
        [1|B][Hq] or [B|1][Hq][1][1]. score_mod / mask_mod: OpenCL C source text
        (docs/variants.md). q_offset / k_offset: the call is a slice of a longer sequence
        (docs/usage.md#slices). dropout_p: drop each probability with this chance and scale the
        kept ones by 1/(1 - dropout_p) (fused path); the decisions are a pure function of
        dropout_seed (uint64), dropout_offset (uint32: change it every step), the batch, head,
        row and key (:meth:`dropout_mask` writes them out). out: where to write the result
        (DeviceTensor, pyopencl array or numpy array).

        Returns out, or a tuple (out, lse?, probabilities?) of those asked for. With numpy q the
        results are numpy arrays (bf16 read back as float32) and the call blocks; with device q
        they are DeviceTensors and the call only enqueues.
        """
        h = self._handle()
        temps: list = []
        as_numpy, tq, tk, tv = self._qkv(q, k, v, dtype, temps)
        B, Hq, Sq, _ = tq.shape
        Skv = tk.shape[2]
        d = self._attention_desc(tq, tk, tv, temps, causal, scale, algorithm, head_dim_v, mask, kv_lengths,
                                 window, chunk, softcap, sinks, alibi_slopes, score_mod, mask_mod, q_offset,
                                 k_offset, dropout_p, dropout_seed, dropout_offset)
        t_out, host_out = self._out(out, (B, Hq, Sq, head_dim_v or tv.shape[3]), tq.dtype, temps, "out")
        t_lse = host_lse = t_p = host_p = None
        if lse is not False and lse is not None:
            t_lse, host_lse = self._out(lse, (B, Hq, Sq, 1), "f32", temps, "lse")
            d.lse = pointer(t_lse._st)
        if probabilities is not False and probabilities is not None:
            t_p, host_p = self._out(probabilities, (B, Hq, Sq, Skv), "f32", temps, "probabilities")
            d.probabilities = pointer(t_p._st)
        st = self._lib.clattn_attention(h, byref(d), tq._st, tk._st, tv._st, t_out._st, 0, None, None)
        if st != 0:
            self._fail(st)
        result = self._deliver(t_out, host_out, as_numpy)
        if t_lse is None and t_p is None:
            return result
        res = [result]
        if t_lse is not None:
            res.append(self._deliver(t_lse, host_lse, as_numpy))
        if t_p is not None:
            res.append(self._deliver(t_p, host_p, as_numpy))
        return tuple(res)

    def attention_backward(self, q: TensorLike, k: TensorLike, v: TensorLike, out: TensorLike,
                           dout: TensorLike, lse: TensorLike, *, causal: bool = False, scale: float = 0.0,
                           mask: Optional[TensorLike] = None, kv_lengths: Any = None, algorithm: str = "auto",
                           head_dim_v: Optional[int] = None,
                           window: Optional[Tuple[Optional[int], Optional[int]]] = None, chunk: int = 0,
                           softcap: float = 0.0, sinks: Optional[TensorLike] = None,
                           alibi_slopes: Optional[TensorLike] = None, score_mod: Optional[str] = None,
                           mask_mod: Optional[str] = None, q_offset: int = 0, k_offset: int = 0,
                           dropout_p: float = 0.0, dropout_seed: int = 0, dropout_offset: int = 0,
                           dq: Any = None, dk: Any = None, dv: Any = None, dsinks: Any = None,
                           dtype: Optional[str] = None, grad_dtype: Optional[str] = None) -> Any:
        """The gradients of :meth:`attention` (clattn_attention_backward): given its inputs q, k, v,
        its output `out`, its LSE `lse` (f32 [B][Hq][Sq][1] or [B][Hq][Sq], from ``lse=True``) and
        the gradient `dout` of a loss with respect to out, returns (dq, dk, dv), shaped as q, k and
        v, and with `sinks` also dsinks (the loss's gradient with respect to the sinks).

        Every option is attention's and must be what the forward call was given (the same
        dropout_seed and dropout_offset regenerate the same dropout decisions), so one dict of
        options serves both calls; score_mod and algorithm "unfused" are refused by the library
        (CLATTN_UNSUPPORTED: score_mod's derivative cannot be known). dtype: the storage type of
        numpy q, k, v (default from q); out and dout keep their own (f32 or f16 arrays, bf16 bit
        patterns with dtype "bf16"). grad_dtype: the gradients' type, the inputs' (default) or
        "f32". dq, dk, dv: where to write them (DeviceTensor, pyopencl array or numpy array);
        dsinks likewise (a numpy array of the sinks' shape), or False for none when the sinks are
        not trained.

        Numpy q: numpy results (dsinks in the shape the sinks were given) and the call blocks;
        device q: DeviceTensors (dsinks [1][Hq][1][1]) and the call only enqueues. The gradients
        are bitwise repeatable on a device with the same kernel parameters.
        """
        fn = _lib.need("clattn_attention_backward")
        h = self._handle()
        temps: list = []
        as_numpy, tq, tk, tv = self._qkv(q, k, v, dtype, temps)
        dt = tq.dtype
        gdt = dt if grad_dtype is None else _float_dtype("grad_dtype", grad_dtype)
        d = self._attention_desc(tq, tk, tv, temps, causal, scale, algorithm, head_dim_v, mask, kv_lengths,
                                 window, chunk, softcap, sinks, alibi_slopes, score_mod, mask_mod, q_offset,
                                 k_offset, dropout_p, dropout_seed, dropout_offset)
        B, Hq, Sq, _ = tq.shape
        t_o = self._tensor(out, _stored_dtype(out, dt), temps, "out")
        t_do = self._tensor(dout, _stored_dtype(dout, dt), temps, "dout")
        if not (isinstance(lse, DeviceTensor) or hasattr(lse, "base_data")):
            lse = np.asarray(lse)
            if lse.ndim == 3:
                lse = lse[..., None]
        t_lse = self._tensor(lse, "f32", temps, "lse")
        t_dq, host_dq = self._out(dq, tq.shape, gdt, temps, "dq")
        t_dk, host_dk = self._out(dk, tk.shape, gdt, temps, "dk")
        t_dv, host_dv = self._out(dv, tv.shape, gdt, temps, "dv")
        t_ds = host_ds = None
        if sinks is None and dsinks is not None and dsinks is not False:
            raise ValueError("dsinks is given without sinks")
        if sinks is not None and dsinks is not False:
            if isinstance(dsinks, np.ndarray):   # any shape holding Hq values: the sinks' own, say
                host_ds = _fill_target("dsinks", dsinks, (1, Hq, 1, 1), any_shape=True)
                t_ds = self.empty((1, Hq, 1, 1), "f32")
            else:
                t_ds, host_ds = self._out(dsinks, (1, Hq, 1, 1), "f32", temps, "dsinks")
        st = fn(h, byref(d), tq._st, tk._st, tv._st, t_o._st, t_do._st, t_lse._st, t_dq._st, t_dk._st,
                t_dv._st, t_ds._st if t_ds is not None else None, 0, None, None)
        if st != 0:
            self._fail(st)
        grads = [self._deliver(t_dq, host_dq, as_numpy), self._deliver(t_dk, host_dk, as_numpy),
                 self._deliver(t_dv, host_dv, as_numpy)]
        if t_ds is None:
            return tuple(grads)
        if host_ds is not None:
            host_ds[...] = t_ds.numpy().reshape(host_ds.shape)
            grads.append(host_ds)
        elif as_numpy:
            g = t_ds.numpy()
            host_sinks = not (isinstance(sinks, DeviceTensor) or hasattr(sinks, "base_data"))
            grads.append(g.reshape(np.shape(sinks)) if host_sinks else g)
        else:
            grads.append(t_ds)
        return tuple(grads)

    def dropout_mask(self, batch: int, heads_q: int, seq_q: int, seq_kv: int, *, p: float, seed: int,
                     offset: int = 0, kv_lengths: Any = None, q_offset: int = 0, k_offset: int = 0,
                     dtype: str = "f32", out: Any = None) -> Any:
        """The dropout multipliers attention(..., dropout_p=p, dropout_seed=seed,
        dropout_offset=offset) applies (clattn_dropout_mask): [batch][heads_q][seq_q][seq_kv] of
        1/(1 - p) where a probability is kept and 0 where it is dropped, for every (row, key),
        visible or not. kv_lengths, q_offset and k_offset must be the attention call's: they set
        the rows' and keys' global positions, which the decisions depend on (not heads_kv or the
        head sizes). dtype: "f32", "f16" or "bf16".

        Returns a numpy array (float32 for f32 and bf16, float16 for f16; blocking), or `out` when
        it is given: a DeviceTensor or pyopencl array is only enqueued, a numpy array is filled.
        """
        fn = _lib.need("clattn_dropout_mask")
        h = self._handle()
        temps: list = []
        d = AttentionDesc()
        # heads_kv and head_dim play no part in the mask, but the descriptor's checks want them valid
        shape = tuple(_int(n, x) for n, x in (("batch", batch), ("heads_q", heads_q), ("seq_q", seq_q),
                                              ("seq_kv", seq_kv)))
        d.batch, d.heads_q, d.seq_q, d.seq_kv = shape
        d.heads_kv, d.head_dim = shape[1], 1
        if kv_lengths is not None:
            d.kv_lengths = self._kvlen(kv_lengths, d.batch, temps)
        d.q_offset, d.k_offset = _int("q_offset", q_offset), _int("k_offset", k_offset)
        _set_dropout(d, p, seed, offset)
        as_numpy = out is None or isinstance(out, np.ndarray)
        t_m, host_m = self._out(out, shape, _float_dtype("dtype", dtype), temps, "out")
        st = fn(h, byref(d), t_m._st, 0, None, None)
        if st != 0:
            self._fail(st)
        return self._deliver(t_m, host_m, as_numpy)

    def _qkv(self, q: Any, k: Any, v: Any, dtype: Optional[str],
             temps: list) -> Tuple[bool, DeviceTensor, DeviceTensor, DeviceTensor]:
        """Whether results go back as numpy (q is a host array), and q, k, v as device tensors of one
        storage type: dtype, else numpy q's, else the device q's."""
        as_numpy = not (isinstance(q, DeviceTensor) or hasattr(q, "base_data"))
        tq = self._tensor(q, _float_dtype("dtype", dtype) if dtype is not None else None, temps, "q")
        return as_numpy, tq, self._tensor(k, tq.dtype, temps, "k"), self._tensor(v, tq.dtype, temps, "v")

    def _attention_desc(self, tq: DeviceTensor, tk: DeviceTensor, tv: DeviceTensor, temps: list, causal: bool,
                        scale: float, algorithm: str, head_dim_v: Optional[int], mask: Any, kv_lengths: Any,
                        window: Any, chunk: int, softcap: float, sinks: Any, alibi_slopes: Any,
                        score_mod: Optional[str], mask_mod: Optional[str], q_offset: int, k_offset: int,
                        dropout_p: float, dropout_seed: int, dropout_offset: int) -> AttentionDesc:
        """The descriptor of an attention call and its backward pass: one builder, so the two calls
        cannot read the same options differently."""
        B, Hq, Sq, D = tq.shape
        d = AttentionDesc()
        d.batch, d.heads_q, d.heads_kv, d.seq_q, d.seq_kv, d.head_dim = B, Hq, tk.shape[1], Sq, tk.shape[2], D
        d.head_dim_v = tv.shape[3] if head_dim_v is None else _int("head_dim_v", head_dim_v)
        d.scale = scale
        d.causal = 1 if causal else 0
        d.algorithm = _algorithm(algorithm)
        self._fill_desc(d, Hq, temps, mask, kv_lengths, window, chunk, softcap, sinks, alibi_slopes,
                        score_mod, mask_mod, q_offset, k_offset)
        _set_dropout(d, dropout_p, dropout_seed, dropout_offset)
        return d

    def _fill_desc(self, d: "AttentionDesc", Hq: int, temps: list, mask: Any, kv_lengths: Any,
                   window: Any, chunk: int, softcap: float, sinks: Any, alibi_slopes: Any,
                   score_mod: Optional[str], mask_mod: Optional[str], q_offset: int = 0,
                   k_offset: int = 0) -> None:
        """The descriptor fields attention and scores share: the mask, key lengths, variants and
        slice offsets."""
        if mask is not None:
            d.mask = pointer(self._mask(mask, temps)._st)
        if kv_lengths is not None:
            d.kv_lengths = self._kvlen(kv_lengths, d.batch, temps)
        if window is not None:
            d.window = 1
            d.window_left, d.window_right = _window_pair(window)
        d.chunk = _int("chunk", chunk)
        d.softcap = softcap
        if sinks is not None:
            d.sinks = pointer(self._small(sinks, Hq, temps, "sinks")._st)
        if alibi_slopes is not None:
            d.alibi_slopes = pointer(self._small(alibi_slopes, Hq, temps, "alibi_slopes")._st)
        if score_mod is not None:
            d.score_mod = score_mod.encode()
        if mask_mod is not None:
            d.mask_mod = mask_mod.encode()
        d.q_offset, d.k_offset = _int("q_offset", q_offset), _int("k_offset", k_offset)

    def _mask(self, mask: Any, temps: list) -> DeviceTensor:
        """The additive mask: f16 for a float16 array, else f32 (a device tensor keeps its own)."""
        return self._tensor(mask, _stored_dtype(mask, "f32"), temps, "mask")

    def scores(self, q: TensorLike, k: TensorLike, *, causal: bool = False, scale: float = 0.0,
               mask: Optional[TensorLike] = None, kv_lengths: Any = None,
               window: Optional[Tuple[Optional[int], Optional[int]]] = None, chunk: int = 0,
               softcap: float = 0.0, alibi_slopes: Optional[TensorLike] = None,
               score_mod: Optional[str] = None, mask_mod: Optional[str] = None, q_offset: int = 0,
               k_offset: int = 0, out: Any = None, out_dtype: str = "f32", dtype: Optional[str] = None) -> Any:
        """scale·Q·Kᵀ + mask (clattn_scores) into [B][Hq][Sq][Skv] (out_dtype, f32 by default);
        keys hidden by causal, kv_lengths, the window, chunk or mask_mod are -inf. The variants'
        logit steps apply (softcap, mask, ALiBi, then score_mod) as in attention, and so do the
        slice offsets. Numpy in, numpy out (blocking); device in, DeviceTensor out (enqueued)."""
        h = self._handle()
        temps: list = []
        as_numpy = not (isinstance(q, DeviceTensor) or hasattr(q, "base_data"))
        tq = self._tensor(q, _float_dtype("dtype", dtype) if dtype is not None else None, temps, "q")
        tk = self._tensor(k, tq.dtype, temps, "k")
        B, Hq, Sq, D = tq.shape
        d = AttentionDesc()
        d.batch, d.heads_q, d.heads_kv, d.seq_q, d.seq_kv, d.head_dim = B, Hq, tk.shape[1], Sq, tk.shape[2], D
        d.scale = scale
        d.causal = 1 if causal else 0
        self._fill_desc(d, Hq, temps, mask, kv_lengths, window, chunk, softcap, None, alibi_slopes,
                        score_mod, mask_mod, q_offset, k_offset)
        t_out, host_out = self._out(out, (B, Hq, Sq, tk.shape[2]), _float_dtype("out_dtype", out_dtype), temps,
                                    "out")
        st = self._lib.clattn_scores(h, byref(d), tq._st, tk._st, t_out._st, 0, None, None)
        if st != 0:
            self._fail(st)
        return self._deliver(t_out, host_out, as_numpy)

    def softmax(self, x: TensorLike, *, scale: float = 0.0, causal: bool = False,
                mask: Optional[TensorLike] = None, kv_lengths: Any = None, out: Any = None,
                dtype: Optional[str] = None) -> Any:
        """Row-wise softmax of scale·x + mask (clattn_softmax) over the last axis of a
        [B][H][rows][cols] tensor; scale 0 means 1. Hidden entries (mask -inf, past kv_lengths,
        above the causal diagonal) give -0.0. out=x (a DeviceTensor) computes in place."""
        h = self._handle()
        temps: list = []
        as_numpy = not (isinstance(x, DeviceTensor) or hasattr(x, "base_data"))
        tx = self._tensor(x, _float_dtype("dtype", dtype) if dtype is not None else None, temps, "x")
        B, H, R, C = tx.shape
        d = SoftmaxDesc()
        d.batch, d.heads, d.rows, d.cols = B, H, R, C
        d.scale = scale
        d.causal = 1 if causal else 0
        if mask is not None:
            d.mask = pointer(self._mask(mask, temps)._st)
        if kv_lengths is not None:
            d.kv_lengths = self._kvlen(kv_lengths, B, temps)
        t_out, host_out = self._out(out, (B, H, R, C), tx.dtype, temps, "out")
        st = self._lib.clattn_softmax(h, byref(d), tx._st, t_out._st, 0, None, None)
        if st != 0:
            self._fail(st)
        return self._deliver(t_out, host_out, as_numpy)

    def merge(self, parts_out: Sequence[TensorLike], parts_lse: Sequence[TensorLike], *,
              out: Any = None, lse: Any = True, dtype: Optional[str] = None) -> Any:
        """Combines partial attention results over disjoint key ranges (clattn_merge).

        parts_out: each [B][H][S][Dv]; parts_lse: each f32 [B][H][S][1] (or [B][H][S] arrays).
        Returns (out, lse) (lse=False: out alone), numpy for numpy parts, else DeviceTensors.
        """
        h = self._handle()
        if len(parts_out) != len(parts_lse):
            raise ValueError(f"{len(parts_out)} parts_out but {len(parts_lse)} parts_lse")
        n = len(parts_out)
        temps: list = []
        as_numpy = n > 0 and not (isinstance(parts_out[0], DeviceTensor) or hasattr(parts_out[0], "base_data"))
        dt = _float_dtype("dtype", dtype) if dtype is not None else None
        tos, tls = [], []
        for i, (po, pl) in enumerate(zip(parts_out, parts_lse)):
            t = self._tensor(po, dt, temps, f"parts_out[{i}]")
            dt = t.dtype
            tos.append(t)
            if not (isinstance(pl, DeviceTensor) or hasattr(pl, "base_data")):
                pl = np.asarray(pl)
                if pl.ndim == 3:
                    pl = pl[..., None]
            tls.append(self._tensor(pl, "f32", temps, f"parts_lse[{i}]"))
        arr_o = (Tensor * max(n, 1))(*[t._st for t in tos])
        arr_l = (Tensor * max(n, 1))(*[t._st for t in tls])
        shape = tos[0].shape if n else (1, 1, 1, 1)
        t_out, host_out = self._out(out, shape, dt or "f32", temps, "out")
        t_lse = host_lse = None
        if lse is not False and lse is not None:
            t_lse, host_lse = self._out(lse, shape[:3] + (1,), "f32", temps, "lse")
        st = self._lib.clattn_merge(h, n, arr_o if n else None, arr_l if n else None, t_out._st,
                                    t_lse._st if t_lse is not None else None, 0, None, None)
        if st != 0:
            self._fail(st)
        o = self._deliver(t_out, host_out, as_numpy)
        if t_lse is None:
            return o
        return o, self._deliver(t_lse, host_lse, as_numpy)

    def attention_host(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = False,
                       scale: float = 0.0, algorithm: str = "auto", window=None, chunk: int = 0,
                       softcap: float = 0.0, score_mod: Optional[str] = None, mask_mod: Optional[str] = None,
                       lse: bool = False, dtype: Optional[str] = None) -> Any:
        """The host convenience call (clattn_attention_host): contiguous host arrays in, the
        library copies, computes and reads back (blocking). No mask, key lengths, sinks or ALiBi
        (use attention). Returns out, or (out, lse [B][Hq][Sq]) with lse=True."""
        h = self._handle()
        arr, dt = _host_data("q", q, _float_dtype("dtype", dtype) if dtype is not None else None)
        hq = _host_array(arr, dt)
        hk, hv = (_host_array(_host_data(name, a, dt)[0], dt) for name, a in (("k", k), ("v", v)))
        B, Hq, Sq, D = hq.shape
        d = AttentionDesc()
        d.batch, d.heads_q, d.heads_kv, d.seq_q, d.seq_kv, d.head_dim = B, Hq, hk.shape[1], Sq, hk.shape[2], D
        d.head_dim_v = hv.shape[3]
        d.scale = scale
        d.causal = 1 if causal else 0
        d.algorithm = _algorithm(algorithm)
        self._fill_desc(d, Hq, [], None, None, window, chunk, softcap, None, None, score_mod, mask_mod)
        out = np.empty((B, Hq, Sq, hv.shape[3]), dtype=DTYPES[dt][2])
        l = np.empty((B, Hq, Sq), dtype=np.float32) if lse else None
        st = self._lib.clattn_attention_host(h, byref(d), DTYPES[dt][0], hq.ctypes.data, hk.ctypes.data,
                                             hv.ctypes.data, out.ctypes.data,
                                             l.ctypes.data_as(ctypes.POINTER(c_float)) if l is not None else None)
        if st != 0:
            self._fail(st)
        res = from_bf16(out) if dt == "bf16" else out
        return (res, l) if lse else res

    def __repr__(self) -> str:
        if not self._h:
            return "<clattn.Context closed>"
        return f"<clattn.Context on {self.device_name!r}>"

