"""Notebook 05's tables and verdicts: recorded runs re-predicted, the scenario frames spread into columns, the
Markdown summary, the notebook's outcome (OK / SKIPPED / FAILED) and its Tier 2 verdicts.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core.studies.live import MODEL_SECTIONS, NOT_POSSIBLE
from neusight_core.question.schema import Attention, Execution, Precision

def recorded_predictions(folder, gpu: str, seeds=(0, 1, 2), predictor: str = "neusight",
                         quick: bool = False) -> pd.DataFrame:
    """A recorded run of this notebook (``docs/tier2/<run>``: ``live_paper.csv`` in its precision, FP32,
    ``live_llama.csv`` in BF16, ``live_vision.csv`` in FP32) predicted again here for ``gpu`` with every seed of
    ``predictor``: one row per measured scenario and seed with ``measured_ms``, ``recorded_pred_ms`` (what the run
    predicted, seed 0), ``pred_ms``, ``ape`` and ``err`` (signed, %). The run's notebook predicted with seed 0 only."""
    from pathlib import Path

    from neusight_core.cost import latency
    from neusight_core import predictors
    from neusight_core.cost.scenario import is_image
    from neusight_core.studies import error_metric
    rows = []
    preds = {s: predictors.get(predictor, quick=quick, seed=s) for s in seeds}
    for table, default_dtype in (("live_paper", Precision.FP32), ("live_llama", Precision.BF16), ("live_vision", Precision.FP32)):
        f = Path(folder) / f"{table}.csv"
        if not f.is_file():
            continue
        d = pd.read_csv(f).dropna(subset=["measured_ms"])
        for r in d.to_dict(orient="records"):
            dtype = str(r.get("precision") or default_dtype)
            past = int(r["past"]) if pd.notna(r.get("past")) and r.get("past") else 0
            size = ({"image_size": int(r["image_size"])} if pd.notna(r.get("image_size"))
                    # runs recorded before LiveCase had an image_size held an image model's side in seq
                    else {"image_size": int(r["seq"])} if is_image(str(r["model"])) else {"seq": int(r["seq"])})
            for s, p in preds.items():
                out = latency.predict_model(str(r["model"]), gpu, int(r["batch"]), mode=str(r["mode"]), **size,
                                            predictor=p, dtype=dtype, **({"past": past} if past else {}),
                                            attention=Attention.EAGER, execution=Execution.GRAPH)
                rows.append({"table": table, "name": r["name"], "precision": dtype, "seed": s,
                             "measured_ms": float(r["measured_ms"]),
                             "recorded_pred_ms": float(r.get("predicted_e2e_ms", np.nan)), "pred_ms": out["e2e_ms"]})
    out = pd.DataFrame(rows)
    if len(out):
        out["ape"] = error_metric.ape(out["measured_ms"], out["pred_ms"])
        out["err"] = (out["pred_ms"] / out["measured_ms"] - 1) * 100
    return out


def flat_table(df: pd.DataFrame) -> pd.DataFrame:
    """A scenario frame of run_live with its dict columns spread out: ``predicted`` -> ``predicted_e2e_ms``,
    ``predicted_fw_ms``, ...; ``pred_eager``/``pred_fused`` likewise (so the tables show the numbers)."""
    out = df.copy()
    for col in [c for c in df.columns if df[c].map(lambda v: isinstance(v, dict)).any()]:
        spread = pd.DataFrame([v if isinstance(v, dict) else {} for v in df[col]], index=df.index)
        spread.columns = [f"{col}_{k}" for k in spread.columns]
        out = pd.concat([out.drop(columns=[col]), spread], axis=1)
    return out


RECORDED_RUNS = "docs/tier2.md (H100 and H200, 2026-11-26 to 2026-11-28)"


def summary_markdown(r: dict, quick: bool = False) -> str:
    """The notebook's summary.md: status line and one row per model/parallel scenario with the prediction,
    the measurement (or why there is none) and the authors' label for the same GPU where the release has one."""
    head = r["head"]
    status, reason = outcome(r)
    lines = [f"**05_live_gpu {status}** — " + (f"{reason}. " if status == "FAILED" else "")
             + (f"{r['skip']}. Predictions only, for {head['predicted_for']}." if r["skip"]
                else f"measured on {head['device']['display_name']} ({head['precision_label']}).")
             + (" QUICK mode: subset of scenarios, predictors trained on a data subset." if quick else "")
             # no number from another machine here: only where recorded runs are, so that nobody takes them for this one's
             + (f" Runs of this notebook recorded on other machines (not this run): {RECORDED_RUNS}." if r["skip"] else ""),
             "", "| scenario | GPU | predicted e2e (ms) | measured (ms) | authors' label (ms) |", "|---|---|---:|---:|---:|"]
    for sec in MODEL_SECTIONS:
        for s in r.get(sec, pd.DataFrame()).to_dict(orient="records"):
            p = (s.get("predicted") or {}).get("e2e_ms")
            gpu = s.get("gpu") or head["predicted_for"]
            meas = f"{s['measured_ms']:.1f}" if pd.notna(s.get("measured_ms")) else "SKIPPED"
            lab = f"{s['author_label_ms']:.1f}" if pd.notna(s.get("author_label_ms")) and s.get("author_label_ms") else "—"
            ext = " (extension)" if s.get("extension") else ""
            lines.append(f"| {s['name']}{ext} | {gpu} | {'—' if p is None else f'{p:.1f}'} | {meas} | {lab} |")
    return "\n".join(lines)


def outcome(r: dict) -> tuple[str, str]:
    """(status, reason) of notebook 05 for metrics.json: FAILED when any prediction failed (a broken
    device file, a missing predictor ...: never reported as SKIPPED), else SKIPPED when nothing could
    be measured, else OK. A configuration rejected as impossible on its GPU is an answer, not a failure."""
    failed, total = [], 0
    k = r.get("kernels", pd.DataFrame())
    if len(k):
        total += 1
        if k["pred_ms"].isna().all() if "pred_ms" in k else True:
            failed.append(("kernel sweep", str(k["pred_reason"].iloc[0]) if "pred_reason" in k else "no prediction"))
    for sec in MODEL_SECTIONS + ("fusion",):
        for row in r.get(sec, pd.DataFrame()).to_dict(orient="records"):
            preds = [row.get("predicted")] if sec != "fusion" else [row.get("pred_eager"), row.get("pred_fused")]
            total += 1
            why = str(row.get("predicted_reason") or "")
            if any(p is None or (isinstance(p, float) and np.isnan(p)) for p in preds) and not why.startswith(NOT_POSSIBLE):
                failed.append((row.get("name", sec), why or "no prediction"))
    if failed:
        name, why = failed[0]
        return "FAILED", f"{len(failed)} of {total} predictions failed (first: {name}: {why})"
    if r["skip"]:
        return "SKIPPED", r["skip"]
    return "OK", ""


def tier2_verdicts(r: dict, status: str, reason: str, quick: bool = False) -> dict:
    """The ``verdicts`` key of notebook 05's metrics.json (Tier 2, contract in docs/interfaces.md)."""
    from neusight_core.studies import error_metric
    rows = [x for sec in MODEL_SECTIONS for x in r.get(sec, pd.DataFrame()).to_dict(orient="records")]
    measured = [x for x in rows if x.get("measured_ms") is not None and pd.notna(x.get("measured_ms"))]
    predicted = [x for x in rows if x.get("predicted")]
    if status == "FAILED":
        text = reason
    elif not measured:
        text = (f"SKIPPED: {r['skip'] or 'nothing measured'}; predictions only, for {r['head']['predicted_for']} "
                f"({len(predicted)} of {len(rows)} scenarios predicted)")
    else:
        # the paper's scenarios apart from the extensions (Llama-2, vision, ...): one MAPE would mix what the
        # paper validated with what it never measured
        def mape(xs):
            a = [error_metric.ape(x["measured_ms"], x["predicted"]["e2e_ms"]) for x in xs if x.get("predicted")]
            return (f"{np.mean(a):.1f} % over {len(a)}" if a else "none"), len(a)
        core = mape([x for x in measured if not x.get("extension")])[0]
        ext, n_ext = mape([x for x in measured if x.get("extension")])
        # rows come back from frames: a missing label is NaN there, not None
        with_label = [x for x in measured if pd.notna(x.get("label_gap_pct"))]
        flags = [x for x in with_label if x.get("flag_stack_differs") is True]
        errors = [x for x in rows if str(x.get("skipped_reason") or "").startswith("ERROR")]
        text = (f"measured {len(measured)} scenarios on {r['head']['device'].get('display_name', '?')}; our prediction vs "
                f"our measurement MAPE {core}" + (f" (extensions, extrapolated: {ext})" if n_ext else "")
                + "; our measurement vs the authors' label: "
                f"{len(flags)} of {len(with_label)} more than 15 % apart"
                + (f"; {len(errors)} measurement(s) failed (ERROR, reason in the tables)" if errors else ""))
    return {"tier": 2, "label": "live GPU", "quick": bool(quick), "summary": text}
