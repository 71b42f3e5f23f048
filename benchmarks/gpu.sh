#!/usr/bin/env bash
# The GPU check on a machine with no network: the wheels carried in .whl/ (benchmarks/requirements-gpu.txt)
# installed beside the image's packages, then benchmarks/gpu.py. Usage: benchmarks/gpu.sh OUT_DIR [gpu.py args]
set -euo pipefail
out=${1:?usage: benchmarks/gpu.sh OUT_DIR [gpu.py arguments]}; shift
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/specnb-site .whl/*.whl
  export PYTHONPATH=/tmp/specnb-site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec python3 benchmarks/gpu.py --out "$out" "$@"
