#!/usr/bin/env bash
# Installs the system packages clattn needs to build, test and benchmark on Debian/Ubuntu, only
# those missing, with sudo when not root. Sourced by run.sh and test.sh.
set -euo pipefail
clattn_packages=(build-essential cmake pkg-config ocl-icd-opencl-dev opencl-headers clinfo
                 pocl-opencl-icd libcmocka-dev clang libclang-rt-14-dev valgrind
                 libclblast-dev python3-numpy libopenblas0-pthread python3-pip python3-venv clang-19 libclc-19
                 openmpi-bin libopenmpi-dev)
clattn_missing=()
for p in "${clattn_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || clattn_missing+=("$p")
done
if [ ${#clattn_missing[@]} -gt 0 ]; then
  echo "setup: installing ${clattn_missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  # clang with its libFuzzer runtime, and valgrind: test.sh's fuzzing and memcheck steps.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    build-essential cmake pkg-config ocl-icd-opencl-dev opencl-headers clinfo pocl-opencl-icd libcmocka-dev \
    clang libclang-rt-14-dev valgrind
  # CLBlast, numpy and OpenBLAS (numpy's BLAS: the reference BLAS is 20x slower) are only the
  # benchmark's peers, pip fetches Intel's CPU runtime (scripts/intel-cpu-check.sh), pip and venv
  # make test.sh's virtual environment for the Python package (Debian's pip refuses to install
  # into the system Python), clang-19
  # and libclc-19 serve the offline NVPTX and amdgcn checks of the matrix kernel
  # (tests/mma_check.sh; clang 15 crashed on RDNA3's WMMA builtins): not fatal if unavailable.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    libclblast-dev python3-numpy libopenblas0-pthread python3-pip python3-venv ||
    echo "setup: CLBlast/numpy/pip/venv not installed; the benchmark skips those peers, test.sh Intel's CPU runtime and the Python package"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang-19 libclc-19 ||
    echo "setup: clang-19/libclc-19 not installed; tests/mma_check.sh skips"
  # Open MPI: the ring attention example (examples/mpi, docs/ring.md) and its mpirun tests.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev ||
    echo "setup: openmpi-bin/libopenmpi-dev not installed; CMake skips the MPI example (ring_mpi) and its tests"
fi
