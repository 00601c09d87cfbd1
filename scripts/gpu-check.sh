#!/usr/bin/env bash
# A device session's work on a GPU, in calls that fit the lent machines' 10 minutes a command:
# build, the tests on the GPU, the benchmark against its peers, and sweeps of the decode
# parameters that have no measured default yet. Output goes to $OUT (default build/ci/gpu-out):
# build.log, info.txt, ctest.log, bench.txt, sweep-*.csv.
#
#   scripts/gpu-check.sh [STEPS [DEVICE [CTEST_REGEX]]]
#
# STEPS: a comma list of matrix, variants, kvcache, training, tests, bench, dec16, lanes, sweep (default
# tests,bench; matrix: the matrix units, see below, about four minutes, meant as a call of its own;
# variants: issue 71's targets, about three minutes; kvcache: issues 73 and 75's, about three
# minutes; training: issue 74's, about three minutes; the tests took
# over 200 s at -j12 on an H200 machine, whose image has PoCL too, which test_device opens (281 s
# alone with a cold kernel cache at -j4, where 300 s ran 30 of the 48; 1450 s summed); bench
# about 60 s; dec16 about 4 minutes; lanes and sweep about 6 minutes each); the build comes first in every call and is incremental. DEVICE:
# a clattn_create spec (default nvidia). CTEST_REGEX picks the tests (default: all but the
# consumer check, test_decode_direct16, test_attention_ns3 and the masklanes runs, CPU kernels'). The OpenCL runtime must be registered
# with the ICD loader (on the lent machines: `source .gpu/env.sh` first, after
# ../shared/gpu/prepare.sh here).
set -uo pipefail
cd "$(dirname "$0")/.."
steps=,${1:-tests,bench},
dev=${2:-nvidia}
tests=${3:-.}
out=${OUT:-$PWD/build/ci/gpu-out}
build=build/ci/gpu # the build and its kernel cache
mkdir -p "$out"
export CLATTN_DEVICE=$dev CLATTN_CACHE_DIR="$PWD/$build/kernel-cache"
t0=$SECONDS
log() { echo "== $1 ($((SECONDS - t0)) s)"; }

log "build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCLATTN_TEST_CACHE_DIR="$CLATTN_CACHE_DIR" \
  >"$out/build.log" 2>&1 && cmake --build "$build" -j"$(nproc)" >>"$out/build.log" 2>&1 ||
  { tail -n 40 "$out/build.log"; exit 1; }
bin=$build/tools
"$bin/clattn-info" >"$out/info.txt" 2>&1
grep -iE "name|key|version" "$out/info.txt" | head -n 8

if [[ $steps == *,matrix,* ]]; then
# The matrix units (issue 70), about four minutes: what clattn-info says, what the driver makes of
# the inline PTX (the .version and .target of the PTX it returns as the program binary, which the
# kernel cache keeps), the fused and decode tables on the GPU's own backend (AUTO runs fused_mma
# there) and on the emulated layer, then fused f16, bf16 and f32 (3xTF32) with the matrix kernel
# (CLATTN_MATRIX=auto: the FMA kernel too, in the same clattn-bench run) and with off, each with
# the FMA peak of its run: matrix.csv (every line), matrix.err (the checks), and a summary.
log "matrix: $(grep -m 1 -i "matrix units" "$out/info.txt" | sed 's/^ *//')"
(cd "$build" && CLATTN_REQUIRE_DEVICE=1 timeout 200 ctest -j12 -R "^(test_attention|test_decode|test_mma_layout|test_matrix|test_attention_mma|test_decode_mma|test_robust)$" \
  --output-on-failure >"$out/ctest-matrix.log" 2>&1)
grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest-matrix.log" | head -n 20
bin_=$(grep -l -a "fused_mma" "$CLATTN_CACHE_DIR"/*.clbin 2>/dev/null | head -n 1)
[ -n "$bin_" ] && echo "driver's PTX: $(grep -a -m 1 '^\.version' "$bin_") $(grep -a -m 1 '^\.target' "$bin_"), $(grep -a -c 'mma.sync' "$bin_") mma.sync, $(grep -a -c 'ldmatrix' "$bin_") ldmatrix, $(grep -a -c 'ex2.approx' "$bin_") ex2.approx in $(basename "$bin_")"
# the ldmatrix probe's outcome on the device (test_matrix's kernel/ldsm_probe prints it)
echo "$(CLATTN_TEST_FILTER=kernel/ldsm_probe timeout 60 "$build/tests/test_matrix" 2>&1 | grep -m 2 -E "ldmatrix probe|FAILED|OK \]" | tr '\n' ' ')"
# MATRIX_SHAPES (clattn-bench shape options, ';' between shapes) and MATRIX_MODES (default
# "auto off") let a dry run on PoCL take small shapes and the emulation.
IFS=';' read -r -a shapes_ <<<"${MATRIX_SHAPES:---batch 4 --heads 16 --seq-q 4096 --seq-kv 4096 --dim 64;--batch 2 --heads 16 --seq-q 8192 --seq-kv 8192 --dim 128}"
# One CSV (clattn-bench's columns after shape, dtype and CLATTN_MATRIX) and one error log: the
# lent machines return at most 8 files.
rm -f "$out/matrix.csv" "$out/matrix.err"
for shape in "${shapes_[@]}"; do
  tag=$(echo "$shape" | awk '{ print "b" $2 "h" $4 "s" $6 "d" $10 }')
  for dt in f16 bf16 f32; do
    for mode in ${MATRIX_MODES:-auto off}; do
      if ! CLATTN_MATRIX=$mode timeout 40 "$bin/clattn-bench" --op peak,fused --dtype $dt --check --csv --iters 5 $shape \
           >"$out/tmp.csv" 2>"$out/tmp.err"; then
        echo "matrix $tag $dt $mode: failed: $(tail -n 2 "$out/tmp.err")"
      fi
      { echo "== $tag $dt $mode"; cat "$out/tmp.err"; } >>"$out/matrix.err"
      [ -f "$out/matrix.csv" ] || echo "shape,dtype_in,matrix,$(head -n 1 "$out/tmp.csv")" >"$out/matrix.csv"
      tail -n +2 "$out/tmp.csv" | sed "s|^|$tag,$dt,$mode,|" >>"$out/matrix.csv"
      # op, causal, median ms, GFLOP/s, ratio (clattn-bench --csv's columns 1, 10, 11, 13, 15, 16)
      echo "$tag $dt $mode: $(awk -F, '$1 == "peak" || $1 ~ /^fused/ { printf "%s%s %s ms %.0f GFLOP/s %s %s; ", $1, $10 == "1" ? " causal" : "", $11, $13, $15, $16 }' "$out/tmp.csv")"
    done
  done
done
rm -f "$out/tmp.csv" "$out/tmp.err"
fi

if [[ $steps == *,variants,* ]]; then
# The attention variants (issue 71), about three minutes: their tests on the GPU, then issue 71's
# targets with clattn-bench, each against its peer in the same run: decode over 65536 keys with a
# window of 1024 (against 1024 keys and the same window as a dense mask), prefill S 8192 with W
# 1024 (against causal without it), softcap, sinks and ALiBi at B1 H8 S1024 d64 (against plain),
# MLA decode 576/512 with one kv head (GB/s against the copy): variants.txt. VARIANTS_SMALL=1
# shrinks the shapes for a dry run on PoCL.
log "variants"
(cd "$build" && CLATTN_REQUIRE_DEVICE=1 timeout 200 ctest -j12 -R "^test_variants" --output-on-failure \
  >"$out/ctest-variants.log" 2>&1)
grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest-variants.log" | head -n 20
if [ "${VARIANTS_SMALL:-0}" = 1 ]; then dec=4096 w=256 pre=512 pw=128 ov=256 mla=512; else dec=65536 w=1024 pre=8192 pw=1024 ov=1024 mla=8192; fi
rm -f "$out/variants.txt"
vbench() { # a title, then clattn-bench's arguments
  local title=$1; shift
  { echo "== $title: clattn-bench $*"; timeout 60 "$bin/clattn-bench" --check --iters 20 "$@" 2>&1; } >>"$out/variants.txt"
}
for dt in f32 f16; do
  vbench "decode window $w over $dec keys, $dt" --op copy,decode --dtype $dt --batch 1 --heads 8 --seq-q 1 --seq-kv $dec --dim 64 --sliding $w
  vbench "prefill S $pre window $pw, $dt" --op fused --dtype $dt --batch 1 --heads 8 --seq-q $pre --seq-kv $pre --dim 64 --causal --sliding $pw
  for v in "--softcap 50" "--sinks" "--alibi 8"; do
    vbench "overhead $v, $dt" --op fused --dtype $dt --batch 1 --heads 8 --seq-q $ov --seq-kv $ov --dim 64 --causal $v
  done
done
for h in 16 128; do
  vbench "MLA decode, $h query heads, f16" --op copy,decode --dtype f16 --batch 1 --heads $h --heads-kv 1 --seq-q 1 \
    --seq-kv $mla --dim 576 --dim-v 512 --mla --scale 0.1352338
done
grep -E "^==|vs |fail|rror" "$out/variants.txt"
fi

if [[ $steps == *,kvcache,* ]]; then
# KV caches and slices (issues 73 and 75), about three minutes: their tests on the GPU (decode_rows,
# the tiled kernel and, where the device has matrix units, fused_mma read paged, packed and quantized
# K/V), then issue 73's targets with clattn-bench against their peers in the same run: paged decode
# (page 16 and 64, NHD and HND) against contiguous K/V, q8_0 and q4_0 decode against f16 (K/V
# bytes/s), paged and q8_0 prefill, and packed (varlen) prefill against one call per sequence:
# kvcache.txt. KV_SMALL=1 shrinks the shapes for a dry run on PoCL.
log "kvcache"
(cd "$build" && CLATTN_REQUIRE_DEVICE=1 timeout 200 ctest -j12 -R "^test_(kvcache|kv_append|positions)" \
  --output-on-failure >"$out/ctest-kvcache.log" 2>&1)
grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest-kvcache.log" | head -n 20
if [ "${KV_SMALL:-0}" = 1 ]; then skv=2048 pre=256 lens=60,300,20,500; else skv=32768 pre=4096 lens=300,2800,1000,6000,160,3600; fi
rm -f "$out/kvcache.txt"
kbench() { # a title, then clattn-bench's arguments
  local title=$1; shift
  { echo "== $title: clattn-bench $*"; timeout 90 "$bin/clattn-bench" --check --iters 20 "$@" 2>&1; } >>"$out/kvcache.txt"
}
dec=(--op decode --batch 4 --heads 32 --heads-kv 8 --seq-q 1 --seq-kv $skv --dim 128 --dtype f16)
for layout in nhd hnd; do
  for pg in 16 64; do kbench "paged decode, page $pg $layout" "${dec[@]}" --page $pg --page-layout $layout; done
done
for t in q8_0 q4_0 fp8_e4m3 i8; do kbench "$t decode" "${dec[@]}" --kv-type $t; done
kbench "paged q8_0 prefill" --op fused --batch 1 --heads 32 --heads-kv 8 --seq-q $pre --seq-kv $pre --dim 128 \
  --dtype f16 --causal --kv-type q8_0 --page 16
kbench "varlen prefill" --op fused --varlen $lens --heads 32 --heads-kv 8 --dim 128 --dtype f16 --causal
grep -E "^==|vs |fail|rror" "$out/kvcache.txt"
fi

if [[ $steps == *,training,* ]]; then
# Training (issue 74), about three minutes: test_backward and test_ref_backward on the GPU, then
# the targets with clattn-bench: the backward's rate (2.5x the forward's FLOPs) against the
# forward's in the same run (>= 0.6), causal and not, f32 and f16, and the forward's dropout
# overhead (<= 1.15): training.txt. TRAIN_SMALL=1 shrinks the shapes for a dry run on PoCL. The
# backward's kernels are the portable ones (one work-item per kv head and key range); their GPU
# rate is what this step finds out.
log "training"
(cd "$build" && CLATTN_REQUIRE_DEVICE=1 timeout 200 ctest -j12 -R "^test_(backward|ref_backward)$" \
  --output-on-failure >"$out/ctest-training.log" 2>&1)
grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest-training.log" | head -n 20
if [ "${TRAIN_SMALL:-0}" = 1 ]; then tb=(--batch 1 --heads 8 --seq-q 512 --seq-kv 512); else tb=(--batch 4 --heads 16 --seq-q 2048 --seq-kv 2048); fi
rm -f "$out/training.txt"
tbench() { # a title, then clattn-bench's arguments
  local title=$1; shift
  { echo "== $title: clattn-bench $*"; timeout 120 "$bin/clattn-bench" --iters 5 "$@" 2>&1; } >>"$out/training.txt"
}
for dt in f32 f16; do
  tbench "backward $dt" --op backward "${tb[@]}" --dim 64 --dtype $dt --check
  tbench "backward $dt causal" --op backward "${tb[@]}" --dim 64 --dtype $dt --causal
done
tbench "dropout 0.1" --op dropout --dropout 0.1 "${tb[@]}" --dim 64 --check
grep -E "^==|vs |fail|rror" "$out/training.txt"
fi

if [[ $steps == *,tests,* ]]; then
log "tests on $dev ($tests)"
(cd "$build" && CLATTN_REQUIRE_DEVICE=1 timeout 420 ctest -j12 -R "$tests" -E "consumer|direct16|ns3|masklanes" \
  --output-on-failure >"$out/ctest.log" 2>&1)
grep -E "tests passed|tests failed|Failed|\*\*\*" "$out/ctest.log" | head -n 30
fi

if [[ $steps == *,bench,* ]]; then
log "benchmark: copy, FMA peak, scores, softmax, unfused, fused (+ causal), decode, CLBlast"
timeout 240 "$bin/clattn-bench" --op all --check >"$out/bench.txt" 2>&1
cat "$out/bench.txt"
log "benchmark: fused with masks (a sliding window: tiles the mask hides are skipped; a bias)"
for m in window:512 bias; do
  timeout 60 "$bin/clattn-bench" --op fused --check --mask "$m" 2>&1 | grep -E "^fused|fail|rror"
done
log "benchmark: decode with masks (decode_lanes reads no K/V row of a key the mask hides; none, window, bias)"
for m in none window:1024 bias; do
  timeout 60 "$bin/clattn-bench" --op decode --heads-kv 8 --check --mask "$m" 2>&1 | grep -E "^decode|fail|rror"
done
fi

# DECODE: WGX, WGY, RM, NS, VW, SPLITS, DIRECT (src/params.h). Default shape B16 H32 kv8192
# d128; also f16 and grouped-query heads.
sweep() { # name, then clattn-bench's arguments; one CLATTN_PARAMS_DECODE list per line on stdin
  local name=$1; shift
  local csv="$out/sweep-$name.csv" p
  rm -f "$csv"
  while read -r p; do
    if ! CLATTN_PARAMS_DECODE=$p timeout 60 "$bin/clattn-bench" --csv --iters 20 "$@" \
         >"$out/tmp.csv" 2>"$out/tmp.err"; then
      echo "$name $p: failed: $(grep -m 1 -iE "fail|error" "$out/tmp.err" || tail -n 1 "$out/tmp.err")"
      continue
    fi
    [ -f "$csv" ] || echo "params,$(head -n 1 "$out/tmp.csv")" >"$csv"
    tail -n +2 "$out/tmp.csv" | sed "s|^|${p//,//},|" >>"$csv"
  done
  rm -f "$out/tmp.csv" "$out/tmp.err"
  # params, Hq, Hkv, Sq, dtype, median ms, GB/s
  [ -f "$csv" ] && awk -F, '{ printf "%-18s %-5s %4s %4s %4s %10s %10s\n", $1 == "" ? "default" : $1, $4, $6, $7, $8, $12, $15 }' "$csv"
}
# decode_lanes (DIRECT 4): key groups (WGY) x keys a step (VW), lanes a row (NS; 0: one per
# 16-byte chunk), splits; the first line is decode_rows (the NVIDIA default before decode_lanes)
# for reference, the DIRECT 5 lines the same kernel without inline PTX (partial scores through
# local memory), the DIRECT 0 lines the tiled kernel, which beat decode_lanes on an H200 with 16
# query rows per kv head (32/8 heads, seq_q 4). Every line is checked against the float64
# reference (a failure is printed and skipped).
lanes_lists() {
  echo "32,4,0,1,8,0,2"
  for wgy in 1 2 4 8; do for vw in 4 8 16; do echo "32,$wgy,0,0,$vw,0,4"; done; done
  for ns in 8 16; do echo "32,4,0,$ns,8,0,4"; done
  for splits in 8 32 128; do echo "32,4,0,0,8,$splits,4"; done
  for wgy in 2 4 8; do echo "32,$wgy,0,0,8,0,5"; done
  echo "4,4,4,1,4,0,0"; echo "8,4,4,1,4,0,0"; echo "8,8,4,1,4,0,0"; echo "4,16,4,1,4,0,0"
}
# dec16 (about 4 minutes): 16-bit decode, B16 H32 Skv8192 d128, the defaults (the first, empty
# line: on an H200 its f16 line is tuning/nvidia-h200.tuning's 8 groups and 16 keys a step)
# against decode_lanes' 4 and 8 key groups with 8 and 16 keys a step; on an H200 at d44d30f f16
# took 0.783 ms with the vendor default (4, 8) and 0.667 with (8, 16), below the 3.3 TB/s
# measured before decode_lanes took its mask scan (compiled out since for MASKED 0).
if [[ $steps == *,dec16,* ]]; then
log "16-bit decode"
dec16_lists() { echo ""; for v in 32,4,0,0,8 32,8,0,0,8 32,4,0,0,16 32,8,0,0,16; do echo "$v,0,4"; done; }
dec16_lists | sweep dec16-f16 --check --op decode --dtype f16
dec16_lists | sweep dec16-bf16 --check --op decode --dtype bf16
dec16_lists | sweep dec16-f16-gqa --check --op decode --dtype f16 --heads 32 --heads-kv 8
fi
[[ $steps == *,lanes,* || $steps == *,sweep,* ]] || { log "done"; exit 0; }
if [[ $steps == *,lanes,* ]]; then
log "decode_lanes sweep"
lanes_lists | sweep lanes --check --op decode
lanes_lists | sweep lanes-f16 --check --op decode --dtype f16
lanes_lists | sweep lanes-gqa --check --op decode --heads 32 --heads-kv 8
lanes_lists | sweep lanes-gqa-sq4 --check --op decode --heads 32 --heads-kv 8 --seq-q 4
fi
[[ $steps == *,sweep,* ]] || { log "done"; exit 0; }
log "decode sweep"
decode_lists() {
  for direct in 2 3; do
    for wgy in 1 2 4 8; do
      for ns in 1 8; do echo "32,$wgy,0,$ns,8,0,$direct"; done
    done
  done
  for ns in 2 4 16 32; do for vw in 4 16; do echo "32,4,0,$ns,$vw,0,3"; done; done
  for splits in 8 32 128; do echo "32,4,0,1,8,$splits,2"; echo "32,4,0,1,8,$splits,3"; done
}
decode_lists | sweep decode --op decode
decode_lists | sweep decode-f16 --op decode --dtype f16
decode_lists | sweep decode-gqa --op decode --heads 32 --heads-kv 8
decode_lists | sweep decode-gqa-sq4 --op decode --heads 32 --heads-kv 8 --seq-q 4
log "done"
