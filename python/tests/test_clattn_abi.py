"""The ctypes structures match include/clattn.h: a C program compiled against the header prints
every size and field offset, compared with ctypes'. Skipped without a C compiler or the header
(an installed package away from the source tree)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from clattn import _lib

STRUCTS = {
    "clattn_tensor": _lib.Tensor,
    "clattn_attention_desc": _lib.AttentionDesc,
    "clattn_softmax_desc": _lib.SoftmaxDesc,
    "clattn_program_stats": _lib.ProgramStats,
    "clattn_problem_class": _lib.ProblemClass,
    "clattn_kernel_params": _lib.KernelParams,
}


def _include_dirs():
    root = Path(__file__).resolve().parents[2]
    header = root / "include" / "clattn.h"
    # clattn_export.h is generated into a build folder's include/: the library's (CLATTN_LIBRARY),
    # else the one `pip install ./python` configured (python/build/cmake-*), else build/ci/release
    lib = Path(os.environ.get("CLATTN_LIBRARY", ""))
    folders = [lib.parent] if lib.name else []
    folders += sorted((root / "python" / "build").glob("cmake-*")) + [root / "build" / "ci" / "release"]
    for f in folders:
        if (f / "include" / "clattn_export.h").exists():
            return header, [root / "include", f / "include"]
    return header, [root / "include"]


def test_struct_layouts():
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    header, incs = _include_dirs()
    if not cc or not header.exists():
        pytest.skip("no C compiler or no include/clattn.h")
    if not any((d / "clattn_export.h").exists() for d in incs):
        pytest.skip("no generated clattn_export.h (set CLATTN_LIBRARY to a build folder's library)")
    lines = ['#include "clattn.h"', "#include <stdio.h>", "#include <stddef.h>", "int main(void) {"]
    for cname, st in STRUCTS.items():
        lines.append(f'printf("{cname} sizeof %zu\\n", sizeof({cname}));')
        for field, *_ in st._fields_:
            lines.append(f'printf("{cname} {field} %zu\\n", offsetof({cname}, {field}));')
    lines.append("return 0; }")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "abi.c", Path(tmp) / "abi"
        src.write_text("\n".join(lines))
        args = [cc, "-std=c11", *[f"-I{d}" for d in incs], str(src), "-o", str(exe)]
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0 and "CL/cl.h" in r.stderr:
            pytest.skip("no OpenCL headers")
        assert r.returncode == 0, r.stderr
        out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    want = {}
    for line in out.splitlines():
        name, field, value = line.split()
        want[(name, field)] = int(value)
    for cname, st in STRUCTS.items():
        assert ctypes.sizeof(st) == want[(cname, "sizeof")], f"sizeof({cname})"
        for field, *_ in st._fields_:
            assert getattr(st, field).offset == want[(cname, field)], f"{cname}.{field}"
