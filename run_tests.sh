#!/usr/bin/env bash
# The test command: sets up .venv from nothing if needed, then runs the whole suite on three workers
# (pytest-xdist: a test file stays on one worker; each worker's torch on one thread, conftest.py; three on
# two cores: much of the suite waits on kernels and subprocesses, and a third worker fills those waits).
# The files are handed out in conftest.py's order (--no-loadscope-reorder: not by their number of tests).
#   ./run_tests.sh [pytest args...]        (-n 0: one process, as before)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$root"
scripts/setup_env.sh smollm2-135m || { echo "run_tests.sh: set-up failed" >&2; exit 2; }
.venv/bin/python -m pytest tests -n 3 --dist loadfile --no-loadscope-reorder "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run_tests.sh: pytest collected no tests: that is a failure, not a pass" >&2
  exit 1
fi
exit "$rc"
