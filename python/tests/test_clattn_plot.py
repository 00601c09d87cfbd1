"""scripts/plot_bench.py reads clattn-bench --csv output (repeated headers, ceilings from the peak
and copy rows) and writes the two PNG charts. Skipped without matplotlib."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CSV = """op,device,dtype,B,Hq,Hkv,Sq,Skv,D,causal,ms_median,ms_min,gflops,gbps,ratio_name,ratio,mask
copy,dev,-,,,,,,,,1,1,,10,,,
peak,dev,f32x8,,,,,,,,1,1,200,,,,
fused,dev,f32,1,8,8,256,256,64,0,1,1,100,,unfused_ms/fused_ms,2,none
fused,dev,f32,1,8,8,256,256,64,1,1,1,50,,causal_gflops/noncausal_gflops,0.5,none
unfused,dev,f32,1,8,8,256,256,64,0,1,1,40,,,,none
softmax,dev,f32,1,8,8,256,256,,0,1,1,,12,softmax_gbps/copy_gbps,1.2,none
op,device,dtype,B,Hq,Hkv,Sq,Skv,D,causal,ms_median,ms_min,gflops,gbps,ratio_name,ratio,mask
copy,dev,-,,,,,,,,1,1,,14,,,
peak,dev,f32x8,,,,,,,,1,1,220,,,,
fused,dev,f32,1,8,8,512,512,64,0,1,1,150,,unfused_ms/fused_ms,2,none
decode,dev,f32,1,8,8,1,4096,64,0,1,1,30,9,decode_gbps/copy_gbps,0.9,none
"""


def _module():
    spec = importlib.util.spec_from_file_location("plot_bench", ROOT / "scripts" / "plot_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reads_rows_and_ceilings():
    pb = _module()
    rows = pb.read_rows([CSV])
    assert len(rows) == 10
    assert pb.ceilings(rows) == {"dev": (210.0, 12.0)}
    s = pb.series(rows, "gflops", pb.COMPUTE_OPS)
    assert s[("dev", "fused")] == {256: 100.0, 512: 150.0}
    assert s[("dev", "fused causal")] == {256: 50.0}
    assert ("dev", "decode") not in s  # bandwidth-bound: drawn in GB/s only
    assert pb.series(rows, "gbps", pb.BANDWIDTH_OPS)[("dev", "decode")] == {4096: 9.0}
    assert pb.series(rows, "gbps", pb.BANDWIDTH_OPS)[("dev", "softmax")] == {256: 12.0}


def test_writes_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    pb = _module()
    f = tmp_path / "in.csv"
    f.write_text(CSV)
    assert pb.main([str(f), "--out-dir", str(tmp_path), "--prefix", "t"]) == 0
    for name in ("t-rate.png", "t-ceiling.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10000
