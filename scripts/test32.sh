#!/usr/bin/env bash
# Builds clattn for 32-bit x86 and runs part of the test suite there, on 32-bit PoCL, inside an
# i386 Debian root made with debootstrap (build/ci/i386/root; about 1 GB, a minute to make, kept
# for later runs). This is where size_t has 32 bits: sizes that pass 4 GiB must be refused, not
# wrapped, and host arrays are bounded by SIZE_MAX. 32-bit PoCL also computes floats on the x87
# stack without rounding each operation, which the kernels must survive.
#
#   scripts/test32.sh [CTEST_REGEX]
#   scripts/test32.sh --root-only
#
# Needs root (or sudo) and network access to deb.debian.org for the first run. Without them it
# says why and exits 0 (scripts/test.sh runs it as an optional step); CLATTN_REQUIRE_32=1 makes
# that a failure. A failing test always fails. --root-only makes the root where it is missing and
# stops there (scripts/test.sh runs that in the background while its first steps build).
# CTEST_REGEX picks the tests (default: the float64 references, forward and backward (x87
# arithmetic, Philox's 64-bit products on a 32-bit host), the validation, size, failure, limit,
# tuning, cache, device and softmax suites and the guard-page one, about 12 minutes with a cold
# kernel cache).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
work=$src/build/ci/i386
root=$work/root
root_only=0
[ "${1:-}" = --root-only ] && root_only=1 && shift
tests=${1:-'^test_(status|reference|ref_backward|bad_input|failures|limits|limits_rows|tuning|cache|device|softmax|guard)$'}

unavailable() {
  echo "test32: skipped: $1"
  [ "${CLATTN_REQUIRE_32:-0}" != 1 ] || exit 1
  exit 0
}

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  sudo -n true 2>/dev/null || unavailable "needs root or password-less sudo (debootstrap, chroot, mount)"
  SUDO="sudo -n"
fi

# Mounts left under the root by a run that was killed: unmounted first (deepest first). The root is
# only ever deleted with nothing mounted in it.
awk -v r="$root/" 'index($2, r) == 1 { print $2 }' /proc/self/mounts | sort -r |
  while read -r m; do $SUDO umount "$m" || true; done
remove_root() {
  ! grep -q " $root/" /proc/self/mounts || unavailable "$root has mounts left; unmount them first"
  $SUDO rm -rf "$root"
}

# The suite's packages, i386 (no clang/valgrind: no fuzzing or memcheck here).
pkgs=build-essential,cmake,pkg-config,ocl-icd-opencl-dev,opencl-headers,pocl-opencl-icd,libcmocka-dev
if [ ! -x "$root/usr/bin/cmake" ]; then
  if ! command -v debootstrap >/dev/null; then
    $SUDO apt-get install -y -qq --no-install-recommends debootstrap >/dev/null 2>&1 ||
      unavailable "debootstrap is not installed and could not be"
  fi
  remove_root
  mkdir -p "$work"
  echo "test32: making an i386 Debian root in $root"
  if ! $SUDO debootstrap --arch=i386 --variant=minbase --include="$pkgs" bookworm "$root" \
       http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1; then
    tail -n 5 "$work/debootstrap.log"
    remove_root
    unavailable "debootstrap failed (log: $work/debootstrap.log)"
  fi
fi
[ "$root_only" = 0 ] || exit 0

# What the chroot sees of the host, made so that nothing in the root leads back to a writable host
# file (an `rm -rf build` after a killed run must not reach into the host): fresh proc and
# sysfs mounts (their files cannot be deleted), a tmpfs /dev with the few nodes PoCL opens, and
# the source read-only at /src. Unmounted on the way out, whatever happens.
mounts=()
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do $SUDO umount "${mounts[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
mnt() { # where, then mount's arguments
  local where=$1
  shift
  $SUDO mkdir -p "$where"
  $SUDO mount "$@" "$where" || unavailable "cannot mount $where (no mount privilege here?)"
  mounts+=("$where")
}
mnt "$root/proc" -t proc proc
mnt "$root/sys" -t sysfs sysfs
mnt "$root/dev" -t tmpfs -o mode=755,size=64m tmpfs
for n in "null 1 3" "zero 1 5" "random 1 8" "urandom 1 9"; do
  set -- $n
  $SUDO mknod -m 666 "$root/dev/$1" c "$2" "$3" || unavailable "cannot make /dev/$1 in the root"
done
$SUDO mkdir -p -m 1777 "$root/dev/shm"
mnt "$root/src" --bind "$src"
$SUDO mount -o remount,bind,ro "$root/src" || unavailable "cannot make the source read-only in the root"

$SUDO chroot "$root" /bin/true || unavailable "cannot chroot into the root"

# Built in the root's /build (its own file system, outside the source); -Werror as everywhere.
# The tests run with clattn's binary cache off and PoCL's own on, as in scripts/test.sh (which says
# why); test_cache turns it on for itself.
$SUDO chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  CLATTN_REQUIRE_DEVICE="${CLATTN_REQUIRE_DEVICE:-1}" CLATTN_CACHE=0 TESTS="$tests" bash -euo pipefail -c '
  echo "test32: $(getconf LONG_BIT)-bit userland, $(gcc -dumpmachine)"
  cmake -S /src -B /build -DCMAKE_BUILD_TYPE=Release -DCLATTN_TEST_CACHE_DIR=/build/kernel-cache >/dev/null
  if ! cmake --build /build -j"$(nproc)" >/build/build.log 2>&1; then
    tail -n 40 /build/build.log
    echo "test32: the build failed"
    exit 1
  fi
  /build/tools/clattn-info | grep -E "Device|device version" | head -n 2
  cd /build && ctest --output-on-failure -j"$(nproc)" -R "$TESTS"'
echo "test32: passed"
