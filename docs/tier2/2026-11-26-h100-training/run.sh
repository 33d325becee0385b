#!/usr/bin/env bash
# One device session (issue 36): the two NeuSight recipes' full training, seeds 0-2, on the GPU, six processes, timed;
# Tier 1 of those weights on the machine's cores (benchmarks/tier1_seeds.py); then notebook 05's modern section.
set -u
T0=$(date +%s)
PY=${PY:-python3}
Q=${QUICK:+--quick}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/.device/aic TQDM_MININTERVAL=20
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.memory --format=csv; nproc; lscpu | grep -i "model name"; $PY -c 'import torch,transformers;print(torch.__version__,transformers.__version__, torch.cuda.is_available())'; git log -1 --format=%h; } > $OUT/machine.txt 2>&1
cat $OUT/machine.txt
$PY -m neusight_core.release --source .device/upstream 2>&1 | tail -2
$PY -c 'from neusight_core import measured_kernels as m; print("measured kernels:", m.unavailable() or m.data_root())'
( while true; do nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader >> $OUT/machine.txt 2>/dev/null; sleep 15; done ) &
SMI=$!
t1=$(date +%s)
OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 timeout ${TRAIN_S:-330} $PY -m neusight_core train --predictor ${RECIPES:-neusight-paper,neusight} --seed 0,1,2 $Q > $OUT/train_log.txt 2>&1
rc=$?
kill $SMI 2>/dev/null
echo "[train] exit $rc after $(( $(date +%s) - t1 )) s" | tee -a $OUT/train_log.txt
grep -v "%|" $OUT/train_log.txt | tail -20
t2=$(date +%s)
NEUSIGHT_TRACE_CACHE=${TC:-$PWD/artifacts/trace_cache} timeout ${TIER1_S:-150} $PY benchmarks/tier1_seeds.py --out $OUT/t1 --predictors ${RECIPES:-neusight-paper,neusight},roofline $Q 2>&1 | tail -25
echo "[tier1] exit ${PIPESTATUS[0]} after $(( $(date +%s) - t2 )) s"
left=$(( ${TOTAL:-540} - ($(date +%s) - T0) ))
echo "[modern] $left s left"
if [ $left -gt 90 ]; then
  timeout $(( left - 10 )) $PY -m neusight_core.live_modern --out /tmp/modern --budget-s $(( left - 40 )) > $OUT/modern_log.txt 2>&1
  cp /tmp/modern/modern_steps.csv $OUT/ 2>/dev/null
  tail -5 $OUT/modern_log.txt
fi
echo "[all] $(( $(date +%s) - T0 )) s"
