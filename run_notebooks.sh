#!/usr/bin/env bash
# The main job: every numbered notebook in notebooks/ through papermill, results in outputs/.
#   ./run_notebooks.sh [PROFILE] [-p NAME VALUE]... [-f FILE.yaml]... [--notebook NAME]...
# PROFILE: cpu (default), course (01-03), smoke, t4, t4-dryrun (notebooks/profiles/*.yaml). Sets up .venv from nothing if needed,
# installs the embedded models the profile uses, then runs. Exit status non-zero if a notebook failed.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$root"
profile=cpu
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then profile=$1; shift; fi
scripts/setup_env.sh || { echo "run_notebooks.sh: set-up failed" >&2; exit 2; }
py=$(scripts/setup_env.sh --python)
# the runner installs the embedded models the notebooks name, times one, prints its estimate, then runs
exec "$py" -m specnb.notebook.runner run "$profile" "$@"
