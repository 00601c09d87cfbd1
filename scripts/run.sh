#!/usr/bin/env bash
# The main job: set up, build, list the OpenCL devices, then run attention on the default device
# (the first GPU, else PoCL's CPU device), check it against a float64 reference and time it.
#   ./scripts/run.sh                # default device
#   CLATTN_DEVICE=cpu ./scripts/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
echo "== devices"
./build/tools/clattn-info
echo
echo "== attention on the default device (checked against the float64 reference, then timed)"
./build/tools/clattn-bench --check "$@"
# Debian's numpy lives with the system interpreter, which may not be the first python3 on PATH.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
if "$py" -c "import numpy" 2>/dev/null; then
  echo
  echo "== peer: numpy attention on the host CPU (B1 H8 S1024 d64 f32, the CPU default shape)"
  "$py" scripts/bench_numpy.py
fi
