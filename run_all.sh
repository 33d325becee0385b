#!/usr/bin/env bash
# Runs the whole NeuSight artifact: set-up (.venv + the authors' release), then every notebook in
# notebooks/ with papermill into results/<timestamp>/, SUMMARY.md, environment capture, tarball.
#   ./run_all.sh            full run
#   ./run_all.sh --quick    small subsets, quick training
#   ./run_all.sh --only 05_live_gpu --out results/gpu-smoke
#   ./run_all.sh --help
set -euo pipefail
ROOT="$(cd "$(dirname "$0")" && pwd)"
for a in "$@"; do
  if [ "$a" = "--help" ] || [ "$a" = "-h" ]; then
    [ -x "$ROOT/.venv/bin/python" ] && exec "$ROOT/.venv/bin/python" -m neusight_core.runner --help
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0
  fi
done
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
# Each Jupyter kernel warns that it talks to papermill over local TCP; that line says nothing about
# the run, so it is dropped from the console (everything else on stderr passes through).
exec "$ROOT/.venv/bin/python" -m neusight_core.runner "$@" \
  2> >(grep --line-buffered -v "Kernel is running over TCP without encryption" >&2)
