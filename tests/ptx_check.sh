#!/usr/bin/env bash
# Compiles the kernels' NVIDIA-only branches (inline PTX: decode_lanes with SHFL 1, decode_rows
# with GSYNC 1) to PTX with clang, which no test device here builds: PoCL takes the portable
# branches. Catches what a compiler sees (undeclared names, types, asm operand constraints) and
# checks that each variant emits its PTX instruction exactly as often as its loops, fully
# unrolled, call for (a rolled loop would index the register arrays); it cannot check what
# NVIDIA's driver does with the PTX. clang's OpenCL mode knows `asm` only as
# __asm__, which NVIDIA's compiler also takes as `asm`.
#
#   tests/ptx_check.sh CLANG CL_DIR
#
# Exit 77 (skipped) when clang has no NVPTX target.
set -uo pipefail
clang=$1
cl=$2
"$clang" -print-targets 2>/dev/null | grep -q nvptx64 || { echo "no NVPTX target in $clang: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# check FILE INSTRUCTION COUNT DEFINES...
check() {
  local file=$1 insn=$2 want=$3
  shift 3
  # As src/program.c assembles the attention families: common.cl, kv_access.cl, attn_common.cl, the file.
  cat "$cl/common.cl" "$cl/kv_access.cl" "$cl/attn_common.cl" "$cl/$file" >"$tmp/src.cl"
  if ! "$clang" -x cl -cl-std=CL1.2 -target nvptx64-nvidia-nvcl -Xclang -finclude-default-header -O2 \
       -Dasm=__asm__ -DHAS_FMA=1 -DDT_OUT=0 -DDT_MASK=0 "$@" -S -o "$tmp/out.ptx" "$tmp/src.cl" \
       >"$tmp/log" 2>&1; then
    echo "FAIL $file $*: does not compile"
    head -n 20 "$tmp/log"
    fail=1
    return
  fi
  local n
  n=$(grep -c "$insn" "$tmp/out.ptx")
  if [ "$n" -ne "$want" ]; then
    echo "FAIL $file $*: $n '$insn' instructions, expected $want"
    fail=1
    return
  fi
  echo "ok   $file $*: $n '$insn'"
}

# decode_lanes, SHFL 1: log2(LANES) levels of RM·KU shuffles each. (f32 and bf16 storage: clang's
# NVPTX headers lack vload_half, and the storage type does not touch the PTX branches.)
lanes() { check decode_lanes.cl shfl.sync.bfly "$@"; }
lanes 40 -DSHFL=1 -DDT_IN=0 -DKG=4 -DLANES=32 -DRM=1 -DDP=128 -DDVP=128 -DKU=8 -DKFULL=1 -DVFULL=1
lanes 48 -DSHFL=1 -DDT_IN=0 -DKG=4 -DLANES=8 -DRM=4 -DDP=64 -DDVP=64 -DKU=4 -DKFULL=1 -DVFULL=1
lanes 24 -DSHFL=1 -DDT_IN=2 -DKG=2 -DLANES=16 -DRM=3 -DDP=60 -DDVP=36 -DKU=2 -DKFULL=0 -DVFULL=0
lanes 80 -DSHFL=1 -DDT_IN=0 -DKG=1 -DLANES=32 -DRM=16 -DDP=256 -DDVP=256 -DKU=1 -DKFULL=1 -DVFULL=1
# MASKED 1 (a mask passed): the group ORs its visibility bits (log2(LANES) more), and the warp
# the groups' bits (5 - log2(LANES)): 5 more whatever LANES.
lanes 45 -DMASKED=1 -DSHFL=1 -DDT_IN=0 -DKG=4 -DLANES=32 -DRM=1 -DDP=128 -DDVP=128 -DKU=8 -DKFULL=1 -DVFULL=1
lanes 53 -DMASKED=1 -DSHFL=1 -DDT_IN=0 -DKG=4 -DLANES=8 -DRM=4 -DDP=64 -DDVP=64 -DKU=4 -DKFULL=1 -DVFULL=1
lanes 29 -DMASKED=1 -DSHFL=1 -DDT_IN=2 -DKG=2 -DLANES=16 -DRM=3 -DDP=60 -DDVP=36 -DKU=2 -DKFULL=0 -DVFULL=0
lanes 85 -DMASKED=1 -DSHFL=1 -DDT_IN=0 -DKG=1 -DLANES=32 -DRM=16 -DDP=256 -DDVP=256 -DKU=1 -DKFULL=1 -DVFULL=1
# decode_rows, GSYNC 1: named barriers (W a multiple of 32) or warp barriers (W below 32), two
# a step, three with KL > 1.
rows() { check decode.cl "$@"; }
rows "bar.sync" 2 -DGSYNC=1 -DDT_IN=0 -DKG=4 -DW=32 -DRM=1 -DDP=128 -DKL=1 -DLC=8 -DKFULL=1 -DVFULL=1
rows "bar.sync" 3 -DGSYNC=1 -DDT_IN=2 -DKG=2 -DW=64 -DRM=4 -DDP=256 -DKL=8 -DLC=16 -DKFULL=1 -DVFULL=1
rows "bar.warp.sync" 2 -DGSYNC=1 -DDT_IN=0 -DKG=4 -DW=16 -DRM=2 -DDP=64 -DKL=1 -DLC=4 -DKFULL=1 -DVFULL=1
# ... reading a KV cache (kv_access.cl): paged int8 K and fp8 V, packed sequences.
rows "bar.sync" 2 -DGSYNC=1 -DDT_IN=0 -DKG=4 -DW=32 -DRM=1 -DDP=128 -DKL=1 -DLC=8 -DKFULL=1 -DVFULL=1 \
  -DKVC=1 -DPAGE=16 -DDT_K=3 -DDT_V=4 -DVARLEN=1
rows "bar.sync" 3 -DGSYNC=1 -DDT_IN=2 -DKG=2 -DW=64 -DRM=4 -DDP=256 -DKL=8 -DLC=16 -DKFULL=1 -DVFULL=1 \
  -DKVC=1 -DPAGE=1 -DDT_K=5 -DDT_V=3
exit $fail
