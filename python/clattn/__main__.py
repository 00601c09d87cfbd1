"""``python -m clattn [--device SPEC] [--json]``: what ``clattn-info`` prints (tools/clattn-info.c).

The OpenCL platforms and devices with the properties that decide how attention kernels run (memory,
work-group limits, vector widths, fp16/fp64, subgroups), the device key, which device
clattn_create(NULL) (or a given spec) resolves to and why, and per device: the matrix units, the
kernel cache, the tuning store and the kernel parameters of one f32 problem per operation, through
the same C calls as the tool. Exit status: 0 ok, 1 a spec that does not resolve, 2 no OpenCL device.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from ctypes import byref, c_size_t
from typing import Any, Dict, List, Optional

from . import _lib
from ._core import (ClattnError, Context, OPERATIONS, _devices_of, _info_str, _platforms, _select,
                    _type_name, version)
from ._lib import decode

LABEL_WIDTH = 22

# CL/cl.h numbers
CL_PLATFORM_VERSION, CL_PLATFORM_NAME, CL_PLATFORM_VENDOR = 0x0901, 0x0902, 0x0903
CL = dict(type=0x1000, vendor_id=0x1001, compute_units=0x1002, max_wg=0x1004, wi_sizes=0x1005,
          pref_float=0x100A, clock_mhz=0x100C, max_alloc=0x1010, global_mem=0x101F, max_const=0x1020,
          local_mem_type=0x1022, local_mem=0x1023, timer_res=0x1025, name=0x102B, vendor=0x102C,
          driver=0x102D, version=0x102F, extensions=0x1030, double_cfg=0x1032, pref_half=0x1034,
          native_float=0x103A, native_half=0x103C, c_version=0x103D, max_sub_groups=0x105C)
# (query, C type) of the numeric properties
NUMERIC = dict(type=ctypes.c_uint64, vendor_id=ctypes.c_uint, compute_units=ctypes.c_uint, max_wg=c_size_t,
               pref_float=ctypes.c_uint, clock_mhz=ctypes.c_uint, max_alloc=ctypes.c_uint64,
               global_mem=ctypes.c_uint64, max_const=ctypes.c_uint64, local_mem_type=ctypes.c_uint,
               local_mem=ctypes.c_uint64, timer_res=c_size_t, double_cfg=ctypes.c_uint64,
               pref_half=ctypes.c_uint, native_float=ctypes.c_uint, native_half=ctypes.c_uint,
               max_sub_groups=ctypes.c_uint)


def _num(dev: int, key: str) -> Optional[int]:
    v = NUMERIC[key]()
    if _lib.cl().clGetDeviceInfo(dev, CL[key], ctypes.sizeof(v), byref(v), None) != 0:
        return None
    return int(v.value)


def _wi_sizes(dev: int) -> Optional[List[int]]:
    cl = _lib.cl()
    n = c_size_t(0)
    if cl.clGetDeviceInfo(dev, CL["wi_sizes"], 0, None, byref(n)) != 0 or n.value < ctypes.sizeof(c_size_t):
        return None
    count = n.value // ctypes.sizeof(c_size_t)
    arr = (c_size_t * count)()
    if cl.clGetDeviceInfo(dev, CL["wi_sizes"], ctypes.sizeof(arr), arr, None) != 0:
        return None
    return [int(x) for x in arr]


def _has_ext(exts: str, name: str) -> Optional[bool]:
    return None if not exts else name in exts.split()


def _bytes(v: Optional[int]) -> str:
    if v is None:
        return "n/a"
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    u, div = 0, 1
    while u + 1 < len(units) and v // div >= 1024:
        div *= 1024
        u += 1
    return f"{v // div} {units[u]}" if v % div == 0 else f"{v / div:.1f} {units[u]}"


def _tri(v: Optional[bool]) -> str:
    return "n/a" if v is None else "yes" if v else "no"


def _device_key(dev: int) -> Optional[str]:
    buf = ctypes.create_string_buffer(65536)
    if _lib.lib().clattn_device_key(dev, buf, 65536) != 0:
        return None
    return buf.value.decode("utf-8", "replace")


def collect_device(dev: int) -> Dict[str, Any]:
    """The properties clattn-info shows of one device."""
    cl = _lib.cl()
    d: Dict[str, Any] = {k: _num(dev, k) for k in NUMERIC}
    for k in ("name", "vendor", "version", "c_version", "driver", "extensions"):
        d[k] = _info_str(cl.clGetDeviceInfo, dev, CL[k]) or None
    d["wi_sizes"] = _wi_sizes(dev)
    d["key"] = _device_key(dev)
    exts = d["extensions"] or ""
    d["fp16"] = _has_ext(exts, "cl_khr_fp16")
    fp64_ext = _has_ext(exts, "cl_khr_fp64")
    d["fp64"] = True if (fp64_ext or (d["double_cfg"] or 0) != 0) else (
        False if (fp64_ext is False or d["double_cfg"] is not None) else None)
    d["sg_khr"] = _has_ext(exts, "cl_khr_subgroups")
    d["sg_intel"] = _has_ext(exts, "cl_intel_subgroups")
    sub = d["sg_khr"] or d["sg_intel"] or (d["max_sub_groups"] or 0) > 0
    d["subgroups"] = True if sub else (None if not exts and d["max_sub_groups"] is None else False)
    return d


def tuning_view(spec: str) -> Dict[str, Any]:
    """Matrix units, cache, tuning report and the representative problems' parameters."""
    try:
        ctx = Context(spec)
    except ClattnError as e:
        return {"ok": False, "error": str(e)}
    with ctx:
        rows = []
        for op in OPERATIONS:
            no_dim = op in ("softmax", "merge")
            decode_op = op == "decode"
            p = ctx.get_params(op, "f32", 0 if no_dim else 64, 1 if decode_op else 1024,
                               16384 if decode_op else 1024)
            rows.append({"label": op, "params": p})
        return {"ok": True, "matrix": ctx.matrix_report, "cache": ctx.cache_report,
                "report": ctx.tuning_report, "problems": rows}


def _label(label: str) -> str:
    return f"    {label:<{LABEL_WIDTH}} : "


def _safe(s: Optional[str]) -> str:
    if s is None:
        return "n/a"
    return "".join("?" if ord(c) < 0x20 or ord(c) == 0x7F else c for c in s)


def print_device(d: Dict[str, Any], p: int, i: int, is_default: bool, tv: Dict[str, Any]) -> None:
    t = d["type"]
    tname = "n/a" if t is None else _type_name(t & ~1) if t & ~1 else _type_name(t)
    print(f"  Device {p}:{i}  [{tname}]  {_safe(d['name'])}" + ("   <- clattn default" if is_default else ""))

    def line(label: str, text: str) -> None:
        print(_label(label) + text)

    def num(v: Optional[int], unit: str = "") -> str:
        return "n/a" if v is None else f"{v}{' ' + unit if unit else ''}"

    line("vendor", _safe(d["vendor"]))
    line("vendor id", "n/a" if d["vendor_id"] is None else f"0x{d['vendor_id']:04x}")
    line("compute units", num(d["compute_units"]))
    line("max clock", num(d["clock_mhz"], "MHz"))
    line("global memory", _bytes(d["global_mem"]))
    lmt = {1: "local", 2: "global", 0: "none"}.get(d["local_mem_type"], "unknown") \
        if d["local_mem_type"] is not None else "type n/a"
    line("local memory", f"{_bytes(d['local_mem'])} ({lmt})")
    line("max allocation", _bytes(d["max_alloc"]))
    line("max constant buffer", _bytes(d["max_const"]))
    line("max work-group size", num(d["max_wg"]))
    line("max work-item sizes", "n/a" if d["wi_sizes"] is None else " x ".join(str(x) for x in d["wi_sizes"]))
    line("float vector width", f"preferred {num(d['pref_float'])}, native {num(d['native_float'])}")
    line("half vector width", f"preferred {num(d['pref_half'])}, native {num(d['native_half'])}")
    line("fp16 (cl_khr_fp16)", _tri(d["fp16"]))
    line("fp64", _tri(d["fp64"]))
    extra = []
    if d["subgroups"] or d["max_sub_groups"] is not None:
        if d["sg_khr"]:
            extra.append("cl_khr_subgroups")
        if d["sg_intel"]:
            extra.append("cl_intel_subgroups")
        if d["max_sub_groups"] is not None:
            extra.append(f"max {d['max_sub_groups']} per work-group")
    line("subgroups", _tri(d["subgroups"]) + (f" ({', '.join(extra)})" if extra else ""))
    line("device version", _safe(d["version"]))
    line("OpenCL C version", _safe(d["c_version"]))
    line("driver version", _safe(d["driver"]))
    line("timer resolution", num(d["timer_res"], "ns"))
    line("device key", _safe(d["key"]))
    line("clattn_create(NULL)", "picks this device" if is_default else "no")
    if not tv["ok"]:
        line("tuning", "n/a (no context on this device)")
        if tv.get("error"):
            line("clattn_create", _safe(tv["error"]))
        return
    line("matrix units", _safe(tv["matrix"]))
    line("kernel cache", _safe(tv["cache"]))
    line("tuning store", _safe(tv["report"]))
    for row in tv["problems"]:
        p = row["params"]
        vals = " ".join(f"{k}={v}" for k, v in p.values.items())
        line("  " + row["label"], f"{vals}  [{p.source}: {_safe(p.origin)}]")


def _selection(spec: Optional[str], index: Dict[int, str]) -> Dict[str, Any]:
    try:
        _, dev, why = _select(spec)
    except ClattnError as e:
        return {"ok": False, "status": e.code, "error": str(e) or e.status}
    name = _info_str(_lib.cl().clGetDeviceInfo, dev, CL["name"])
    return {"ok": True, "device": dev, "spec": index.get(dev), "name": name, "why": why}


def print_selection(title: str, sel: Dict[str, Any]) -> None:
    if not sel["ok"]:
        status = decode(_lib.lib().clattn_status_string(int(sel["status"])))
        print(f"{_safe(title)}: none ({status})\n  error: {_safe(sel['error'])}")
        return
    where = sel["spec"] + "  " if sel["spec"] else "(not in the list above) "
    print(f"{_safe(title)}: {where}{_safe(sel['name'])}")
    print(f"  why: {_safe(sel['why'] or 'n/a')}")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clattn",
                                 description="What clattn-info prints: devices, the default pick, "
                                             "matrix units, kernel cache, tuning.")
    ap.add_argument("--device", metavar="SPEC", help="also say what SPEC resolves to")
    ap.add_argument("--json", action="store_true", help="the same facts as JSON")
    args = ap.parse_args(argv)

    plats = _platforms()
    listing = []
    index: Dict[int, str] = {}
    cl = _lib.cl()
    for p, plat in enumerate(plats):
        devs = _devices_of(plat)
        for i, dev in enumerate(devs):
            index[dev] = f"{p}:{i}"
        listing.append((plat, devs))
    if not index:
        print("clattn-info: no OpenCL platform/device found\n"
              "hint: install an OpenCL ICD for your hardware (e.g. pocl-opencl-icd on Debian/Ubuntu for "
              "the CPU) and check that /etc/OpenCL/vendors lists it", file=sys.stderr)
        return 2
    default = _selection(None, index)
    req = _selection(args.device, index) if args.device is not None else None
    default_dev = default.get("device")

    if args.json:
        doc: Dict[str, Any] = {"clattn_version": version(), "platforms": []}
        for p, (plat, devs) in enumerate(listing):
            pd = {"index": p, "name": _info_str(cl.clGetPlatformInfo, plat, CL_PLATFORM_NAME),
                  "vendor": _info_str(cl.clGetPlatformInfo, plat, CL_PLATFORM_VENDOR),
                  "version": _info_str(cl.clGetPlatformInfo, plat, CL_PLATFORM_VERSION), "devices": []}
            for i, dev in enumerate(devs):
                d = collect_device(dev)
                d.pop("extensions", None)
                tv = tuning_view(f"{p}:{i}")
                if tv["ok"]:
                    tv["problems"] = [{"label": r["label"], "values": r["params"].values,
                                       "source": r["params"].source, "origin": r["params"].origin}
                                      for r in tv["problems"]]
                d.update(spec=f"{p}:{i}", clattn_default=dev == default_dev, tuning=tv)
                pd["devices"].append(d)
            doc["platforms"].append(pd)
        doc["clattn_device_env"] = os.environ.get("CLATTN_DEVICE")
        for key, sel in (("default", default), ("requested", req)):
            if sel is not None:
                doc[key] = {k: v for k, v in sel.items() if k != "device"}
        print(json.dumps(doc, indent=2))
    else:
        print(f"clattn-info (clattn {version()})")
        for p, (plat, devs) in enumerate(listing):
            print(f"\nPlatform {p}: {_safe(_info_str(cl.clGetPlatformInfo, plat, CL_PLATFORM_NAME))}")
            print(f"  {'vendor':<{LABEL_WIDTH + 2}} : {_safe(_info_str(cl.clGetPlatformInfo, plat, CL_PLATFORM_VENDOR))}")
            print(f"  {'version':<{LABEL_WIDTH + 2}} : {_safe(_info_str(cl.clGetPlatformInfo, plat, CL_PLATFORM_VERSION))}")
            if not devs:
                print("  (no devices)")
            for i, dev in enumerate(devs):
                print()
                print_device(collect_device(dev), p, i, dev == default_dev, tuning_view(f"{p}:{i}"))
        print()
        env = os.environ.get("CLATTN_DEVICE")
        print("CLATTN_DEVICE: " + (f'"{_safe(env)}"' if env is not None else "unset"))
        print_selection("clattn_create(NULL) picks", default)
        if req is not None:
            print_selection(f'--device "{args.device}" resolves to', req)
    sys.stdout.flush()
    rc = 0
    if not default["ok"]:
        print(f"clattn-info: clattn_create(NULL) would fail: {_safe(default['error'])}", file=sys.stderr)
        rc = 1
    if req is not None and not req["ok"]:
        print(f'clattn-info: --device "{_safe(args.device)}": {_safe(req["error"])}', file=sys.stderr)
        rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
