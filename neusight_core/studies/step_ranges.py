"""Steps measured on two machines, scored so that a prediction inside the two measurements counts as exact.

This is how the modern-step targets are scored on their independent set of BF16 steps: each step was timed on two
machines with the same GPU, and a prediction that lies between the two times has no error; outside, the error is the
distance to the nearer of the two, relative to it. It is the fair test of a host-bound step, whose wall time differs
by 10-40 % between two machines of one GPU kind (``live_modern.recorded_agreement``): no predictor that does not
know the host's state can do better than land inside that range.

Our recorded runs (``live_modern.RECORDED``) hold such pairs: for each GPU kind and harness, two runs on two lent
machines (``PAIRS``). The same machine's repeat minutes later (``recorded H100 2026-11-28 (2)``) is left out: it
measures how far one machine repeats itself, not a second machine. A prediction does not depend on the run, so the
score needs no prediction of its own: it reads the per-run predictions notebook 05 and ``benchmarks/modern_steps.py``
already make (``live_modern.predict_steps``, one frame with a ``run`` column).
"""
from __future__ import annotations

import numpy as np

from neusight_core.studies.live_modern import STEP_KEY, step_mape

#: (GPU, harness) -> the two recorded runs, each on its own lent machine. "strided": the runs of 2026-11-26 and -27,
#: whose decode steps appended to the strided cache the harness's crop left; "contiguous": from 2026-11-28 on.
PAIRS = {
    ("H100", "strided"): ("recorded H100 2026-11-26", "recorded H100 2026-11-27"),
    ("H200", "strided"): ("recorded H200 2026-11-26", "recorded H200 2026-11-27"),
    ("H100", "contiguous"): ("recorded H100 2026-11-28", "recorded H100 2026-11-28 (3)"),
    ("H200", "contiguous"): ("recorded H200 2026-11-28", "recorded H200 2026-11-28 (2)"),
}


def range_error_pct(predicted, lo, hi) -> np.ndarray:
    """Signed error (%) of ``predicted`` against the range [lo, hi] of two measurements: 0 inside it, else
    relative to the nearer end (above: ``predicted / hi - 1``; below: ``predicted / lo - 1``)."""
    p, lo, hi = (np.asarray(x, dtype=float) for x in (predicted, lo, hi))
    return np.where(p > hi, p / hi - 1, np.where(p < lo, p / lo - 1, 0.0)) * 100


def range_frame(pred, pairs: dict | None = None):
    """``pred`` (``live_modern.predict_steps`` rows of several runs, column ``run``) scored against each pair's two
    measurements of a step: one row per step measured OK on both runs x variant x predictor x seed, with ``lo``,
    ``hi``, ``predicted_ms`` and ``error_pct`` (``range_error_pct``), and ``GPU`` and ``harness``. A step that one
    run of a pair did not measure is not scored; a pair with a run missing from ``pred`` gives no rows."""
    import pandas as pd
    key = STEP_KEY + ["variant", "predictor", "seed"]
    frames = []
    for (gpu, harness), (a, b) in (PAIRS if pairs is None else pairs).items():
        pa, pb = pred[pred["run"] == a], pred[pred["run"] == b]
        if pa.empty or pb.empty:
            continue
        m = pa[key + ["measured_ms", "predicted_ms"]].merge(pb[key + ["measured_ms"]], on=key, suffixes=("_a", "_b"))
        m = m.dropna(subset=["measured_ms_a", "measured_ms_b", "predicted_ms"])
        m["lo"] = np.minimum(m["measured_ms_a"], m["measured_ms_b"])
        m["hi"] = np.maximum(m["measured_ms_a"], m["measured_ms_b"])
        m["error_pct"] = range_error_pct(m["predicted_ms"], m["lo"], m["hi"])
        frames.append(m.assign(GPU=gpu, harness=harness, runs=f"{a} | {b}"))
    cols = ["GPU", "harness", "runs"] + key + ["lo", "hi", "predicted_ms", "error_pct"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def range_mape(pred, pairs: dict | None = None):
    """MAPE (%) against the two machines' range, per GPU x harness x predictor x variant, by phase and pooled:
    the mean over seeds with its min and max (``live_modern.step_mape``'s columns), and the steps scored."""
    import pandas as pd
    r = range_frame(pred, pairs)
    out = []
    for (gpu, harness), g in r.groupby(["GPU", "harness"], sort=False):
        m = step_mape(g).reset_index()
        steps = g.groupby(["predictor", "variant"])[STEP_KEY].apply(lambda s: len(s.drop_duplicates()))
        m["steps"] = [int(steps.loc[(p, v)]) for p, v in zip(m["predictor"], m["variant"])]
        out.append(m.assign(GPU=gpu, harness=harness))
    if not out:
        return pd.DataFrame()
    return pd.concat(out, ignore_index=True).set_index(["GPU", "harness", "predictor", "variant"])

