#!/usr/bin/env python3
"""Charts of clattn-bench --csv output (matplotlib, PNG): rate against sequence length for fused,
unfused and the peers, and each operation as a fraction of the device's ceiling.

    scripts/plot_bench.py [--out-dir DIR] [--prefix NAME] [--title TEXT] FILE.csv...
    scripts/plot_bench.py --run BUILD/tools/clattn-bench [--seqs 256,512,1024,2048] \\
        [--decode-seqs 4096,...] [--bench-args="..."] [--csv-out FILE] [--out-dir DIR] [--prefix NAME]

Reading: every CSV line whose header is clattn-bench's (op,device,dtype,B,Hq,Hkv,Sq,Skv,D,causal,
ms_median,ms_min,gflops,gbps,ratio_name,ratio,mask), from any number of files or runs; repeated
header lines are skipped, so runs may be concatenated. The ceilings are the bench's own rows: `peak`
(the fp32 multiply-add rate, GFLOP/s) and `copy` (read + write bandwidth, GB/s), the median of all
such rows of a device.

Series: one per operation, with " causal", the mask column (unless "none") and the dtype (when more
than one is present) added to its name. The x axis is the key count Skv (Sq = Skv in a square
sweep; decode's Sq is 1 to 16). Compute-bound operations (scores, clblast, unfused, fused,
fused_fma) are drawn in GFLOP/s against `peak`; bandwidth-bound ones (softmax, decode) in GB/s
against `copy`.

Writes DIR/PREFIX-rate.png (GFLOP/s and GB/s against sequence length, ceilings as dashed lines) and
DIR/PREFIX-ceiling.png (each operation's rate divided by its ceiling). With --run it first runs the
benchmark for each sequence length (square ops: --seq-q S --seq-kv S; decode: --seq-q 1 --seq-kv S)
and keeps the CSV (--csv-out, default DIR/PREFIX.csv).
"""

from __future__ import annotations

import argparse
import csv
import io
import shlex
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

HEADER = ["op", "device", "dtype", "B", "Hq", "Hkv", "Sq", "Skv", "D", "causal", "ms_median", "ms_min",
          "gflops", "gbps", "ratio_name", "ratio", "mask"]
COMPUTE_OPS = ("fused", "fused_fma", "unfused", "scores", "clblast")
BANDWIDTH_OPS = ("softmax", "decode")
# fixed colours per operation, so that every chart reads the same
COLOURS = {"fused": "tab:blue", "fused_fma": "tab:cyan", "unfused": "tab:orange", "scores": "tab:green",
           "clblast": "tab:red", "softmax": "tab:purple", "decode": "tab:brown"}


def _num(s: str) -> Optional[float]:
    try:
        return float(s) if s not in ("", "-") else None
    except ValueError:
        return None


def read_rows(texts: Iterable[str]) -> List[Dict[str, str]]:
    """The measurement rows of clattn-bench --csv outputs (header lines and anything else skipped)."""
    rows = []
    for text in texts:
        for rec in csv.reader(io.StringIO(text)):
            if len(rec) != len(HEADER) or rec == HEADER:
                continue
            rows.append(dict(zip(HEADER, rec)))
    return rows


def ceilings(rows: List[Dict[str, str]]) -> Dict[str, Tuple[Optional[float], Optional[float]]]:
    """Per device: (peak GFLOP/s, copy GB/s), the median of its peak and copy rows."""
    peaks: Dict[str, List[float]] = defaultdict(list)
    copies: Dict[str, List[float]] = defaultdict(list)
    for r in rows:
        if r["op"] == "peak" and _num(r["gflops"]):
            peaks[r["device"]].append(_num(r["gflops"]))
        elif r["op"] == "copy" and _num(r["gbps"]):
            copies[r["device"]].append(_num(r["gbps"]))
    devices = {r["device"] for r in rows}
    return {d: (statistics.median(peaks[d]) if peaks[d] else None,
                statistics.median(copies[d]) if copies[d] else None) for d in devices}


def series(rows: List[Dict[str, str]], metric: str, ops: Tuple[str, ...]) -> Dict[Tuple[str, str], Dict[int, float]]:
    """{(device, label): {Skv: median rate}} of the rows of ops that have metric ("gflops"/"gbps")."""
    dtypes = {r["dtype"] for r in rows if r["op"] in ops}
    acc: Dict[Tuple[str, str], Dict[int, List[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        v = _num(r[metric])
        if r["op"] not in ops or v is None or not r["Skv"]:
            continue
        label = r["op"]
        if r["causal"] == "1":
            label += " causal"
        if r["mask"] and r["mask"] != "none":
            label += " " + r["mask"]
        if len(dtypes) > 1:
            label += " " + r["dtype"]
        acc[(r["device"], label)][int(r["Skv"])].append(v)
    return {k: {s: statistics.median(v) for s, v in sorted(pts.items())} for k, pts in acc.items()}


def _style(label: str) -> dict:
    op = label.split()[0]
    return dict(color=COLOURS.get(op, None), marker="o", linestyle="--" if "causal" in label else "-",
                linewidth=1.6, markersize=4)


def plot(rows: List[Dict[str, str]], out_dir: Path, prefix: str, title: Optional[str] = None) -> List[Path]:
    """Draws the two charts; returns the paths written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    ceil = ceilings(rows)
    comp = series(rows, "gflops", COMPUTE_OPS)
    band = series(rows, "gbps", BANDWIDTH_OPS)
    devices = sorted({d for d, _ in list(comp) + list(band)})
    if not devices:
        raise SystemExit("plot_bench: no measurement rows with a sequence length in the input")
    name = title or ", ".join(devices)
    written = []

    def shape_note() -> str:
        shapes = sorted({f"B{r['B']} H{r['Hq']}" + (f"/{r['Hkv']}" if r['Hkv'] != r['Hq'] else "") + f" d{r['D']}"
                         for r in rows if r["op"] in ("fused", "unfused", "scores") and r["D"]})
        return "; ".join(shapes)

    # 1. rates
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    for ax, data, unit, which in ((axes[0], comp, "GFLOP/s", 0), (axes[1], band, "GB/s", 1)):
        for (dev, label), pts in sorted(data.items()):
            tag = label if len(devices) == 1 else f"{label} ({dev})"
            ax.plot(list(pts), list(pts.values()), label=tag, **_style(label))
        for dev in devices:
            c = ceil.get(dev, (None, None))[which]
            if c:
                ax.axhline(c, color="black", linestyle=":", linewidth=1.2)
                ax.annotate(f"{'fp32 FMA peak' if which == 0 else 'copy bandwidth'} {c:.0f} {unit}",
                            xy=(0.01, c), xycoords=("axes fraction", "data"), va="bottom", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length (keys, Skv; Sq = Skv, decode Sq = 1)")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if data:
            ax.legend(fontsize=8, loc="best")
        ax.set_title("arithmetic rate (attention, GEMMs)" if which == 0 else "memory rate (softmax, decode)")
    fig.suptitle(f"clattn-bench: {name} ({shape_note()})", fontsize=10)
    fig.tight_layout()
    p = out_dir / f"{prefix}-rate.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    # 2. fractions of the ceilings
    fig, ax = plt.subplots(figsize=(8, 5.2))
    for data, which, suffix in ((comp, 0, " / FMA peak"), (band, 1, " / copy")):
        for (dev, label), pts in sorted(data.items()):
            c = ceil.get(dev, (None, None))[which]
            if not c:
                continue
            tag = label + suffix + ("" if len(devices) == 1 else f" ({dev})")
            st = _style(label)
            if which == 1:
                st["marker"] = "s"
                st["linestyle"] = "-."
            ax.plot(list(pts), [v / c for v in pts.values()], label=tag, **st)
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length (keys, Skv; Sq = Skv, decode Sq = 1)")
    ax.set_ylabel("fraction of the device's ceiling")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(f"each operation against its ceiling: {name}", fontsize=10)
    fig.tight_layout()
    p = out_dir / f"{prefix}-ceiling.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    return written


def run_sweep(bench: str, seqs: List[int], decode_seqs: List[int], extra: List[str]) -> str:
    """clattn-bench --csv for each sequence length; the CSV text of all runs."""
    out = []
    for s in seqs:
        cmd = [bench, "--csv", "--op", "copy,peak,scores,softmax,unfused,fused,clblast", "--seq-q", str(s),
               "--seq-kv", str(s)] + extra
        print("plot_bench: " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
        out.append(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    for s in decode_seqs:
        cmd = [bench, "--csv", "--op", "decode", "--seq-q", "1", "--seq-kv", str(s)] + extra
        print("plot_bench: " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
        out.append(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return "".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="*", help="clattn-bench --csv outputs ('-' for standard input)")
    ap.add_argument("--out-dir", default="docs/figures", help="where the PNG files go (default docs/figures)")
    ap.add_argument("--prefix", default="bench", help="file name prefix (default bench)")
    ap.add_argument("--title", help="the device name shown in the titles (default: from the CSV)")
    ap.add_argument("--run", metavar="BENCH", help="run this clattn-bench for a sweep first")
    ap.add_argument("--seqs", default="256,512,1024,2048", help="square sequence lengths of the sweep")
    ap.add_argument("--decode-seqs", default="4096,16384,65536", help="decode key counts of the sweep ('' for none)")
    ap.add_argument("--bench-args", default="", help="more clattn-bench arguments, e.g. --bench-args=\"--iters 5 --check\" (with =)")
    ap.add_argument("--csv-out", help="where --run keeps the CSV (default OUT_DIR/PREFIX.csv)")
    args = ap.parse_args(argv)

    texts = []
    for f in args.csv:
        texts.append(sys.stdin.read() if f == "-" else Path(f).read_text())
    if args.run:
        seqs = [int(x) for x in args.seqs.split(",") if x]
        dseqs = [int(x) for x in args.decode_seqs.split(",") if x]
        text = run_sweep(args.run, seqs, dseqs, shlex.split(args.bench_args))
        dest = Path(args.csv_out) if args.csv_out else Path(args.out_dir) / f"{args.prefix}.csv"
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(",".join(HEADER) + "\n" + "".join(
            line + "\n" for line in text.splitlines() if line and line != ",".join(HEADER)))
        print(f"plot_bench: wrote {dest}", file=sys.stderr)
        texts.append(text)
    if not texts:
        ap.error("give CSV files or --run")
    rows = read_rows(texts)
    for p in plot(rows, Path(args.out_dir), args.prefix, args.title):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
