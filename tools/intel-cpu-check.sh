#!/usr/bin/env bash
# The test suite (or part of it) and the benchmark on a second OpenCL implementation: Intel's CPU
# runtime, from its PyPI wheels (intel-opencl-rt with the compiler runtime and TBB it links), next
# to PoCL on the same CPU. Its compiler (Intel's own, with an implicit vectorizer) is not PoCL's,
# so a kernel that leans on something PoCL happens to do shows here. Nothing is installed into the
# system: the wheels are unpacked into .intel-ocl/ (ignored by git) and registered with the ICD
# loader through OCL_ICD_VENDORS for this script's commands only.
#
#   tools/intel-cpu-check.sh [STEPS [CTEST_REGEX]]
#
# STEPS: a comma list of tests, bench (default tests). CTEST_REGEX picks the tests (default: all;
# the whole suite took 18 minutes on 2 cores with a cold kernel cache, test_attention alone 5).
# Exits 0 with a message, testing nothing, where the wheels cannot be fetched (no pip, no
# network) or the runtime shows no device (it needs an x86-64 CPU with SSE4.2); any test failure
# exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=,${1:-tests},
tests=${2:-.}
root=$PWD/.intel-ocl
# Versions measured with (2026-11-28); newer ones are likely fine, these are known to pass.
wheels=(intel-opencl-rt==2026.2.0 intel-cmplr-lib-rt==2026.2.0 tbb==2023.2.0)

skip() { echo "intel-cpu-check: skipped: $1"; exit 0; }
[ "$(uname -m)" = x86_64 ] || skip "Intel's CPU runtime is x86-64 only (this is $(uname -m))"
if [ ! -f "$root/ready" ]; then
  rm -rf "$root"
  mkdir -p "$root/wheels" "$root/unpacked" "$root/lib" "$root/vendors"
  py=$(command -v python3 || true)
  [ -n "$py" ] && "$py" -m pip --version >/dev/null 2>&1 || skip "python3 -m pip is not available"
  echo "intel-cpu-check: fetching ${wheels[*]} (about 300 MB)"
  "$py" -m pip download -q --timeout 30 --retries 2 --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
    --python-version 3.11 -d "$root/wheels" "${wheels[@]}" || skip "pip could not fetch the wheels"
  for w in "$root"/wheels/*.whl; do
    "$py" -m zipfile -e "$w" "$root/unpacked"
  done
  # The runtime's own lib folder also holds an ICD loader (libOpenCL.so*); leaving that out keeps
  # the system's loader, which then lists PoCL and Intel's runtime side by side.
  for f in "$root"/unpacked/*.data/data/lib/*; do
    case ${f##*/} in libOpenCL.so*) ;; *) ln -sf "$f" "$root/lib/" ;; esac
  done
  [ -e "$root/lib/libintelocl.so" ] || skip "the wheels hold no libintelocl.so"
  echo "$root/lib/libintelocl.so" >"$root/vendors/intel-cpu.icd"
  # PoCL stays registered too (test_device and test_threads open every device they find).
  for icd in /etc/OpenCL/vendors/*.icd; do
    [ -e "$icd" ] && cp "$icd" "$root/vendors/"
  done
  touch "$root/ready"
fi
export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OCL_ICD_VENDORS="$root/vendors"
# The platform's name: PoCL's device on an Intel CPU has "Intel(R) Xeon(R)" in its name too.
export CLATTN_DEVICE="Intel(R) OpenCL"

# CLATTN_INTEL_BUILD names a build folder to reuse as it is configured (test.sh passes its own);
# by default build-intel/, with its kernel cache in build-intel/kernel-cache.
build=${CLATTN_INTEL_BUILD:-build-intel}
cache="$PWD/$build/kernel-cache"
if [ ! -f "$build/CMakeCache.txt" ]; then
  mkdir -p "$cache"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCLATTN_TEST_CACHE_DIR="$cache" >/dev/null
fi
cmake --build "$build" -j"$(nproc)" >/dev/null
# The runtime may load and still offer no device (a CPU it does not support): then nothing here
# would run on it, and CLATTN_DEVICE would fail every test.
info=$("$build"/tools/clattn-info 2>&1 || true)
echo "$info" | grep -q "^  why: .* on Intel(R) OpenCL" ||
  skip "Intel's runtime offers no device here: $(echo "$info" | grep -E '^(Platform|  Device|  why)' | tr '\n' ' ')"
echo "$info" | sed -n '/^Platform .*Intel(R) OpenCL/,/device key/p' | grep -E 'Platform|Device|version|fp16|key'

if [[ $steps == *,tests,* ]]; then
  echo "== tests on Intel's CPU runtime ($tests)"
  (cd "$build" && CLATTN_REQUIRE_DEVICE=1 ctest --output-on-failure -j"$(nproc)" -R "$tests" \
    -E "consumer|ptx_check")
fi
if [[ $steps == *,bench,* ]]; then
  echo "== benchmark on Intel's CPU runtime"
  CLATTN_CACHE_DIR="$cache" "$build"/tools/clattn-bench --op all --check
fi
