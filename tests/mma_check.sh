#!/usr/bin/env bash
# Offline checks of the matrix kernel's NVIDIA backend (cl/fused_mma.cl over cl/mma.cl, MMA_NV 1),
# which no test device here runs: compiled as src/program.c assembles it, by clang's NVPTX target
# with libclc's OpenCL built-ins (Debian's libclc-15) to PTX, then by the CUDA toolkit's ptxas for
# sm_80 and sm_90 (when installed). Each variant must compile, hold exactly the mma.sync
# instructions its tile calls for (S: DP/K x BN/8, P·V: BN/K x DVP/8; three each with 3xTF32:
# fully unrolled, fragments in registers), assemble, spill nothing and stay within its register
# budget (255, the most a thread may have, or less where the variant is meant to leave room), and
# hold the 8 butterfly shuffles of the rows' softmax (nothing else of the kernel shuffles so).
# It cannot check what NVIDIA's driver accepts: scripts/gpu-check.sh probes that on a GPU.
#
#   tests/mma_check.sh CL_DIR
#
# Exit 77 (skipped) without clang-15 and libclc-15's nvptx64 library.
set -uo pipefail
cl=$1
clang=$(command -v clang-15 || true)
libclc=/usr/lib/clc/nvptx64--nvidiacl.bc
ptxas=$(command -v ptxas || ls /usr/local/cuda/bin/ptxas 2>/dev/null || true)
if [ -z "$clang" ] || [ ! -f "$libclc" ]; then
  echo "clang-15 or $libclc missing (apt-get install clang-15 libclc-15): skipped"
  exit 77
fi
[ -n "$ptxas" ] || echo "no ptxas (CUDA toolkit): PTX only"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat "$cl/common.cl" "$cl/kv_access.cl" "$cl/attn_common.cl" "$cl/mma_layout.cl" "$cl/mma.cl" "$cl/fused_mma.cl" >"$tmp/src.cl"
fail=0

# check REG_BUDGET DT_IN NW BN DP DVP QREG [more -D options]
check() {
  local budget=$1 dt=$2 nw=$3 bn=$4 dp=$5 dvp=$6 qreg=$7
  shift 7
  local k=16 x=1
  [ "$dt" -eq 0 ] && k=8 && x=3
  local want=$(((dp / k) * (bn / 8) * x + (bn / k) * (dvp / 8) * x))
  local what="DT_IN=$dt NW=$nw BN=$bn DP=$dp DVP=$dvp QREG=$qreg $*"
  if ! "$clang" -x cl -cl-std=CL1.2 -cl-mad-enable -target nvptx64-nvidia-nvcl -Xclang -finclude-default-header -O2 \
       -march=sm_80 -Xclang -mlink-builtin-bitcode -Xclang "$libclc" -Wno-linker-warnings \
       -DHAS_FMA=1 -DMMA_NV=1 -DDT_OUT=0 -DDT_IN="$dt" -DNW="$nw" -DBN="$bn" -DDP="$dp" -DDVP="$dvp" \
       -DQREG="$qreg" "$@" -S -o "$tmp/k.ptx" "$tmp/src.cl" >"$tmp/log" 2>&1; then
    echo "FAIL $what: does not compile"
    head -n 20 "$tmp/log"
    fail=1
    return
  fi
  local n
  n=$(grep -c "mma.sync.aligned" "$tmp/k.ptx")
  if [ "$n" -ne "$want" ]; then
    echo "FAIL $what: $n mma.sync, expected $want"
    fail=1
    return
  fi
  # The row maximum and sum of rows g and g + 8, each over the 4 lanes of a row: 2 x 2 x 2.
  local nb
  nb=$(grep -c "shfl.sync.bfly" "$tmp/k.ptx")
  if [ "$nb" -ne 8 ]; then
    echo "FAIL $what: $nb shfl.sync.bfly, expected 8"
    fail=1
    return
  fi
  # The weights' exponentials on the special-function unit (ex2.approx), not libclc's exp2 (33
  # instructions with a division): at least one a weight of a lane (BN / 2).
  local ne
  ne=$(grep -c "ex2.approx.ftz.f32" "$tmp/k.ptx")
  if [ "$ne" -lt $((bn / 2)) ]; then
    echo "FAIL $what: $ne ex2.approx.ftz.f32, expected at least $((bn / 2))"
    fail=1
    return
  fi
  local line="ok   $what: $n mma.sync, $nb shfl.sync.bfly, $ne ex2.approx"
  # With MMA_LDSM: one ldmatrix.x4 a pair of S's n-tiles a k-step, one .trans a pair of O's
  # column tiles (an odd last one alone) a k-block of P.
  local nl nt wl wt
  nl=$(grep -c "ldmatrix.sync.aligned.m8n8.x4.shared.b16" "$tmp/k.ptx")
  nt=$(grep -c "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" "$tmp/k.ptx")
  wl=0 wt=0
  case " $* " in *" -DMMA_LDSM=1 "*)
    if [ "$dt" -ne 0 ]; then wl=$(((dp / 16) * (bn / 16))); wt=$(((bn / 16) * ((dvp / 8 + 1) / 2))); fi ;;
  esac
  if [ "$nl" -ne "$wl" ] || [ "$nt" -ne "$wt" ]; then
    echo "FAIL $what: $nl ldmatrix and $nt ldmatrix.trans, expected $wl and $wt"
    fail=1
    return
  fi
  [ "$wl" -gt 0 ] && line="$line, $nl + $nt ldmatrix"
  if [ -n "$ptxas" ]; then
    for arch in sm_80 sm_90; do
      if ! "$ptxas" -arch=$arch -v "$tmp/k.ptx" -o "$tmp/k.cubin" >"$tmp/ptxas" 2>&1; then
        echo "FAIL $what: ptxas -arch=$arch"
        head -n 10 "$tmp/ptxas"
        fail=1
        return
      fi
      local regs spill stack
      regs=$(sed -n 's/.*Used \([0-9]*\) registers.*/\1/p' "$tmp/ptxas" | head -n 1)
      spill=$(sed -n 's/.*[^0-9]\([0-9][0-9]*\) bytes spill stores.*/\1/p' "$tmp/ptxas" | head -n 1)
      # a stack frame: a private array left in (off-chip) local memory, as bad as a spill
      stack=$(sed -n 's/.*[^0-9]\([0-9][0-9]*\) bytes stack frame.*/\1/p' "$tmp/ptxas" | head -n 1)
      if [ "${spill:-1}" != "0" ] || [ "${stack:-1}" != "0" ] || [ "${regs:-999}" -gt "$budget" ]; then
        echo "FAIL $what: $arch: $regs registers (budget $budget), ${spill:-?} bytes of spill stores, ${stack:-?} bytes of stack"
        fail=1
        return
      fi
      line="$line, $arch $regs registers"
    done
  fi
  echo "$line"
}

# f16 and bf16 (m16n8k16): the defaults of src/fused_mma.c for head sizes 64, 128, 256, with
# rows on 16 bytes (MMA_ALIGN16: 16-byte loads), and without.
# With ldmatrix (MMA_LDSM: the NVIDIA default once the driver's probe passed, up to 128 columns
# of O: at 256 its fragments spilled on sm_80) and without.
check 168 1 4 64 64 64 1 -DMMA_ALIGN16=1 -DMMA_LDSM=1
check 168 2 4 64 64 64 1 -DMMA_ALIGN16=1 -DMMA_LDSM=1
check 255 1 4 32 128 128 1 -DMMA_ALIGN16=1 -DMMA_LDSM=1
check 255 1 2 16 256 256 0 -DMMA_ALIGN16=1
check 168 1 1 32 112 40 1 -DMMA_LDSM=1
check 168 1 4 64 64 64 1 -DMMA_ALIGN16=1
check 255 1 4 32 128 128 1 -DMMA_ALIGN16=1
check 168 1 4 64 64 64 1
check 168 2 4 64 64 64 1
check 168 1 4 64 64 64 1 -DDT_MASK=1 -DMFLAGS=1
check 255 1 4 32 128 128 1
check 255 2 4 32 128 128 1
check 255 1 2 16 256 256 0
check 255 1 1 32 112 40 1
# KV caches (kv_access.cl): paged f16 K/V, and paged q8_0 K with q4_0 V decoded into the f16 tiles,
# with packed sequences.
check 168 1 4 64 64 64 1 -DKVC=1 -DPAGE=16 -DDT_K=1 -DDT_V=1
check 255 1 4 32 128 128 1 -DKVC=1 -DPAGE=16 -DDT_K=6 -DDT_V=7 -DVARLEN=1
# f32 through 3xTF32 (m16n8k8): Q reloaded from local memory, 16-key tiles, O in blocks of 64
# columns.
check 200 0 4 16 64 64 0 -DMMA_ALIGN16=1 -DMMA_LDSM=1
check 200 0 4 16 64 64 0
check 200 0 2 16 128 64 0
check 200 0 4 16 64 64 0 -DDT_MASK=0 -DMFLAGS=1
check 200 0 1 16 256 64 0
# The ldmatrix probe (ldsm_probe, src/matrix.c) as the host builds it for the device.
if "$clang" -x cl -cl-std=CL1.2 -target nvptx64-nvidia-nvcl -Xclang -finclude-default-header -O2 -march=sm_80 \
     -Xclang -mlink-builtin-bitcode -Xclang "$libclc" -Wno-linker-warnings -DHAS_FMA=1 -DDT_IN=1 -DDT_OUT=0 \
     -DDT_MASK=0 -DMMA_NV=1 -DMMA_LDSM=1 -DKSEL=1 -DK_ldsm_probe=1 -S -o "$tmp/p.ptx" "$tmp/src.cl" >"$tmp/log" 2>&1 &&
   [ "$(grep -c "ldmatrix.sync.aligned.m8n8.x4" "$tmp/p.ptx")" -eq 3 ] &&
   { [ -z "$ptxas" ] || "$ptxas" -arch=sm_80 "$tmp/p.ptx" -o "$tmp/p.cubin" >"$tmp/ptxas" 2>&1; }; then
  echo "ok   ldsm_probe: 3 ldmatrix"
else
  echo "FAIL ldsm_probe: does not compile or assemble, or not 3 ldmatrix"
  head -n 20 "$tmp/log" "$tmp/ptxas" 2>/dev/null
  fail=1
fi
exit $fail
