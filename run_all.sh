#!/usr/bin/env bash
# Runs the whole NeuSight artifact: set-up (.venv + the authors' release), then every notebook in
# notebooks/ with papermill into results/<timestamp>/, SUMMARY.md, environment capture, tarball.
#   ./run_all.sh                    full run
#   ./run_all.sh --quick            small subsets, quick training
#   ./run_all.sh --only 05_live_gpu --out results/gpu-smoke
#   ./run_all.sh --lab [RESULTS]    open JupyterLab on the notebooks (and on a results folder)
#   ./run_all.sh --help
set -euo pipefail
ROOT="$(cd "$(dirname "$0")" && pwd)"
# Usage errors are caught before any set-up (one line, exit 2). The argument check needs only the
# standard library, so any python3 does it; --help is answered the same way.
SYSPY="$(command -v python3.11 || command -v python3 || true)"
if [ -n "$SYSPY" ]; then
  (cd "$ROOT" && PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$SYSPY" -m neusight_core.run.runner --check-args "$@") \
    || exit $?
  for a in "$@"; do
    if [ "$a" = "--help" ] || [ "$a" = "-h" ]; then exit 0; fi
  done
fi
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
# Each Jupyter kernel warns that it talks to papermill over local TCP, and an interrupted kernel
# says "KeyboardInterrupt caught in kernel"; neither says anything about the run, so both are
# dropped from the console (everything else on stderr passes through). The filter ignores
# SIGINT/SIGTERM so that the runner's own last lines still get through after Ctrl-C.
exec "$NEUSIGHT_PY" -m neusight_core.run.runner "$@" \
  2> >(trap '' INT TERM; grep --line-buffered -v -e "Kernel is running over TCP without encryption" \
                                              -e "KeyboardInterrupt caught in kernel" >&2)
