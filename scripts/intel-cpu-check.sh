#!/usr/bin/env bash
# The test suite (or part of it) and the benchmark on a second OpenCL implementation: Intel's CPU
# runtime, from its PyPI wheels (intel-opencl-rt with the compiler runtime and TBB it links), next
# to PoCL on the same CPU. Its compiler (Intel's own, with an implicit vectorizer) is not PoCL's,
# so a kernel that leans on something PoCL happens to do shows here. Nothing is installed into the
# system: the wheels (a 260 MB download) are unpacked into build/ci/intel-ocl/ (about 800 MB,
# ignored by git) and registered with the ICD loader through OCL_ICD_VENDORS for this script's
# OpenCL commands only.
#
#   scripts/intel-cpu-check.sh [STEPS [CTEST_REGEX]]
#
# STEPS: a comma list of tests, bench (default tests). CTEST_REGEX picks the tests (default: all;
# on 2 cores with a cold kernel cache test_attention alone took 13 minutes, test_scores 3, before
# programs held only their own kernels: KSEL, cl/common.cl).
# CLATTN_INTEL_BUILD names a configured build folder to reuse (test.sh passes build/ci/release;
# default build/ci/intel, configured here), CLATTN_INTEL_TIMEOUT caps the tests' wall time in
# seconds (default 1800). Exits 0 with a message, testing nothing, where the wheels cannot be
# fetched or unpacked (no pip, no network, no disk) or the runtime offers no device (it needs an
# x86-64 CPU with SSE4.2); a failing test, or tests past the cap, exit non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=,${1:-tests},
tests=${2:-.}
for s in ${steps//,/ }; do
  case $s in tests | bench) ;; *) echo "intel-cpu-check: unknown step '$s' (tests, bench)" >&2; exit 2 ;; esac
done
root=$PWD/build/ci/intel-ocl
# Versions measured with (2026-11-28); newer ones are likely fine, these are known to pass.
wheels=(intel-opencl-rt==2026.2.0 intel-cmplr-lib-rt==2026.2.0 tbb==2023.2.0)
stamp="${wheels[*]} $root"

skip() { echo "intel-cpu-check: skipped: $1"; exit 0; }
[ "$(uname -m)" = x86_64 ] || skip "Intel's CPU runtime is x86-64 only (this is $(uname -m))"
# Fetched again when the pinned versions or the folder's place change, or an earlier run stopped
# before the end (the stamp is written last).
if [ "$(cat "$root/ready" 2>/dev/null || true)" != "$stamp" ]; then
  rm -rf "$root"
  mkdir -p "$root/wheels" "$root/unpacked" "$root/lib"
  py=$(command -v python3 || true)
  [ -n "$py" ] && "$py" -m pip --version >/dev/null 2>&1 || skip "python3 -m pip is not available"
  echo "intel-cpu-check: fetching ${wheels[*]} (260 MB)"
  timeout 900 "$py" -m pip download -q --no-cache-dir --timeout 30 --retries 2 --no-deps \
    --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --python-version 3.11 -d "$root/wheels" "${wheels[@]}" ||
    skip "pip could not fetch the wheels (network, or the index)"
  for w in "$root"/wheels/*.whl; do
    "$py" -m zipfile -e "$w" "$root/unpacked" || skip "could not unpack $w (disk space?)"
  done
  rm -rf "$root/wheels"
  # The runtime's own lib folder also holds an ICD loader (libOpenCL.so*); leaving that out keeps
  # the system's loader, which then lists PoCL and Intel's runtime side by side.
  for f in "$root"/unpacked/*.data/data/lib/*; do
    case ${f##*/} in libOpenCL.so*) ;; *) ln -sf "$f" "$root/lib/" ;; esac
  done
  [ -e "$root/lib/libintelocl.so" ] || skip "the wheels hold no libintelocl.so"
  echo "$stamp" >"$root/ready"
fi
# The ICDs the loader sees: this runtime, and the system's, PoCL's included (test_device and
# test_threads open every device they find), but not another copy of Intel's runtimes. The
# system's are those of OCL_ICD_VENDORS when it names a folder (test.sh's: PoCL's alone), else
# /etc/OpenCL/vendors.
system_icds=/etc/OpenCL/vendors
[ -d "${OCL_ICD_VENDORS:-}" ] && system_icds=$OCL_ICD_VENDORS
rm -rf "$root/vendors" && mkdir -p "$root/vendors"
echo "$root/lib/libintelocl.so" >"$root/vendors/intel-cpu.icd"
for icd in "$system_icds"/*.icd; do
  case ${icd##*/} in *intel* | *Intel*) ;; *) [ -e "$icd" ] && cp "$icd" "$root/vendors/" ;; esac
done
# Only the OpenCL commands see the runtime's libraries (its libimf, libsvml, libtbb...): the
# toolchain below does not.
ocl() {
  LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" OCL_ICD_VENDORS="$root/vendors" "$@"
}

build=${CLATTN_INTEL_BUILD:-build/ci/intel}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCLATTN_TEST_CACHE_DIR="$PWD/$build/kernel-cache" \
    >/dev/null
fi
cmake --build "$build" -j"$(nproc)" >/dev/null
# The kernel cache the tests use (the folder's CLATTN_TEST_CACHE_DIR); the benchmark shares it.
cache=$(sed -n 's/^CLATTN_TEST_CACHE_DIR:PATH=//p' "$build/CMakeCache.txt")
cache=${cache:-$PWD/$build/kernel-cache}
mkdir -p "$cache"

# The device: platform P's first device, P the platform named exactly "Intel(R) OpenCL" (a
# substring would also match Intel's GPU runtime, "Intel(R) OpenCL Graphics", and with PoCL on an
# Intel CPU, "intel" matches PoCL's device too). The runtime may load and still offer no device
# (a CPU it does not support): then nothing here would run on it.
info=$(ocl "$build"/tools/clattn-info 2>&1 || true)
p=$(sed -n 's/^Platform \([0-9]*\): Intel(R) OpenCL$/\1/p' <<<"$info" | head -n 1)
[ -n "$p" ] && grep -q "^  Device $p:0 " <<<"$info" ||
  skip "Intel's runtime offers no device here: $(grep -E '^(Platform|  Device)' <<<"$info" | tr '\n' ' ')"
dev=$p:0
sed -n "/^Platform $p: /,/device key/p" <<<"$info" | grep -E 'Platform|Device|version|fp16|key' || true

if [[ $steps == *,tests,* ]]; then
  echo "== tests on Intel's CPU runtime, device $dev ($tests)"
  (cd "$build" && ocl env CLATTN_DEVICE="$dev" CLATTN_REQUIRE_DEVICE=1 timeout "${CLATTN_INTEL_TIMEOUT:-1800}" \
    ctest --output-on-failure -j"$(nproc)" -R "$tests")
fi
if [[ $steps == *,bench,* ]]; then
  echo "== benchmark on Intel's CPU runtime, device $dev"
  ocl env CLATTN_DEVICE="$dev" CLATTN_CACHE_DIR="$cache" "$build"/tools/clattn-bench --op all --check
fi
