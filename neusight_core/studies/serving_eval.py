"""The serving model against NVIDIA's measured serving runs (``data/serving_runs.py``): its constants fitted on the
development rows only, its errors per engine, TP and precision beside the plain decode step's.

    python -m neusight_core.studies.serving_eval [--fit] [--quick] [--seed S]

``--fit`` fits each engine's five constants (``cost/serving.py``) on that engine's development rows and writes them,
with the rows and weights they came from and the spread its answers' intervals are drawn with, to
``cost/serving_constants.yaml``; without it the saved constants are scored. TPOT's three constants and TTFT's two are
each a least-squares fit of the log ratio (predicted / measured), bounded at zero; rows whose steps cannot be answered
(a precision not modelled, a model that does not fit) are left out and counted.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from neusight_core.cost import serving
from neusight_core.cost.serving import EngineConstants
from neusight_core.data import serving_runs
from neusight_core.question.serving import SERVE_INPUTS
from neusight_core.studies import error_metric

QUESTION = SERVE_INPUTS        # a measured run's question: its columns of these names (coverage: the default)
BOUNDS = ["ttft_lo_ms", "ttft_hi_ms", "tpot_lo_ms", "tpot_hi_ms"]
#: a group the spread and the floor leave out whole: one model's runs on one GPU at one TP with one engine
TP = "tp"       # the serve question's field: GPUs of one serving instance (not a parallel plan)
GROUP = ["model", "device", TP, "engine"]
#: a new configuration: every run of one model on one GPU with one engine
NEW_CONFIG = ["model", "device", "engine"]


def steps(rows: pd.DataFrame, predictor="neusight", quick: bool | None = None, seed: int = 0,
          progress: bool = False) -> pd.DataFrame:
    """``rows`` (``serving_runs``' columns) with each run's two step times (``t_dec``, ``t_pre``) and ``error``."""
    cols = [c for c in QUESTION if c in rows.columns]
    qs = [dict(zip(cols, r)) for r in rows[cols].itertuples(index=False)]
    _, st = serving.step_times(qs, predictor, quick, seed, progress=progress)
    return pd.concat([rows.reset_index(drop=True), st[serving.SERVING_STEP_COLUMNS + ["error"]]], axis=1)


def _log_fit(design, measured, start) -> np.ndarray:
    """Non-negative coefficients of a sum of terms, least squares on log(predicted / measured)."""
    from scipy.optimize import least_squares
    design = np.asarray(design, float)
    r = least_squares(lambda p: np.log(np.maximum(design @ p, 1e-12) / measured), start, bounds=(0, np.inf))
    return r.x


def fit_engine(g: pd.DataFrame, source: str = "") -> EngineConstants:
    """One engine's constants fitted on its rows ``g`` (answered rows of ``steps``' output); the spread is left at 0
    (``fit`` measures it)."""
    C, osl = g["concurrency"].to_numpy(float), g["osl"].to_numpy(float)
    comm = g["comm_dec"].fillna(0).to_numpy(float)
    design = np.c_[g["t_dec"] - comm, comm, C * g["t_pre"] / (osl - 1)]
    if not comm.any():      # no tensor parallelism among the rows: the all-reduce's scale stays NCCL's
        design[:, 1] = 0
    tpot = _log_fit(design, g["tpot_ms"].to_numpy(float), [1.0, 1.0, 1.0])
    ttft = _log_fit(np.c_[g["t_pre"], g["t_pre"] * (C - 1)], g["ttft_ms"].to_numpy(float), [1.0, 0.1])
    return EngineConstants(step_scale=round(float(tpot[0]), 4), prefill_share=round(float(tpot[2]), 4),
                           comm_scale=round(float(tpot[1]), 4) if comm.any() else 1.0,
                           ttft_base=round(float(ttft[0]), 4), ttft_per_request=round(float(ttft[1]), 4),
                           covers=tuple(sorted({f"{m} / {d} / {dt}" for m, d, dt in
                                                zip(g["model"], g["device"], g["dtype"].astype(str))})),
                           rows=len(g), source=f"{source}; {len(g)} development rows: " + ", ".join(
                               f"{m} {d} {dt} ({n})" for (m, d, dt), n in
                               g.groupby(["model", "device", "dtype"]).size().items()))


def _rms_log(s: pd.DataFrame, measured: str, pred: str) -> float:
    return round(float(np.sqrt(np.mean(np.log(s[pred] / s[measured]) ** 2))), 4)


def fit(frame: pd.DataFrame, source: str = "") -> dict:
    """{engine: EngineConstants} fitted on the answered rows of each engine in ``frame`` (``steps``' output).

    The spread an answer's interval is drawn with (``tpot_sigma``, ``ttft_sigma``: root mean square of the log
    residuals) is measured the way a user's question is held out: each group of the engine's rows (``GROUP``: one
    model on one GPU at one TP) predicted by the constants fitted on its other groups. An engine whose rows are one
    group has only its in-sample spread. The spread of an answer outside the rows (``*_sigma_outside``: another
    model, GPU or precision) is measured with every run of a model on a GPU held out (``NEW_CONFIG``); an engine
    whose rows are one model on one GPU takes the other engines' rows' spread, pooled, and its ``source`` says so."""
    out, outside = {}, []
    ok = frame[frame["error"].eq("") & frame["t_dec"].gt(0) & frame["t_pre"].gt(0)]
    for engine, g in ok.groupby("engine"):
        c = fit_engine(g, source)
        s = (model_held_out(g, group_labels(g, GROUP)) if g[GROUP].drop_duplicates().shape[0] > 1
             else scored(g, {engine: c}))
        c = dataclasses.replace(c, tpot_sigma=_rms_log(s, "tpot_ms", "pred_tpot_ms"),
                                ttft_sigma=_rms_log(s, "ttft_ms", "pred_ttft_ms"))
        # an answer outside the rows (another model or GPU): every run of a model on a GPU held out
        if g[NEW_CONFIG].drop_duplicates().shape[0] > 1:
            s = model_held_out(g, group_labels(g, NEW_CONFIG))
            outside.append(s)
            c = dataclasses.replace(c, tpot_sigma_outside=_rms_log(s, "tpot_ms", "pred_tpot_ms"),
                                    ttft_sigma_outside=_rms_log(s, "ttft_ms", "pred_ttft_ms"))
        out[engine] = c
    # an engine whose rows are one model on one GPU cannot measure it: the other engines' rows, pooled
    pooled = pd.concat(outside) if outside else None
    for engine, c in out.items():
        if c.tpot_sigma_outside == 0 and pooled is not None:
            out[engine] = dataclasses.replace(c, tpot_sigma_outside=_rms_log(pooled, "tpot_ms", "pred_tpot_ms"),
                                              ttft_sigma_outside=_rms_log(pooled, "ttft_ms", "pred_ttft_ms"),
                                              source=c.source + "; spread outside its rows: the other engines'")
    return out


def group_labels(rows: pd.DataFrame, by: list) -> np.ndarray:
    """One label per row: its values of the columns ``by`` (the group a held-out check leaves out whole)."""
    return rows[by].astype(str).agg(" / ".join, axis=1).to_numpy()


def save(consts: dict, path: Path = serving.CONSTANTS_FILE) -> None:
    """Write the fitted constants (their provenance included) to ``path``, replacing it whole."""
    body = {"engines": {str(e): {k: list(v) if isinstance(v, tuple) else v for k, v in vars(c).items()}
                        for e, c in sorted(consts.items())}}
    head = ("# The serving model's constants per engine (cost/serving.py), fitted on that engine's development rows only\n"
            "# by `python -m neusight_core.studies.serving_eval --fit` (data/serving_runs.py: the Llama-3.1 family's\n"
            "# aggregated runs in NVIDIA's silicon_sample.csv). Written by that command; not edited by hand.\n")
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(head + yaml.safe_dump(body, sort_keys=False, width=200))
    tmp.replace(path)
    serving.saved_constants.cache_clear()


def scored(frame: pd.DataFrame, consts: dict | None = None) -> pd.DataFrame:
    """The answered rows of ``frame`` with the model's TTFT and TPOT (``pred_ttft_ms``, ``pred_tpot_ms``), their
    errors (%, signed) and the plain decode step's error against TPOT (``step_err``)."""
    ok = frame[frame["error"].eq("")].copy()
    pt, pp, bounds = [], [], []
    for r in ok.itertuples(index=False):
        c = consts[r.engine] if consts and r.engine in consts else serving.constants(r.engine)[0]
        q = serving.ServeQuestion(**{k: getattr(r, k) for k in QUESTION if hasattr(r, k)})
        a = serving.answer(q, r.t_dec, r.t_pre, c, 0.0 if np.isnan(r.comm_dec) else r.comm_dec)
        pt.append(a["ttft_ms"])
        pp.append(a["tpot_ms"])
        bounds.append([a[k] for k in BOUNDS])
    ok["pred_ttft_ms"], ok["pred_tpot_ms"] = pt, pp
    ok[BOUNDS] = np.asarray(bounds, float).reshape(len(ok), len(BOUNDS))
    ok["ttft_err"] = 100 * (ok["pred_ttft_ms"] / ok["ttft_ms"] - 1)
    ok["tpot_err"] = 100 * (ok["pred_tpot_ms"] / ok["tpot_ms"] - 1)
    ok["step_err"] = 100 * (ok["t_dec"] / ok["tpot_ms"] - 1)
    return ok


def _inside(s: pd.DataFrame) -> pd.DataFrame:
    """``s`` (scored rows) with ``tpot_in`` / ``ttft_in``: the measured time lies in the answer's interval, bounds
    included."""
    return s.assign(tpot_in=(s.tpot_ms >= s.tpot_lo_ms) & (s.tpot_ms <= s.tpot_hi_ms),
                    ttft_in=(s.ttft_ms >= s.ttft_lo_ms) & (s.ttft_ms <= s.ttft_hi_ms))


def coverage_table(frame: pd.DataFrame, consts: dict | None = None, levels=(0.5, 0.8, 0.95)) -> pd.DataFrame:
    """Per engine and overall: the share of rows whose measured TTFT / TPOT lies in the answer's interval at each
    coverage in ``levels`` (%), and the median relative half-width at 80 %."""
    parts = []
    for p in levels:
        s = scored(frame.assign(coverage=p), consts)
        parts.append(_inside(s).assign(level=p, tpot_hw=(s.tpot_hi_ms - s.tpot_lo_ms) / 2 / s.pred_tpot_ms,
                                       ttft_hw=(s.ttft_hi_ms - s.ttft_lo_ms) / 2 / s.pred_ttft_ms))
    a = pd.concat(parts, ignore_index=True)
    rows = []
    for eng, g in list(a.groupby("engine")) + [("all", a)]:
        r = {"engine": eng, "rows": int((g.level == levels[0]).sum())}
        for p in levels:
            h = g[g.level == p]
            r[f"TPOT covered at {p:.0%}"] = 100 * h.tpot_in.mean()
            r[f"TTFT covered at {p:.0%}"] = 100 * h.ttft_in.mean()
        h = g[g.level == 0.8]
        r["TPOT half-width at 80 % (%)"] = 100 * h.tpot_hw.median()
        r["TTFT half-width at 80 % (%)"] = 100 * h.ttft_hw.median()
        rows.append(r)
    return pd.DataFrame(rows)


def interval_hits(s: pd.DataFrame) -> pd.DataFrame:
    """Per engine and overall: the share (%) of scored rows ``s`` whose measured TTFT / TPOT lies inside the answer's
    interval (at the coverage the rows were asked at)."""
    hit = _inside(s)
    rows = [{"engine": eng, "rows": len(g), "TPOT inside (%)": 100 * g.tpot_in.mean(),
             "TTFT inside (%)": 100 * g.ttft_in.mean()} for eng, g in list(hit.groupby("engine")) + [("all", hit)]]
    return pd.DataFrame(rows)


def error_table(s: pd.DataFrame, by=("engine",)) -> pd.DataFrame:
    """MAPE of TTFT and TPOT, and of the plain decode step against TPOT, per group of ``by`` and overall (rows beside
    each number)."""
    def agg(g):
        return pd.Series({"rows": len(g),
                          "TPOT MAPE (%)": error_metric.ape(g["tpot_ms"], g["pred_tpot_ms"]).mean(),
                          "TPOT bias (%)": g["tpot_err"].median(),
                          "TTFT MAPE (%)": error_metric.ape(g["ttft_ms"], g["pred_ttft_ms"]).mean(),
                          "TTFT bias (%)": g["ttft_err"].median(),
                          "plain decode step vs TPOT, MAPE (%)": error_metric.ape(g["tpot_ms"], g["t_dec"]).mean()})
    by = list(by)
    parts = [s.groupby(by, sort=True).apply(agg, include_groups=False).reset_index()] if by else []
    parts.append(pd.DataFrame([agg(s)]).assign(**{b: "all" for b in by}))
    out = pd.concat(parts, ignore_index=True)
    out["rows"] = out["rows"].astype(int)
    return out[by + [c for c in out.columns if c not in by]]


#: what the floor is measured for: (the measured column, the model's column, the step it is read against)
FLOOR_TARGETS = {"TPOT": ("tpot_ms", "pred_tpot_ms", "t_dec"), "TTFT": ("ttft_ms", "pred_ttft_ms", "t_pre")}


#: how the floor holds rows out (``floor_table``): None = random rows in 10 folds, else whole groups of these columns
SPLITS = {"random rows (10 folds)": None,
          "each TP of a model on a GPU with an engine": GROUP,
          "each model on a GPU with an engine": NEW_CONFIG}


def folds_of(ok: pd.DataFrame, split: str, seed: int = 0) -> np.ndarray:
    """One fold label per row of ``ok`` for the split named ``split`` (a key of ``SPLITS``)."""
    by = SPLITS[split]
    return np.random.default_rng(seed).integers(0, 10, len(ok)) if by is None else group_labels(ok, by)


def model_held_out(ok: pd.DataFrame, folds: np.ndarray) -> pd.DataFrame:
    """The answered rows ``ok`` each scored with constants fitted on the other folds' rows of its engine (a fold
    whose engine has no rows elsewhere is left out): the serving model on configurations its constants never saw."""
    ok = ok.reset_index(drop=True)
    parts = []
    for f in np.unique(folds):
        test, train = ok[folds == f], ok[folds != f]
        for engine, t in test.groupby("engine"):
            if train["engine"].eq(engine).any():
                parts.append(scored(t, {engine: fit_engine(train[train["engine"] == engine])}))
    return pd.concat(parts) if parts else scored(ok.iloc[:0])


def _learner_inputs(ok: pd.DataFrame) -> np.ndarray:
    """The flexible learner's inputs: every input of a question, its two predicted steps and the identity of its
    model, GPU, engine and precision (codes; trees split on them)."""
    logs = [np.log(ok[c].astype(float)) for c in ("concurrency", "isl", "osl", TP, "t_dec", "t_pre")]
    codes = [pd.factorize(ok[c].astype(str))[0] for c in ("model", "device", "engine", "dtype")]
    return np.column_stack(logs + codes)


def learner_held_out(ok: pd.DataFrame, what: str, folds: np.ndarray, seed: int = 0) -> np.ndarray:
    """``what`` (a key of ``FLOOR_TARGETS``) of each answered row ``ok`` predicted by a gradient-boosted tree ensemble
    trained on the other folds. It reads the log ratio of the measured time to its step; its settings are
    scikit-learn's usual ones, not tuned here."""
    from sklearn.ensemble import GradientBoostingRegressor
    measured, _, step = FLOOR_TARGETS[what]
    ok = ok.reset_index(drop=True)
    x, y = _learner_inputs(ok), np.log(ok[measured].to_numpy(float) / ok[step].to_numpy(float))
    out = np.full(len(ok), np.nan)
    for f in np.unique(folds):
        test = folds == f
        if test.all():
            continue
        m = GradientBoostingRegressor(n_estimators=200, max_depth=3, learning_rate=0.05, subsample=0.8,
                                      random_state=seed).fit(x[~test], y[~test])
        out[test] = np.exp(m.predict(x[test])) * ok.loc[test, step].to_numpy(float)
    return out


def floor_table(frame: pd.DataFrame, seeds=(0, 1, 2)) -> pd.DataFrame:
    """How far these rows allow TPOT and TTFT to be predicted (MAPE, %), each row predicted without having been
    seen, per split of ``SPLITS`` (and in sample): the serving model, its constants refitted without the row's fold,
    beside a flexible learner given more than the model has (every input, both steps and the rows' model / GPU /
    engine identity). Over ``seeds`` (the random folds, the learner's draws): the mean, and the spread max - min.
    What the learner cannot reach, a model of few constants cannot either, where the learner beats the model; where
    the model beats the learner, the model's form carries what identities cannot."""
    ok = frame[frame["error"].eq("")].reset_index(drop=True)
    inside = scored(ok, fit(ok))
    rows = []
    for what, (measured, pred, _) in FLOOR_TARGETS.items():
        truth = ok[measured].to_numpy(float)
        rows.append({"target": what, "held out": "nothing (in sample)", "rows": len(ok),
                     "serving model": error_metric.mape(inside[measured], inside[pred])})
        for split in SPLITS:
            model, learner, n = [], [], 0
            model_seeds = seeds if SPLITS[split] is None else seeds[:1]     # whole groups: the same folds every seed
            for seed in model_seeds:
                folds = folds_of(ok, split, seed)
                held = model_held_out(ok, folds)
                model.append(error_metric.mape(held[measured], held[pred]))
                n = len(held)
            keep = held.index.to_numpy()          # the rows the model answers: both scored on the same rows
            for seed in seeds:
                guess = learner_held_out(ok, what, folds_of(ok, split, seed), seed)
                learner.append(error_metric.mape(truth[keep], guess[keep]))
            rows.append({"target": what, "held out": split, "rows": n, "serving model": float(np.mean(model)),
                         "serving model: spread over seeds": float(np.ptp(model)),
                         "learner": float(np.mean(learner)), "learner: spread over seeds": float(np.ptp(learner))})
    return pd.DataFrame(rows)


def held_out_check(predictor="neusight", quick: bool | None = None, seed: int = 0,
                   sample: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The independent check: the held-out rows (never fitted on) answered with the saved constants; ``sample``: that
    many of the answerable rows, drawn at random (seed 0), for a quick look. Returns (the scored rows, a count of
    every held-out row by model: answered, or why not)."""
    rows = serving_runs.held_out()
    known = rows["model"].isin(list(serving_runs.HELD_OUT_MODELS.values()))
    if sample is not None and known.sum() > sample:
        keep = rows[known].sample(sample, random_state=0).index
        rows = rows[~known | rows.index.isin(keep)]
        known = rows["model"].isin(list(serving_runs.HELD_OUT_MODELS.values()))
    frame = steps(rows[known], predictor, quick, seed) if known.any() else rows.iloc[:0].assign(error="")
    counts = rows.assign(answered=False, why="no config here (mixture-of-experts or latent attention)")
    done = frame.set_index("id")["error"]
    hit = counts["id"].isin(done.index)
    counts.loc[hit, "answered"] = done.reindex(counts.loc[hit, "id"]).eq("").to_numpy()
    counts.loc[hit, "why"] = done.reindex(counts.loc[hit, "id"]).to_numpy()
    table = counts.groupby(["model", "answered", "why"]).size().rename("rows").reset_index()
    return scored(frame), table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="fit the constants on the development rows and save them")
    ap.add_argument("--quick", action="store_true", help="quick weights (a check of the pipeline, not the numbers)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    frame = steps(serving_runs.development(), quick=a.quick, seed=a.seed)
    left = frame[frame["error"].ne("")]
    if len(left):
        print(f"{len(left)} of {len(frame)} development rows not answered:")
        print(left.groupby("error").size().to_string())
    consts = None
    if a.fit:
        weights = "quick" if a.quick else "full"
        consts = fit(frame, source=f"neusight {weights} weights seed {a.seed}")
        save(consts)
        for e, c in consts.items():
            print(f"{e}: {c}")
    s = scored(frame, consts)
    pd.set_option("display.width", 200)
    print(error_table(s, ["engine"]).round(1).to_string(index=False))
    print(error_table(s, ["engine", "dtype", TP]).round(1).to_string(index=False))
    print(coverage_table(frame, consts).round(1).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
