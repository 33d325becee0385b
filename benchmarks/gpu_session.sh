#!/usr/bin/env bash
# One device session in one call (the developers' guide; issues 33 and 36), written to $OUT for docs/tier2/:
#   1. the machine (GPU, driver, cores, torch / transformers);
#   2. both NeuSight recipes' full training, seeds 0-2, on the GPU (NEUSIGHT_TRAIN_DEVICE auto), timed, GPU use
#      sampled every 15 s;
#   3. Tier 1 of the weights it finished (benchmarks/tier1_seeds.py), on the machine's cores;
#   4. notebook 05's modern section (BF16, sdpa and eager, prefill / decode / training steps, host launch cost) with
#      what time is left.
# Run from the repository root on the device machine, e.g. `OUT=$OUT bash benchmarks/gpu_session.sh`; TOTAL (s) is
# the whole budget (default 540, under a 600 s call), TRAIN_S / TIER1_S cap steps 2 / 3, QUICK=1 the quick weights
# (a dry run: it also runs on a CPU machine, where steps 2-4 say what is missing).
set -u
T0=$(date +%s)
PY=${PY:-python3}
OUT=${OUT:?set OUT to the folder the results go to}
Q=${QUICK:+--quick}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=20
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.memory --format=csv; nproc
  lscpu | grep -i "model name"
  $PY -c 'import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.is_available())'
  git log -1 --format=%h; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
$PY -c 'from neusight_core import measured_kernels as m; print("measured kernels:", m.unavailable() or m.data_root())'
( while true; do nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader \
    >> "$OUT/machine.txt" 2>/dev/null; sleep 15; done ) &
SMI=$!
t1=$(date +%s)
OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 timeout "${TRAIN_S:-330}" $PY -m neusight_core train \
  --predictor "${RECIPES:-neusight-paper,neusight}" --seed 0,1,2 $Q > "$OUT/train_log.txt" 2>&1
rc=$?
kill $SMI 2>/dev/null
echo "[train] exit $rc after $(( $(date +%s) - t1 )) s" | tee -a "$OUT/train_log.txt"
grep -v "%|" "$OUT/train_log.txt" | tail -20
t2=$(date +%s)
timeout "${TIER1_S:-150}" $PY benchmarks/tier1_seeds.py --out "$OUT/t1" \
  --predictors "${RECIPES:-neusight-paper,neusight},roofline" $Q 2>&1 | tail -25
echo "[tier1] exit ${PIPESTATUS[0]} after $(( $(date +%s) - t2 )) s"
left=$(( ${TOTAL:-540} - ($(date +%s) - T0) ))
echo "[modern] $left s left"
if [ $left -gt 90 ]; then
  timeout $(( left - 10 )) $PY -m neusight_core.studies.live_modern --out "$OUT/modern" --budget-s $(( left - 40 )) \
    > "$OUT/modern_log.txt" 2>&1
  tail -5 "$OUT/modern_log.txt"
fi
echo "[all] $(( $(date +%s) - T0 )) s"
