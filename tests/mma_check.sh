#!/usr/bin/env bash
# Offline checks of the matrix kernel's NVIDIA backend (cl/fused_mma.cl over cl/mma.cl, MMA_NV 1)
# and of its AMD backends (MMA_AMD 1 and 2) and Intel's (MMA_INTEL 1, at the end), which no test
# device here runs: compiled as
# src/program.c assembles it, by clang's NVPTX target with libclc's OpenCL built-ins (Debian's
# libclc-19) to PTX, then by the CUDA toolkit's ptxas for sm_80 and sm_90 (when installed). Each
# variant must compile, hold exactly the mma.sync instructions its tile calls for (S: DP/K x
# BN/8, P·V: BN/K x DVP/8; three each with 3xTF32: fully unrolled, fragments in registers),
# assemble, spill nothing and stay within its register budget (255, the most a thread may have,
# or less where the variant is meant to leave room), and hold the 8 butterfly shuffles of the
# rows' softmax (nothing else of the kernel shuffles so).
# It cannot check what NVIDIA's driver accepts: scripts/gpu-check.sh probes that on a GPU.
# The AMD backends go through clang's amdgcn target (MFMA: gfx90a and gfx942; RDNA3's WMMA: gfx1100
# and gfx1151) with libclc's amdgcn library: it must compile, hold the tile's v_mfma products, the 8 ds_bpermute of the row
# exchanges, a v_exp_f32 a weight, no scratch accesses (no buffer_ or scratch_ instruction: the
# kernel's global memory goes through global_ ones; clang 19 reserves a private segment it never
# touches) and no VGPR spill, and stay within a budget of VGPRs and AGPRs together (256: two
# wavefronts a SIMD at least; head size 256, 512).
#
#   tests/mma_check.sh CL_DIR
#
# Exit 77 (skipped) without a clang that links libclc's nvptx64 library (clang-19 with libclc-19,
# or clang-15 with libclc-15: the bitcode must be of the compiler's LLVM version).
set -uo pipefail
cl=$1
libclc=/usr/lib/clc/nvptx64--nvidiacl.bc
libclc_amd=/usr/lib/clc/amdgcn--amdhsa.bc
ptxas=$(command -v ptxas || ls /usr/local/cuda/bin/ptxas 2>/dev/null || true)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
clang=""
if [ -f "$libclc" ]; then
  echo '__kernel void k(__global float *x) { x[0] = exp2(x[1]); }' >"$tmp/t.cl"
  for c in clang-19 clang-15; do
    command -v "$c" >/dev/null || continue
    if "$c" -x cl -cl-std=CL1.2 -target nvptx64-nvidia-nvcl -Xclang -finclude-default-header -O2 \
         -Xclang -mlink-builtin-bitcode -Xclang "$libclc" -Wno-linker-warnings -S -o "$tmp/t.ptx" "$tmp/t.cl" \
         >/dev/null 2>&1; then
      clang=$(command -v "$c")
      break
    fi
  done
fi
if [ -z "$clang" ]; then
  echo "no clang that links $libclc (apt-get install clang-19 libclc-19): skipped"
  exit 77
fi
echo "$("$clang" --version | head -n 1)"
[ -n "$ptxas" ] || echo "no ptxas (CUDA toolkit): PTX only"
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
# Budgets: 192 at head size 64 (three work-groups of 4 warps an SM; clang 15's PTX took 164-168
# registers there, clang 19's 179-184), else 255.
# With ldmatrix (MMA_LDSM: the NVIDIA default once the driver's probe passed, up to 128 columns
# of O: at 256 its fragments spilled on sm_80) and without.
check 192 1 4 64 64 64 1 -DMMA_ALIGN16=1 -DMMA_LDSM=1
check 192 2 4 64 64 64 1 -DMMA_ALIGN16=1 -DMMA_LDSM=1
check 255 1 4 32 128 128 1 -DMMA_ALIGN16=1 -DMMA_LDSM=1
check 255 1 2 16 256 256 0 -DMMA_ALIGN16=1
check 192 1 1 32 112 40 1 -DMMA_LDSM=1
check 192 1 4 64 64 64 1 -DMMA_ALIGN16=1
check 255 1 4 32 128 128 1 -DMMA_ALIGN16=1
check 192 1 4 64 64 64 1
check 192 2 4 64 64 64 1
check 192 1 4 64 64 64 1 -DDT_MASK=1 -DMFLAGS=1
check 255 1 4 32 128 128 1
check 255 2 4 32 128 128 1
check 255 1 2 16 256 256 0
check 255 1 1 32 112 40 1
# KV caches (kv_access.cl): paged f16 K/V, and paged q8_0 K with q4_0 V decoded into the f16 tiles,
# with packed sequences.
check 192 1 4 64 64 64 1 -DKVC=1 -DPAGE=16 -DDT_K=1 -DDT_V=1
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

# check_amd BUDGET AMD DT_IN NW BN DP DVP QREG [more -D options]: AMD 1, MFMA (16x16x16 for
# 16-bit types, 16x16x4 f32; gfx90a and gfx942), or AMD 2, RDNA3's WMMA (16x16x16, f16 and bf16;
# gfx1100 and gfx1151); Sᵀ = K·Qᵀ: DP/K x BN/16 products, Oᵀ = Vᵀ·Pᵀ: BN/K x DVP/16; BUDGET: VGPRs
# and AGPRs together (512: one wavefront a SIMD). ds_bpermute: MFMA 8 (2 x 2 rounds of the rows'
# reductions, 4 for the exact path's fetch), WMMA 6 + 4 a k-block of P (one round, and P's
# weights from the other half-wave).
check_amd() {
  local budget=$1 amd=$2 dt=$3 nw=$4 bn=$5 dp=$6 dvp=$7 qreg=$8
  shift 8
  local k=16 archs="gfx90a gfx942" wb=8 ins=v_mfma_f32_16x16
  [ "$dt" -eq 0 ] && k=4
  [ "$amd" -eq 2 ] && archs="gfx1100 gfx1151" wb=$((6 + 4 * bn / 16)) ins=v_wmma_f32_16x16x16
  local want=$(((dp / k) * (bn / 16) + (bn / k) * (dvp / 16)))
  local what="amd$amd DT_IN=$dt NW=$nw BN=$bn DP=$dp DVP=$dvp QREG=$qreg $*" line=""
  for arch in $archs; do
    if ! "$clang" -x cl -cl-std=CL1.2 -cl-mad-enable -target amdgcn-amd-amdhsa -mcpu=$arch -nogpulib \
         -Xclang -finclude-default-header -O2 -Xclang -mlink-builtin-bitcode -Xclang "$libclc_amd" \
         -Wno-linker-warnings -DHAS_FMA=1 -DMMA_AMD="$amd" -DDT_OUT=0 -DDT_IN="$dt" -DNW="$nw" -DBN="$bn" \
         -DDP="$dp" -DDVP="$dvp" -DQREG="$qreg" "$@" -S -o "$tmp/k.s" "$tmp/src.cl" >"$tmp/log" 2>&1; then
      echo "FAIL $what: $arch: does not compile"
      head -n 20 "$tmp/log"
      fail=1
      return
    fi
    local n nb ne priv vspill vgpr agpr
    n=$(grep -c "$ins" "$tmp/k.s")
    nb=$(grep -c "ds_bpermute_b32" "$tmp/k.s")
    ne=$(grep -c "v_exp_f32" "$tmp/k.s")
    priv=$(grep -cE "^[[:space:]]*(buffer|scratch)_(load|store)" "$tmp/k.s")
    vspill=$(sed -n 's/^ *\.vgpr_spill_count: *\([0-9]*\).*/\1/p' "$tmp/k.s" | head -n 1)
    vgpr=$(sed -n 's/^ *\.vgpr_count: *\([0-9]*\).*/\1/p' "$tmp/k.s" | head -n 1)
    agpr=$(sed -n 's/^ *\.agpr_count: *\([0-9]*\).*/\1/p' "$tmp/k.s" | head -n 1)
    if [ "$n" -ne "$want" ] || [ "$nb" -ne "$wb" ] || [ "$ne" -lt $((bn / 4)) ] || [ "${priv:-1}" != "0" ] ||
       [ "${vspill:-1}" != "0" ] || [ $((${vgpr:-999} + ${agpr:-0})) -gt "$budget" ]; then
      echo "FAIL $what: $arch: $n $ins (expected $want), $nb ds_bpermute ($wb), $ne v_exp_f32 (>= $((bn / 4))),"\
           "$priv scratch accesses, ${vspill:-?} VGPR spills, ${vgpr:-?} VGPRs + ${agpr:-?} AGPRs ($budget)"
      fail=1
      return
    fi
    [ -z "$line" ] && line="ok   $what: $n $ins, $nb ds_bpermute, $ne v_exp_f32"
    line="$line, $arch $vgpr + ${agpr:-0} registers"
  done
  echo "$line"
}
# The tile layer's probe (mma_probe, src/matrix.c) as the host builds it for each backend and type
# (the options of clattn__mma_probe_opts, which test_matrix checks).
for dt in 0 1 2; do
  if "$clang" -x cl -cl-std=CL1.2 -target nvptx64-nvidia-nvcl -Xclang -finclude-default-header -O2 -march=sm_80 \
       -Xclang -mlink-builtin-bitcode -Xclang "$libclc" -Wno-linker-warnings -DHAS_FMA=1 -DDT_IN=$dt -DDT_OUT=0 \
       -DDT_MASK=0 -DMMA_NV=1 -DMMA_3X=1 -DKSEL=1 -DK_mma_probe=1 -S -o "$tmp/p.ptx" "$tmp/src.cl" >"$tmp/log" 2>&1 &&
     [ "$(grep -c "mma.sync.aligned" "$tmp/p.ptx")" -ge 2 ] &&
     { [ -z "$ptxas" ] || "$ptxas" -arch=sm_80 "$tmp/p.ptx" -o "$tmp/p.cubin" >"$tmp/ptxas" 2>&1; } &&
     { [ ! -f "$libclc_amd" ] ||
       { "$clang" -x cl -cl-std=CL1.2 -target amdgcn-amd-amdhsa -mcpu=gfx90a -nogpulib -Xclang -finclude-default-header \
           -O2 -Xclang -mlink-builtin-bitcode -Xclang "$libclc_amd" -Wno-linker-warnings -DHAS_FMA=1 -DDT_IN=$dt \
           -DDT_OUT=0 -DDT_MASK=0 -DMMA_AMD=1 -DMMA_LAYOUT=1 -DKSEL=1 -DK_mma_probe=1 -S -o "$tmp/p.s" "$tmp/src.cl" \
           >"$tmp/log" 2>&1 &&
         [ "$(grep -c "v_mfma_f32_16x16" "$tmp/p.s")" -ge 2 ] &&
         { [ "$dt" -eq 0 ] ||
           { "$clang" -x cl -cl-std=CL1.2 -target amdgcn-amd-amdhsa -mcpu=gfx1100 -nogpulib -Xclang \
               -finclude-default-header -O2 -Xclang -mlink-builtin-bitcode -Xclang "$libclc_amd" -Wno-linker-warnings \
               -DHAS_FMA=1 -DDT_IN=$dt -DDT_OUT=0 -DDT_MASK=0 -DMMA_AMD=2 -DMMA_LAYOUT=2 -DKSEL=1 -DK_mma_probe=1 -S -o "$tmp/p.s" \
               "$tmp/src.cl" >"$tmp/log" 2>&1 && [ "$(grep -c "v_wmma_f32_16x16x16" "$tmp/p.s")" -ge 2 ]; }; }; }; }; then
    echo "ok   mma_probe DT_IN=$dt: NVIDIA and AMD"
  else
    echo "FAIL mma_probe DT_IN=$dt: does not compile or assemble for NVIDIA or AMD"
    head -n 20 "$tmp/log" "$tmp/ptxas" 2>/dev/null
    fail=1
  fi
done

if [ -f "$libclc_amd" ]; then
  # the tiles src/fused_mma.c fits to 64 KiB of local memory (64 keys, halved until Q, K and V
  # fit; Q's fragments in registers up to 128)
  check_amd 256 1 1 4 64 64 64 1 -DMMA_ALIGN16=1
  check_amd 256 1 2 4 64 64 64 1 -DMMA_ALIGN16=1
  check_amd 256 1 1 4 64 128 128 1 -DMMA_ALIGN16=1
  check_amd 256 1 2 4 64 128 128 1
  check_amd 512 1 1 4 16 256 256 0 -DMMA_ALIGN16=1
  check_amd 256 1 1 1 64 112 48 1 -DDT_MASK=1 -DMFLAGS=1
  check_amd 256 1 0 4 64 64 64 1 -DMMA_ALIGN16=1
  check_amd 256 1 0 4 32 128 128 1
  check_amd 512 1 0 1 16 256 256 0
  check_amd 256 1 1 4 64 128 128 1 -DKVC=1 -DPAGE=16 -DDT_K=6 -DDT_V=7 -DVARLEN=1
  # RDNA3's WMMA (f16 and bf16): 32-key tiles, Q's fragments (16 registers a k-step) in registers
  # up to head size 64, O in blocks of 128 columns (64 keys, or Q kept, spilled at 128)
  check_amd 256 2 1 4 32 64 64 1 -DMMA_ALIGN16=1
  check_amd 256 2 2 4 32 64 64 1 -DMMA_ALIGN16=1
  check_amd 256 2 1 4 32 128 128 0 -DMMA_ALIGN16=1
  check_amd 256 2 1 1 32 112 48 0 -DDT_MASK=1 -DMFLAGS=1
  check_amd 256 2 1 4 32 256 128 0 -DMMA_ALIGN16=1
  check_amd 256 2 2 4 32 128 128 0 -DKVC=1 -DPAGE=16 -DDT_K=6 -DDT_V=7 -DVARLEN=1
else
  echo "no $libclc_amd: the AMD backend not checked"
fi

# Intel's XMX backends (MMA_INTEL 1 and 2, sub-groups of 16 and 8) through clang's spir64 target
# to LLVM IR: no Intel GPU compiler here knows cl_intel_subgroup_matrix_multiply_accumulate
# (Debian's ocloc predates it), so this checks what can be checked without one: the kernel compiles against the
# builtins' prototypes as the extension's text declares them (xmx.h below; clang's opencl-c.h
# has the cl_intel_subgroups shuffles), holds exactly the tile's products (Sᵀ: DP/16 x BN/8, Oᵀ:
# BN/16 x DVP/8, M = 8 rows a product) and one exp2 a weight in each copy of the weights' loop,
# requires its sub-group size (!intel_reqd_sub_group_size), and calls no shuffle but the exact
# path's one (a row never leaves its work-item), and loads A's 8 rows as one local load each (16
# bits, or 32 on sub-groups of 8: a pair of k). Registers and spills need Intel's compiler.
cat >"$tmp/xmx.h" <<'XMX'
float8 __attribute__((overloadable)) intel_sub_group_f16_f16_matrix_mad_k16(short8 a, int8 b, float8 acc);
float8 __attribute__((overloadable)) intel_sub_group_bf16_bf16_matrix_mad_k16(short8 a, int8 b, float8 acc);
float8 __attribute__((overloadable)) intel_sub_group_f16_f16_matrix_mad_k16(int8 a, int8 b, float8 acc);
float8 __attribute__((overloadable)) intel_sub_group_bf16_bf16_matrix_mad_k16(int8 a, int8 b, float8 acc);
XMX
ocl_h="$("$clang" -print-resource-dir)/include/opencl-c.h"
intel_cc() {
  "$clang" -x cl -cl-std=CL1.2 -cl-mad-enable -target spir64 -include "$ocl_h" \
    -Xclang -cl-ext=+cl_intel_subgroups,+cl_khr_fp16 -include "$tmp/xmx.h" -O2 -DHAS_FMA=1 \
    -DDT_OUT=0 "$@" -emit-llvm -S -o "$tmp/k.ll" "$tmp/src.cl" >"$tmp/log" 2>&1
}
# check_intel INTEL DT_IN NW BN DP DVP QREG [more -D options]: INTEL 1 sub-groups of 16 (A short8),
# 2 sub-groups of 8 (A int8, a warp two sub-groups: the same products a sub-group)
check_intel() {
  local intel=$1 dt=$2 nw=$3 bn=$4 dp=$5 dvp=$6 qreg=$7
  shift 7
  local want=$(((dp / 16) * (bn / 8) + (bn / 16) * (dvp / 8))) sgw=16 aty=Dv8_s lty=i16
  [ "$intel" -eq 2 ] && sgw=8 aty=Dv8_i lty=i32
  local what="intel$intel DT_IN=$dt NW=$nw BN=$bn DP=$dp DVP=$dvp QREG=$qreg $*"
  if ! intel_cc -DMMA_INTEL="$intel" -DDT_IN="$dt" -DNW="$nw" -DBN="$bn" -DDP="$dp" -DDVP="$dvp" -DQREG="$qreg" "$@"; then
    echo "FAIL $what: does not compile for spir64"
    head -n 20 "$tmp/log"
    fail=1
    return
  fi
  local n ne nsh sg nl
  n=$(grep -c "call .*matrix_mad_k16${aty}" "$tmp/k.ll")
  nl=$(grep -c "load $lty, ptr addrspace(3)" "$tmp/k.ll")
  ne=$(grep -c "call .*native_exp2" "$tmp/k.ll")
  nsh=$(grep -c "call .*intel_sub_group_shuffle" "$tmp/k.ll")
  sg=$(sed -n 's/.*!intel_reqd_sub_group_size !\([0-9]*\).*/\1/p' "$tmp/k.ll" | head -n 1)
  sg=$(sed -n "s/^!$sg = !{i32 \([0-9]*\)}/\1/p" "$tmp/k.ll")
  if [ "$n" -ne "$want" ] || [ "$ne" -ne $((2 * bn + 1)) ] || [ "$nsh" -ne 1 ] || [ "$sg" != "$sgw" ] ||
     [ "$nl" -lt $((8 * want)) ]; then
    echo "FAIL $what: $n products with A $aty (expected $want), $ne exp2 ($((2 * bn + 1))), $nsh shuffles (1)," \
         "sub-group size ${sg:-none} ($sgw), $nl $lty local loads (>= $((8 * want)): 8 an A)"
    fail=1
    return
  fi
  echo "ok   $what: $n intel_sub_group_*_matrix_mad_k16, $ne native_exp2, sub-groups of $sgw"
}
# the host's tiles: 32 keys, Q's fragments kept up to head size 64, O in blocks of 128 columns
check_intel 1 1 4 32 64 64 1 -DMMA_ALIGN16=1
check_intel 1 2 4 32 64 64 1 -DMMA_ALIGN16=1
check_intel 1 1 4 32 128 128 0 -DMMA_ALIGN16=1
check_intel 1 1 1 32 112 48 0 -DDT_MASK=1 -DMFLAGS=1
check_intel 1 2 4 32 256 128 0
check_intel 1 1 4 32 128 128 0 -DKVC=1 -DPAGE=16 -DDT_K=6 -DDT_V=7 -DVARLEN=1
check_intel 2 1 4 32 64 64 1 -DMMA_ALIGN16=1
check_intel 2 2 4 32 128 128 0 -DMMA_ALIGN16=1
check_intel 2 1 1 32 112 48 0 -DDT_MASK=1 -DMFLAGS=1
for intel in 1 2; do
  for dt in 1 2; do
    if intel_cc -DMMA_INTEL=$intel -DDT_IN=$dt -DDT_MASK=0 -DMMA_NV=0 -DMMA_AMD=0 -DMMA_LAYOUT=$((intel + 2)) -DMMA_3X=1 \
         -DKSEL=1 -DK_mma_probe=1 && [ "$(grep -c "call .*matrix_mad_k16" "$tmp/k.ll")" -eq 3 ]; then
      echo "ok   mma_probe DT_IN=$dt: Intel $intel"
    else
      echo "FAIL mma_probe DT_IN=$dt: does not compile for Intel $intel (spir64) or not 3 products"
      head -n 20 "$tmp/log"
      fail=1
    fi
  done
done
exit $fail
