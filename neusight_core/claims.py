"""The claims register: every claim of SPEC section 5, computed from an index frame and judged.

The paper's numbers live only in ``claims.yaml`` (beside this file); its header documents the
schema. :func:`compute_claims` evaluates every aggregation of every claim on an index frame built by
:func:`neusight_core.evaluation.build_index` (or one whose prediction columns were replaced with
ours, :func:`neusight_core.evaluation.with_predictions`) and returns two frames:

* ``detail``: one row per (claim, aggregation, quantity): expected, computed, difference, number
  of cells, verdict and reason;
* ``summary``: one row per claim with its verdict.

Verdicts, per quantity:
  REPRODUCED       |computed - expected| <= tolerance (0.1 by default)
  DEVIATES         otherwise; the computed value and the difference are given
  NOT COMPUTABLE   the index has no labelled cell for it, or some of its cells have no prediction
                   (the value over the others is still shown), or an input is missing; the reason
                   says which
An aggregation is REPRODUCED when all its quantities are, DEVIATES when any deviates, else NOT
COMPUTABLE. A claim is REPRODUCED when one of its aggregations is (the ``aggregation`` column names
it); otherwise it takes the verdict of its first (primary) aggregation.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from . import evaluation as ev

CLAIMS_FILE = Path(__file__).with_name("claims.yaml")
VERDICTS = ("REPRODUCED", "DEVIATES", "NOT COMPUTABLE")
_AGG_KEYS = ("cells", "where", "stat", "predictor", "group_by")


class ClaimsError(ValueError):
    """The claims file is malformed; the message names the claim and the problem."""


def load_claims(path: str | Path | None = None) -> dict:
    """Read and check the claims file; returns {'tolerance': float, 'claims': [...]}."""
    p = Path(path) if path else CLAIMS_FILE
    try:
        body = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ClaimsError(f"{p}: cannot read the claims file ({str(e).splitlines()[0]})") from None
    if not isinstance(body, dict) or not isinstance(body.get("claims"), list):
        raise ClaimsError(f"{p}: expected a mapping with a 'claims' list")
    seen = set()
    for c in body["claims"]:
        cid = c.get("id", "?")
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
    body.setdefault("tolerance", 0.1)
    return body


# ------------------------------------------------------------------------------ cell sources
def _cells(source: str, index: pd.DataFrame, predictor: str, fp16: pd.DataFrame | None) -> pd.DataFrame:
    """Long frame of cells with an ``ape`` column for one predictor column key."""
    if source in ("fig7", "fig8", "fig9_inf", "fig9_train"):
        name = {"fig7": "nvidia_inf", "fig8": "nvidia_train", "fig9_inf": "amd_inf", "fig9_train": "amd_train"}[source]
        c = ev.figure_cells(index, name, {predictor: predictor})
        c["mode"] = ev.FIGURES[name].mode
        return c
    if source == "fusion":
        c = ev.fusion_cells(index, predictor)
        if not c.empty:
            c["mode"] = "inf"
        return c
    if source == "distributed":
        c = ev.distributed_cells(index, predictor)
        if not c.empty:
            c["mode"] = "train"
        return c
    if source == "index":
        ev._check_columns(index, ["label_e2e_ms", f"pred_{predictor}_ms"])
        c = index.copy()
        c["ape"] = ev._safe_ape(c["label_e2e_ms"], c[f"pred_{predictor}_ms"])
        return c
    if source in ("perop", "perop_authors_fill"):
        ev._check_columns(index, ["has_per_op", "vendor", "in_authors_summary", "ood"]
                          + [f"{k}_{op}_ms" for k in ("label", f"pred_{predictor}") for op in ev.OP_CLASSES])
        idx = ev.fill_per_op_from_authors_summary(index) if source == "perop_authors_fill" else index
        t = ev.table_perop(idx, {predictor: predictor})
        return pd.DataFrame([{"dist": d, "op": o, "ape": t.loc[predictor, (d, o)]} for d, o in t.columns])
    if source == "fp16mm":
        if fp16 is None:
            raise ev.EvaluationError("no FP16 BMM frame was given (Figure 10 is not part of the index)")
        return ev.table_fp16mm(fp16).reset_index(drop=True)
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
    return {"computed": value, "n_cells": len(cells), "verdict": _verdict(expected, value, tol), "reason": ""}


def _aggregate_verdict(verdicts) -> str:
    v = list(verdicts)
    if v and all(x == "REPRODUCED" for x in v):
        return "REPRODUCED"
    if any(x == "DEVIATES" for x in v):
        return "DEVIATES"
    return "NOT COMPUTABLE"


def compute_claims(index: pd.DataFrame, fp16: pd.DataFrame | None = None, claims: dict | None = None,
                   predictor_columns: dict | None = None, tolerance: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Compute every claim from ``index``; returns (summary, detail) frames (see module docstring).

    ``fp16``: the Figure 10 frame (``evaluation.load_fp16mm()`` or ours); None makes C9 NOT COMPUTABLE.
    ``predictor_columns`` maps a claim's predictor to an index column key, e.g. ``{"neusight": "ours"}``
    to judge the claims with ``pred_ours_ms``."""
    reg = claims or load_claims()
    tol = float(reg["tolerance"] if tolerance is None else tolerance)
    pc = predictor_columns or {}
    detail, cache = [], {}
    for c in reg["claims"]:
        for k, agg in enumerate(c["aggregations"]):
            base = {key: agg[key] for key in _AGG_KEYS if key in agg}
            for qname, qspec in agg["quantities"].items():
                spec = dict(base)
                spec.update({"predictor": qspec} if isinstance(qspec, str) else (qspec or {}))
                if "cells" not in spec:
                    raise ClaimsError(f"claim {c['id']}, quantity {qname!r}: no 'cells'")
                exp = float(c["expected"][qname])
                r = _quantity(spec, index, fp16, pc, tol, exp, cache)
                detail.append({"claim": c["id"], "aggregation": agg["name"], "primary": k == 0,
                               "quantity": qname, "expected": exp, "computed": r["computed"],
                               "difference": r["computed"] - exp, "n_cells": r["n_cells"],
                               "verdict": r["verdict"], "reason": r["reason"]})
    detail = pd.DataFrame(detail)

    summary = []
    for c in reg["claims"]:
        d = detail[detail["claim"] == c["id"]]
        per_agg = {a: _aggregate_verdict(g["verdict"]) for a, g in d.groupby("aggregation", sort=False)}
        primary = c["aggregations"][0]["name"]
        hit = next((a for a, v in per_agg.items() if v == "REPRODUCED"), None)
        chosen = hit or primary
        rows = d[d["aggregation"] == chosen]
        computed = "; ".join(f"{q} {v:.2f}" if np.isfinite(v) else f"{q} n/a"
                             for q, v in zip(rows["quantity"], rows["computed"]))
        expected = "; ".join(f"{q} {v:g}" for q, v in c["expected"].items())
        notes = [r for r in rows["reason"] if r]
        dev = rows[rows["verdict"] == "DEVIATES"]
        if len(dev):
            notes.insert(0, "differs: " + "; ".join(f"{q} {x:+.2f}" for q, x in zip(dev["quantity"], dev["difference"])))
        if hit and hit != primary:
            notes.insert(0, f"reproduced by the alternative aggregation '{hit}', not by '{primary}'")
        others = [f"{a}: {v}" for a, v in per_agg.items() if a != chosen]
        summary.append({"claim": c["id"], "text": c["text"], "source": c["source"], "expected": expected,
                        "computed": computed, "verdict": per_agg[primary] if not hit else "REPRODUCED",
                        "aggregation": chosen, "note": " | ".join(notes + ([c["note"]] if c.get("note") else [])),
                        "other_aggregations": "; ".join(others)})
    return pd.DataFrame(summary), detail


def verdict_counts(summary: pd.DataFrame) -> dict:
    """{verdict: number of claims} with every verdict present (0 when none)."""
    return {v: int((summary["verdict"] == v).sum()) for v in VERDICTS}


def claims_markdown(summary: pd.DataFrame) -> str:
    """The claims table as Markdown for SUMMARY.md (one line per claim)."""
    t = summary[["claim", "text", "expected", "computed", "verdict", "aggregation"]].copy()
    t["text"] = t["text"].str.replace("|", "/", regex=False)
    return t.to_markdown(index=False)
