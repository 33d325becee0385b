#!/usr/bin/env bash
# One device session in one call (the developers' guide; issues 33 and 36), packed into $OUT/session.tgz for docs/tier2/:
#   1. the machine (GPU, driver, cores, torch / transformers);
#   2. notebook 05's modern section (BF16, sdpa and eager, prefill / decode / training steps, host launch cost),
#      MODERN_S seconds, alone on the machine so that the host-bound steps are timed on a quiet CPU; then
#      benchmarks/grouped_gemm.py (mixture-of-experts kernels, then the whole Hugging Face MoE block), GROUPED_S
#      seconds (default 120, 0 to skip);
#   3. both NeuSight recipes' full training, seeds 0-2, on the machine's CPU cores with every MLP member in one
#      pool of processes (train --workers, predictors/members.py), timed; beside it, when there is a GPU, one
#      seed of `neusight` trained on the GPU alone into another folder, timed, for the comparison;
#   4. a digest of every weights folder (benchmarks/weights_digest.py: where, how long, validation MAPE per class,
#      sha256 of the arrays) to compare with the same seeds trained elsewhere, bit for bit;
#   5. Tier 1 of the CPU-trained weights (benchmarks/tier1_seeds.py) if TIER1_S > 0 and time is left.
# Run from the repository root on the device machine, e.g. `OUT=$OUT bash benchmarks/gpu_session.sh`. Data: the
# authors' release from .device/upstream and the measured kernels from .device/aic when they are there (copies
# carried along: `bash benchmarks/device_carry.sh` builds them), else what is installed.
# TOTAL (s) is the whole budget (default 560, under a 600 s call); MODERN_S / TRAIN_S / TIER1_S cap steps 2 / 3 / 5
# (defaults 230 / 200 / 0: the section measures all 32 steps and the memory kernels in about 170 s on an H100 or
# H200, and the full training does not fit one call anyway: docs/tier2/2026-11-27-h200-training/README.md);
# WORKERS the CPU training's processes (default: cores - 1, one core left to the GPU seed); QUICK=1 the quick
# weights (a dry run: it also runs on a CPU machine, where the GPU steps say what is missing).
# Everything is written to a work folder and packed into $OUT/session.tgz after each step: the device brings back
# 8 files at most, and a call stopped at its limit still returns the steps it finished (2026-11-27 lost two CSVs).
set -u
T0=$(date +%s)
PY=${PY:-python3}
FINAL=${OUT:?set OUT to the folder the results go to}
OUT=$(mktemp -d)
pack() { tar czf "$FINAL/.session.tgz" -C "$OUT" . && mv "$FINAL/.session.tgz" "$FINAL/session.tgz"; }
trap 'pack; rm -rf "$OUT"' EXIT
Q=${QUICK:+--quick}
mkdir -p "$FINAL"
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=20
[ -d .device/aic ] && export PYTHONPATH=$PWD:$PWD/.device/aic
[ -d .device/upstream ] && $PY -m neusight_core.data.release --source .device/upstream 2>&1 | tail -1
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.memory --format=csv; nproc
  lscpu | grep -i "model name"
  $PY -c 'import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.is_available())'
  git log -1 --format=%h; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
$PY -c 'from neusight_core.data import measured_kernels as m; print("measured kernels:", m.unavailable() or m.data_root())'
HAS_GPU=$($PY -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)

# 2. the modern section, alone
ms=${MODERN_S:-230}
if [ "$HAS_GPU" = 1 ] && [ "$ms" -gt 30 ]; then
  timeout $(( ms + 20 )) $PY -m neusight_core.studies.live_modern --out "$OUT/modern" --budget-s "$ms" \
    > "$OUT/modern_log.txt" 2>&1
  echo "[modern] exit $? after $(( $(date +%s) - T0 )) s"; tail -3 "$OUT/modern_log.txt"
else
  echo "[modern] SKIPPED: no CUDA GPU (or MODERN_S=$ms)"
fi
pack

# 2b. torch._grouped_mm, the kernel of a mixture-of-experts layer's experts, against our prediction (about a minute)
if [ "$HAS_GPU" = 1 ] && [ "${GROUPED_S:-120}" -gt 0 ]; then
  timeout "${GROUPED_S:-120}" $PY benchmarks/grouped_gemm.py --out "$OUT/grouped_gemm" > "$OUT/grouped_gemm_log.txt" 2>&1
  echo "[grouped gemm] exit $? after $(( $(date +%s) - T0 )) s"; head -1 "$OUT/grouped_gemm_log.txt"
fi
pack

# 3. training: every member of both recipes on the CPU cores; one seed on the GPU beside it
( while true; do nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader \
    >> "$OUT/machine.txt" 2>/dev/null; sleep 15; done ) < /dev/null > /dev/null 2>&1 &   # holds none of the caller's pipes
SMI=$!
ts=${TRAIN_S:-200}
workers=${WORKERS:-$(( $(nproc) - HAS_GPU * ${GPU_SEED:-1} ))}
t1=$(date +%s)
if [ "$HAS_GPU" = 1 ] && [ "${GPU_SEED:-1}" = 1 ]; then
  NEUSIGHT_TRAIN_DEVICE=cuda NEUSIGHT_TRAINED=/tmp/gpu_trained OMP_NUM_THREADS=1 timeout "$ts" \
    $PY -m neusight_core train --predictor neusight --seed 0 --workers 1 $Q > "$OUT/train_gpu_log.txt" 2>&1 &
  GPU_TRAIN=$!
fi
NEUSIGHT_TRAIN_DEVICE=cpu OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 timeout "$ts" $PY -m neusight_core train \
  --predictor "${RECIPES:-neusight-paper,neusight}" --seed 0,1,2 --workers "$workers" $Q > "$OUT/train_log.txt" 2>&1
echo "[train cpu, $workers workers] exit $? after $(( $(date +%s) - t1 )) s" | tee -a "$OUT/train_log.txt"
if [ "$HAS_GPU" = 1 ] && [ "${GPU_SEED:-1}" = 1 ]; then
  wait $GPU_TRAIN
  echo "[train gpu, neusight seed 0] exit $? after $(( $(date +%s) - t1 )) s" | tee -a "$OUT/train_gpu_log.txt"
fi
kill -9 $SMI 2>/dev/null   # KILL: a TERM that the caller ignores passes to the loop (runner.main did)
grep -v "%|" "$OUT/train_log.txt" | tail -12
tr '\r' '\n' < "$OUT/train_gpu_log.txt" 2>/dev/null | grep -v "^$" | tail -3
pack

# 4. digests
$PY benchmarks/weights_digest.py --predictors "${RECIPES:-neusight-paper,neusight}" $Q > "$OUT/weights_cpu.csv"
NEUSIGHT_TRAINED=/tmp/gpu_trained $PY benchmarks/weights_digest.py --predictors neusight --seeds 0 $Q \
  > "$OUT/weights_gpu.csv" 2>/dev/null
cat "$OUT/weights_cpu.csv" "$OUT/weights_gpu.csv"
pack

# 5. Tier 1 of the CPU-trained weights, if asked and time is left
left=$(( ${TOTAL:-560} - ($(date +%s) - T0) ))
if [ "${TIER1_S:-0}" -gt 0 ] && [ $left -gt 60 ]; then
  t2=$(date +%s)
  timeout $(( left < TIER1_S ? left - 10 : TIER1_S )) $PY benchmarks/tier1_seeds.py --out "$OUT/t1" \
    --predictors "${RECIPES:-neusight-paper,neusight},roofline" $Q 2>&1 | tail -15
  echo "[tier1] exit ${PIPESTATUS[0]} after $(( $(date +%s) - t2 )) s"
fi
echo "[all] $(( $(date +%s) - T0 )) s"
