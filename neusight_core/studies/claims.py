"""The claims register: every claim of the paper (and of third-party summaries) computed and judged.

The paper's numbers live only in ``claims.yaml`` (beside this file); its header documents the
schema. :func:`compute_claims` evaluates every aggregation of every claim on an index frame built by
:func:`neusight_core.studies.evaluation.build_index` (or one whose prediction columns were replaced with
ours, :func:`neusight_core.studies.evaluation.with_predictions`) and returns two frames:

* ``detail``: one row per (claim, aggregation, quantity): expected, computed, difference, number
  of cells, tolerance, verdict, grade and reason;
* ``summary``: one row per claim with its verdict and grade.

Tolerance follows the printed precision of the claim (one rule for every notebook): a value printed
with d decimals is REPRODUCED when |computed - printed| <= half a unit of its last digit, i.e.
0.5 x 10^-d ("9.7" -> 0.05, "12.87" -> 0.005, "about 13" -> 0.5). The digits are read from
``claims.yaml`` as written there (``8.40`` keeps its two decimals).

Verdicts, per quantity:
  REPRODUCED       within that tolerance
  DEVIATES         otherwise; the computed value and the difference are given
  NOT COMPUTABLE   the index has no labelled cell for it, some of its cells have no prediction
                   (the value over the others is still shown), an input is missing, or the release
                   cannot back the claim at all (``not_computable`` in claims.yaml); the reason says which
Graded verdict next to it (:data:`GRADES`): ``within tolerance``; ``within 10 %`` (relative to the
printed value); ``within 2x`` (between half and twice the printed value); ``worse``. A claim's grade
is the worst grade of the quantities of the aggregation that decides it.
An aggregation is REPRODUCED when all its quantities are, DEVIATES when any deviates, else NOT
COMPUTABLE. A claim is REPRODUCED when one of its aggregations is (the ``aggregation`` column names
it, and the note says it is an alternative); otherwise it takes the verdict of its first (primary)
aggregation.

The verdict block of SUMMARY.md is built by the runner from the ``verdicts`` key of a notebook's
``metrics.json``; :func:`verdict_block` produces that key (contract in ``docs/interfaces.md``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from neusight_core.question import schema
from neusight_core.question.schema import Mode
from neusight_core.studies import evaluation as ev
from neusight_core.studies import paper_tables as pt

CLAIMS_FILE = Path(__file__).with_name("claims.yaml")
VERDICTS = ("REPRODUCED", "DEVIATES", "NOT COMPUTABLE")
GRADES = ("within tolerance", "within 10 %", "within 2x", "worse")
_AGG_KEYS = ("cells", "where", "stat", "predictor", "group_by")


class ClaimsError(ValueError):
    """The claims file is malformed; the message names the claim and the problem."""


class Printed(float):
    """A number as printed in the claims file; ``decimals`` = digits after the point as written."""
    decimals: int = 0

    def __new__(cls, text: str):
        v = super().__new__(cls, text)
        v.text = text.strip()
        t = text.strip().lower()
        v.decimals = len(t.split(".", 1)[1].split("e")[0]) if "." in t else 0
        return v


class _Loader(yaml.SafeLoader):
    """Safe loader that keeps how numbers were written (tolerance follows printed precision)."""


def _number(loader, node):
    return Printed(loader.construct_scalar(node))


_Loader.add_constructor("tag:yaml.org,2002:float", _number)
_Loader.add_constructor("tag:yaml.org,2002:int", _number)


def printed_tolerance(value) -> float:
    """Half a unit of the last printed digit (0.5 x 10^-decimals); 0.05 for a plain float."""
    d = getattr(value, "decimals", None)
    if d is None:  # a plain number (claims given as a dict): its shortest repr is what was written
        r = repr(value).lower()
        d = len(r.split(".", 1)[1].split("e")[0]) if "." in r and not r.endswith(".0") else 0
    return 0.5 * 10.0 ** (-d)


def grade(expected: float, computed: float, tol: float) -> str:
    """Graded verdict of one quantity (see :data:`GRADES`); '' when nothing was computed."""
    if computed is None or not np.isfinite(computed):
        return ""
    diff = abs(computed - expected)
    if diff <= tol + 1e-9:
        return GRADES[0]
    if diff <= 0.1 * abs(expected) + 1e-9:
        return GRADES[1]
    if expected > 0 and expected / 2 <= computed <= 2 * expected:
        return GRADES[2]
    return GRADES[3]


def _worst(grades) -> str:
    g = [x for x in grades if x]
    return max(g, key=GRADES.index) if g else ""


def load_claims(path: str | Path | None = None) -> dict:
    """Read and check the claims file; returns {'tolerance': 'printed' or float, 'claims': [...]}."""
    p = Path(path) if path else CLAIMS_FILE
    try:
        body = yaml.load(p.read_text(), Loader=_Loader)
    except (OSError, yaml.YAMLError) as e:
        raise ClaimsError(f"{p}: cannot read the claims file ({str(e).splitlines()[0]})") from None
    if not isinstance(body, dict) or not isinstance(body.get("claims"), list):
        raise ClaimsError(f"{p}: expected a mapping with a 'claims' list")
    seen = set()
    for c in body["claims"]:
        cid = c.get("id", "?")
        c.setdefault("aggregations", [])
        if not c["aggregations"] and not c.get("not_computable"):
            raise ClaimsError(f"{p}: claim {cid} has no aggregation and no 'not_computable' reason")
        for k in ("id", "text", "source", "how", "expected", "aggregations"):
            if k not in c:
                raise ClaimsError(f"{p}: claim {cid} lacks {k!r}")
        if cid in seen:
            raise ClaimsError(f"{p}: claim id {cid} appears twice")
        seen.add(cid)
        for a in c["aggregations"]:
            qs = a.get("quantities") or {}
            unknown = set(qs) - set(c["expected"])
            missing = set(c["expected"]) - set(qs)
            if unknown or missing:
                raise ClaimsError(f"{p}: claim {cid}, aggregation {a.get('name')!r}: quantities "
                                  f"{sorted(unknown)} not expected / {sorted(missing)} not computed")
    body.setdefault("tolerance", "printed")
    return body


# ------------------------------------------------------------------------------ cell sources
def _cells(source: str, index: pd.DataFrame, predictor: str, fp16: pd.DataFrame | None) -> pd.DataFrame:
    """Long frame of cells with an ``ape`` column for one predictor column key."""
    if source in ("fig7", "fig8", "fig9_inf", "fig9_train"):
        name = {"fig7": "nvidia_inf", "fig8": "nvidia_train", "fig9_inf": "amd_inf", "fig9_train": "amd_train"}[source]
        c = pt.figure_cells(index, name, {predictor: predictor})
        c["mode"] = pt.FIGURES[name].mode
        return c
    if source == "fusion":
        c = pt.fusion_cells(index, predictor)
        if not c.empty:
            c["mode"] = Mode.INF
        return c
    if source == "distributed":
        c = pt.distributed_cells(index, predictor)
        if not c.empty:
            c["mode"] = Mode.TRAIN
        return c
    if source == "index":
        pt.check_columns(index, ["label_e2e_ms", f"pred_{predictor}_ms"])
        c = index.copy()
        c["ape"] = ev.safe_ape(c["label_e2e_ms"], c[f"pred_{predictor}_ms"])
        return c
    if source in ("perop", "perop_authors_fill"):
        pt.check_columns(index, ["has_per_op", "vendor", "in_authors_summary", "ood"]
                          + [f"{k}_{op}_ms" for k in ("label", f"pred_{predictor}") for op in schema.PAPER_CLASSES])
        idx = ev.fill_per_op_from_authors_summary(index) if source == "perop_authors_fill" else index
        t = pt.table_perop(idx, {predictor: predictor})
        return pd.DataFrame([{"dist": d, "op": o, "ape": t.loc[predictor, (d, o)]} for d, o in t.columns])
    if source == "fp16mm":
        if fp16 is None:
            raise ev.EvaluationError("no FP16 BMM frame was given (Figure 10 is not part of the index)")
        return pt.table_fp16mm(fp16).reset_index(drop=True)
    raise ClaimsError(f"unknown cell source {source!r}")


def _filter(cells: pd.DataFrame, where: dict) -> pd.DataFrame:
    for key, val in (where or {}).items():
        vals = val if isinstance(val, list) else [val]
        if key == "gpu":
            m = cells["gpu"].isin(vals) | cells.get("gpu_short", cells["gpu"]).isin(vals)
        elif key not in cells.columns:
            raise ClaimsError(f"cannot filter on {key!r}: the cells have no such column")
        else:
            m = cells[key].isin(vals)
        cells = cells[m]
    return cells


def _stat(cells: pd.DataFrame, stat: str, group_by) -> float:
    a = cells["ape"].dropna()
    if stat == "mean":
        return float(a.mean())
    if stat == "max":
        return float(a.max())
    if stat == "median":
        return float(a.median())
    if stat == "cell":
        if len(a) != 1:
            raise ClaimsError(f"stat 'cell' needs exactly one cell, the selection has {len(a)}")
        return float(a.iloc[0])
    if stat == "mean_of_group_means":
        if not group_by:
            raise ClaimsError("stat 'mean_of_group_means' needs group_by")
        return float(cells.dropna(subset=["ape"]).groupby(list(group_by))["ape"].mean().mean())
    raise ClaimsError(f"unknown stat {stat!r}")


def _verdict(expected: float, computed: float, tol: float) -> str:
    return "REPRODUCED" if abs(computed - expected) <= tol + 1e-9 else "DEVIATES"


def _quantity(spec: dict, index, fp16, predictor_columns: dict, tol: float, expected: float,
              cache: dict) -> dict:
    """Evaluate one quantity; never raises on missing data (that is a NOT COMPUTABLE verdict)."""
    pred = spec.get("predictor", "neusight")
    col = predictor_columns.get(pred, pred)
    try:
        frames = []
        for src in spec["cells"]:
            if (src, col) not in cache:  # the same cells serve many quantities
                cache[(src, col)] = _cells(src, index, col, fp16)
            frames.append(cache[(src, col)])
        frames = [f for f in frames if not f.empty]
        cells = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        if not cells.empty:
            cells = _filter(cells, spec.get("where"))
    except ev.EvaluationError as e:
        return {"computed": np.nan, "n_cells": 0, "verdict": "NOT COMPUTABLE", "reason": str(e)}
    if cells.empty:
        return {"computed": np.nan, "n_cells": 0, "verdict": "NOT COMPUTABLE",
                "reason": f"no labelled cell in {'+'.join(spec['cells'])} matches {spec.get('where') or 'all'}"}
    n_missing = int(cells["ape"].isna().sum())
    if n_missing == len(cells):
        return {"computed": np.nan, "n_cells": len(cells), "verdict": "NOT COMPUTABLE",
                "reason": f"none of the {len(cells)} cells has a {col} prediction"}
    value = _stat(cells, spec.get("stat", "mean"), spec.get("group_by"))
    if n_missing:
        return {"computed": value, "n_cells": len(cells) - n_missing, "verdict": "NOT COMPUTABLE",
                "reason": f"{n_missing} of {len(cells)} cells have no {col} prediction (value over the others)"}
    return {"computed": value, "n_cells": len(cells), "verdict": _verdict(expected, value, tol), "reason": "",
            "grade": grade(expected, value, tol)}


def _aggregate_verdict(verdicts) -> str:
    v = list(verdicts)
    if v and all(x == "REPRODUCED" for x in v):
        return "REPRODUCED"
    if any(x == "DEVIATES" for x in v):
        return "DEVIATES"
    return "NOT COMPUTABLE"


def _tolerance(reg: dict, override, expected) -> float:
    if override is not None:
        return float(override)
    t = reg.get("tolerance", "printed")
    return printed_tolerance(expected) if t in (None, "printed") else float(t)


def compute_claims(index: pd.DataFrame, fp16: pd.DataFrame | None = None, claims: dict | None = None,
                   predictor_columns: dict | None = None, tolerance: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Compute every claim from ``index``; returns (summary, detail) frames (see module docstring).

    ``fp16``: the Figure 10 frame (``paper_tables.load_fp16mm()`` or ours); None makes C9 NOT COMPUTABLE.
    ``predictor_columns`` maps a claim's predictor to an index column key, e.g. ``{"neusight": "ours"}``
    to judge the claims with ``pred_ours_ms``. ``tolerance`` overrides the printed-precision rule."""
    reg = claims or load_claims()
    pc = predictor_columns or {}
    detail, cache = [], {}
    for c in reg["claims"]:
        if c.get("not_computable"):
            for qname, exp in c["expected"].items():
                detail.append({"claim": c["id"], "aggregation": "", "primary": True, "quantity": qname,
                               "predictor": "neusight", "expected": float(exp), "computed": np.nan, "difference": np.nan, "n_cells": 0,
                               "tolerance": _tolerance(reg, tolerance, exp), "verdict": "NOT COMPUTABLE",
                               "grade": "", "reason": str(c["not_computable"]).strip()})
            continue
        for k, agg in enumerate(c["aggregations"]):
            base = {key: agg[key] for key in _AGG_KEYS if key in agg}
            for qname, qspec in agg["quantities"].items():
                spec = dict(base)
                spec.update({"predictor": qspec} if isinstance(qspec, str) else (qspec or {}))
                if "cells" not in spec:
                    raise ClaimsError(f"claim {c['id']}, quantity {qname!r}: no 'cells'")
                exp_raw = c["expected"][qname]
                exp, tol = float(exp_raw), _tolerance(reg, tolerance, exp_raw)
                r = _quantity(spec, index, fp16, pc, tol, exp, cache)
                detail.append({"claim": c["id"], "aggregation": agg["name"], "primary": k == 0,
                               "quantity": qname, "predictor": spec.get("predictor", "neusight"), "expected": exp, "computed": r["computed"],
                               "difference": r["computed"] - exp, "n_cells": r["n_cells"], "tolerance": tol,
                               "verdict": r["verdict"], "grade": r.get("grade", ""), "reason": r["reason"]})
    detail = pd.DataFrame(detail)

    summary = []
    for c in reg["claims"]:
        d = detail[detail["claim"] == c["id"]]
        expected = "; ".join(f"{q} {getattr(v, 'text', None) or f'{v:g}'}" for q, v in c["expected"].items())
        if c.get("not_computable"):
            summary.append({"claim": c["id"], "text": c["text"], "source": c["source"], "expected": expected,
                            "computed": "n/a", "verdict": "NOT COMPUTABLE", "grade": "", "aggregation": "",
                            "verdict (NeuSight)": "NOT COMPUTABLE", "grade (NeuSight)": "", "verdict (baselines)": "",
                            "note": " — ".join([str(c["not_computable"]).strip()] + ([c["note"]] if c.get("note") else [])),
                            "other_aggregations": ""})
            continue
        per_agg = {a: _aggregate_verdict(g["verdict"]) for a, g in d.groupby("aggregation", sort=False)}
        primary = c["aggregations"][0]["name"]
        hit = next((a for a, v in per_agg.items() if v == "REPRODUCED"), None)
        chosen = hit or primary
        rows = d[d["aggregation"] == chosen]
        computed = "; ".join(f"{q} {v:.2f}" if np.isfinite(v) else f"{q} n/a"
                             for q, v in zip(rows["quantity"], rows["computed"]))
        notes = list(dict.fromkeys(r for r in rows["reason"] if r))     # one reason once, however many quantities
        dev = rows[rows["verdict"] == "DEVIATES"]
        if len(dev):
            notes.insert(0, "differs: " + "; ".join(f"{q} {x:+.2f}" for q, x in zip(dev["quantity"], dev["difference"])))
        if hit and hit != primary:
            notes.insert(0, f"reproduced only by the alternative aggregation '{hit}' "
                            f"(the primary aggregation '{primary}' gives: {per_agg[primary]})")
        others = [f"{a}: {v}" for a, v in per_agg.items() if a != chosen]
        # NeuSight's own quantities apart from the baselines' (a claim such as "NeuSight 9.7, Habitat 220.9" mixes
        # the two; in Tier 1 the baselines are our re-implementations, whose misses say nothing of NeuSight's)
        own = rows["predictor"] == "neusight"
        split = {"verdict (NeuSight)": _aggregate_verdict(rows.loc[own, "verdict"]) if own.any() else "",
                 "grade (NeuSight)": _worst(rows.loc[own, "grade"]) if own.any() else "",
                 "verdict (baselines)": _aggregate_verdict(rows.loc[~own, "verdict"]) if (~own).any() else ""}
        summary.append({"claim": c["id"], "text": c["text"], "source": c["source"], "expected": expected,
                        "computed": computed, "verdict": per_agg[primary] if not hit else "REPRODUCED",
                        "grade": _worst(rows["grade"]), "aggregation": chosen,
                        **split, "note": " — ".join(notes + ([c["note"]] if c.get("note") else [])),
                        "other_aggregations": "; ".join(others)})
    return pd.DataFrame(summary), detail


def verdict_counts(summary: pd.DataFrame, column: str = "verdict") -> dict:
    """{verdict: number of claims} with every verdict present (0 when none); ``column``: "verdict", or
    "verdict (NeuSight)" / "verdict (baselines)" for one side of the claims (a claim without that side is not counted)."""
    return {v: int((summary[column] == v).sum()) for v in VERDICTS}


def grade_counts(summary: pd.DataFrame, column: str = "grade") -> dict:
    """{grade: number of claims} over the claims that have a computed value."""
    g = summary[column] if column in summary else pd.Series(dtype=str)
    return {x: int((g == x).sum()) for x in GRADES}


def _md_cell(x) -> str:
    return str(x).replace("|", "/").replace("\n", " ")


def claims_markdown(summary: pd.DataFrame) -> str:
    """The claims table as Markdown for SUMMARY.md (one line per claim, with its reason)."""
    cols = ["claim", "text", "expected", "computed", "verdict", "verdict (NeuSight)", "grade (NeuSight)",
            "verdict (baselines)", "grade", "aggregation", "note"]
    t = summary[[c for c in cols if c in summary]].copy()
    for c in t.columns:
        t[c] = t[c].map(_md_cell)
    return t.to_markdown(index=False)


TOLERANCE_RULE = ("REPRODUCED = within half a unit of the last digit the paper prints (\"9.7\" within 0.05, "
                  "\"12.87\" within 0.005, \"about 13\" within 0.5); grades: within tolerance / within 10 % of "
                  "the printed value / within 2x / worse")

# ------------------------------------------------------------------------------ ranking, correlation
RANKING_BASELINES = ("roofline", "habitat", "li")


def _nvidia_cells(index: pd.DataFrame, keys) -> pd.DataFrame:
    """Figure 7 + 8 cells (the 80 labelled single-GPU NVIDIA configurations) for the given column keys."""
    frames = []
    for fig in ("nvidia_inf", "nvidia_train"):
        try:
            frames.append(pt.figure_cells(index, fig, {k: k for k in keys}))
        except ev.EvaluationError:
            continue
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["predictor", "ape"])


def agreement(index: pd.DataFrame, keys=("neusight", "roofline", "habitat", "li")) -> pd.DataFrame:
    """Per predictor column key over the Fig. 7 + 8 cells: configurations, MAPE (%), and Pearson and
    Spearman correlation of predicted vs measured end-to-end latency (NaN with fewer than 3 cells)."""
    from scipy import stats
    cells = _nvidia_cells(index, [k for k in keys if f"pred_{k}_ms" in index])
    rows = []
    for k in keys:
        c = cells[(cells["predictor"] == k)].dropna(subset=["ape"]) if len(cells) else cells
        n = len(c)
        ok = n >= 3 and c["pred_ms"].nunique() > 1 and c["label_ms"].nunique() > 1
        rows.append({"predictor": k, "configurations": n,
                     "MAPE (%)": float(c["ape"].mean()) if n else np.nan,
                     "Pearson r": float(stats.pearsonr(c["label_ms"], c["pred_ms"])[0]) if ok else np.nan,
                     "Spearman rho": float(stats.spearmanr(c["label_ms"], c["pred_ms"])[0]) if ok else np.nan})
    return pd.DataFrame(rows)


def ranking(index: pd.DataFrame, neusight: str = "neusight", baselines=RANKING_BASELINES) -> dict:
    """Does NeuSight (column key ``neusight``) have a lower pooled MAPE than every baseline over the
    Fig. 7 + 8 cells? ``holds`` is None when a MAPE cannot be computed."""
    keys = [neusight, *[b for b in baselines if b != neusight]]
    a = agreement(index, keys).set_index("predictor")
    mape = {k: (None if not np.isfinite(a.loc[k, "MAPE (%)"]) else round(float(a.loc[k, "MAPE (%)"]), 2)) for k in keys}
    n = int(a.loc[neusight, "configurations"])
    holds = None if any(v is None for v in mape.values()) else all(mape[neusight] < mape[b] for b in keys[1:])
    return {"holds": holds, "mape": mape, "configurations": n,
            "scope": "pooled MAPE over the labelled single-GPU NVIDIA configurations of Figures 7 and 8"}


def verdict_block(index: pd.DataFrame, recipes, tier: int, fp16: pd.DataFrame | None = None,
                  quick: bool = False, label: str | None = None, baselines=RANKING_BASELINES) -> dict:
    """The ``verdicts`` key of a notebook's metrics.json (contract in docs/interfaces.md).

    ``recipes``: NeuSight column keys of ``index`` (``pred_<key>_ms``) to judge the claims with, e.g.
    ``["neusight"]`` for the authors' pairs (Tier 0) or ``["neusight", "neusight-paper"]`` for our
    recipes (Tier 1; baselines in the index are then ours too). Keys that are not NeuSight recipes
    (roofline, habitat, li) may be in the list: they are skipped. Returns
    ``{"tier", "label", "quick", "claims": {key: {verdict: n, ..., "graded": {grade: n}}}, "claims_neusight" and
    "claims_baselines" (the same counted over NeuSight's own quantities / the baselines'), "claim_list": {key: [{claim,
    text, neusight, grade, baselines, verdict, why}]},
    "ranking": {key: ranking(...)}, "correlation": {key: {"pearson", "spearman", "mape", "n"}}}``."""
    out = {"tier": int(tier), "label": label or ("authors' shipped predictions" if tier == 0 else "our re-implementation"),
           "quick": bool(quick), "claims": {}, "ranking": {}, "correlation": {}}
    for key in recipes:
        if key in baselines:
            continue
        summary, _ = compute_claims(index, fp16, predictor_columns={"neusight": key})
        out["claims"][key] = {**verdict_counts(summary), "graded": grade_counts(summary)}
        out.setdefault("claims_neusight", {})[key] = {**verdict_counts(summary, "verdict (NeuSight)"),
                                                      "graded": grade_counts(summary, "grade (NeuSight)")}
        out.setdefault("claims_baselines", {})[key] = verdict_counts(summary, "verdict (baselines)")
        out.setdefault("claim_list", {})[key] = [
            {"claim": r["claim"], "text": r["text"], "neusight": r["verdict (NeuSight)"], "grade": r["grade (NeuSight)"],
             "baselines": r["verdict (baselines)"], "verdict": r["verdict"], "why": r["note"]}
            for _, r in summary.iterrows()]
        out["ranking"][key] = ranking(index, key, baselines)
        a = agreement(index, [key]).iloc[0]
        out["correlation"][key] = {"n": int(a["configurations"]),
                                   **{k: (None if not np.isfinite(a[c]) else round(float(a[c]), 4))
                                      for k, c in (("mape", "MAPE (%)"), ("pearson", "Pearson r"),
                                                   ("spearman", "Spearman rho"))}}
    return out
