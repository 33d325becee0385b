"""The authors' printed tables and our Tier 0 tables compared with them, cell by cell (notebook 01).

``read_authors_table(name)`` parses one of the release's ``summary/<name>.csv`` (or ``fp16mm.csv``) into the layout
the matching ``evaluation`` builder returns; ``compare_table`` / ``compare_all`` compare at printed precision and
``explain_exceptions`` gives every differing cell its reason (re-checked, not assumed).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from neusight_core.studies import evaluation as ev
from neusight_core.studies import paper_tables as pt
from neusight_core.data import devices
from neusight_core import paths
from neusight_core.question import schema

_NUM = re.compile(r"^\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*%?\s*$")
_PRED_ERR = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*\(\s*(-?\d+(?:\.\d+)?)%\)\s*$")


def _num(cell: str, where: str) -> float:
    cell = (cell or "").strip()
    if cell == "":
        return np.nan
    m = _NUM.match(cell)
    if not m:
        raise ev.EvaluationError(f"{where}: cannot read number from {cell!r}")
    return float(m.group(1))


def _csv_rows(path: Path) -> list[list[str]]:
    import csv
    if not path.is_file():
        raise ev.EvaluationError(f"authors' table {path} does not exist (run `python -m neusight_core.data.release`)")
    with open(path, newline="") as f:
        return [r for r in csv.reader(f)]


def read_authors_table(name: str, summary_dir: str | Path | None = None) -> pd.DataFrame:
    """One of the authors' ``summary/<name>.csv`` (or ``fp16mm.csv``) parsed into the layout that
    the matching builder returns (numbers as floats, blanks as NaN)."""
    sdir = Path(summary_dir) if summary_dir else paths.summary_dir()
    if name == "fp16mm":
        t = pt.load_fp16mm(sdir.parent / "fp16mm.csv")
        t["pred_ms"], t["ape"] = t["pred_ms"], t["authors_ape"]
        out = t[["B", "M", "N", "K", "label_ms", "pred_ms", "ape"]]
        out.index = pd.Index([f"{r.B}x{r.M}x{r.N}x{r.K}" for r in out.itertuples()], name="shape (BxMxNxK)")
        return out
    path = sdir / f"{name}.csv"
    rows = _csv_rows(path)
    if name in ("nvidia_inf", "nvidia_train"):
        spec = pt.FIGURES[name]
        out = pd.DataFrame(np.nan, index=pd.MultiIndex.from_tuples(
            [(g, d) for g in spec.gpus for d in ev.FIGURE_PREDICTORS.values()], names=["gpu", "predictor"]),
            columns=pt.figure_columns(spec))
        gpu = None
        for i, r in enumerate(rows):
            if not r or all(c == "" for c in r):
                continue
            if len(r) == 1:
                gpu = r[0]
            elif r[0] in ev.FIGURE_PREDICTORS.values():
                for j, col in enumerate(out.columns):
                    out.loc[(gpu, r[0]), col] = _num(r[j + 1] if j + 1 < len(r) else "", f"{path}:{i + 1}")
        return out
    if name in ("amd_inf", "amd_train"):
        spec = pt.FIGURES[name]
        cols = pt.figure_columns(spec)
        data = {r[0]: [_num(r[j + 1] if j + 1 < len(r) else "", f"{path}:{i + 1}") for j in range(len(cols))]
                for i, r in enumerate(rows) if r and r[0] in {devices.short_name(g) for g in spec.gpus}}
        return pd.DataFrame.from_dict(data, orient="index", columns=cols).rename_axis("gpu")
    if name == "perop":
        tmpl = table_perop_template()
        for i, r in enumerate(rows[2:], start=3):
            if r and r[0] in ev.FIGURE_PREDICTORS.values():
                tmpl.loc[r[0]] = [_num(r[j + 1], f"{path}:{i}") for j in range(len(tmpl.columns))]
        return tmpl
    if name in ("fusion_inf", "distributed"):
        if name == "fusion_inf":
            ncol, ours = 6, table_fusion_inf_template()
        else:
            ncol, ours = 6, table_distributed_template()
        key_model, key_batch = None, None
        for i, r in enumerate(rows[2:], start=3):
            if len(r) < 3 + ncol:
                continue
            if r[0]:
                key_model = r[0]
            if r[1]:
                key_batch = r[1] if name == "fusion_inf" else int(r[1])
            qty = r[2]
            for j, col in enumerate(ours.columns):
                cell = r[3 + j].strip()
                if qty.startswith("Measured"):
                    ours.loc[(key_model, key_batch, pt.QUANTITIES[0]), col] = _num(cell, f"{path}:{i}")
                elif cell:
                    m = _PRED_ERR.match(cell)
                    if not m:
                        raise ev.EvaluationError(f"{path}:{i}: cannot read 'pred (APE%)' from {cell!r}")
                    ours.loc[(key_model, key_batch, pt.QUANTITIES[1]), col] = float(m.group(1))
                    ours.loc[(key_model, key_batch, pt.QUANTITIES[2]), col] = float(m.group(2))
        return ours
    raise ev.EvaluationError(f"unknown table {name!r} (known: {', '.join(list(pt.TABLES) + ['fp16mm'])})")


def table_perop_template() -> pd.DataFrame:
    cols = pd.MultiIndex.from_tuples([(dist, schema.CLASS_LABEL[op]) for dist in ("In Distribution", "Out of Distribution")
                                      for op in schema.PAPER_CLASSES], names=["distribution", "op"])
    return pd.DataFrame(np.nan, index=pd.Index(list(ev.FIGURE_PREDICTORS.values()), name="predictor"), columns=cols)


def table_fusion_inf_template() -> pd.DataFrame:
    return pt.table_fusion_inf(pd.DataFrame(columns=ev.KEY + ["label_e2e_ms", "pred_neusight_ms"]))


def table_distributed_template() -> pd.DataFrame:
    return pt.table_distributed(pd.DataFrame(columns=ev.KEY + ["label_e2e_ms", "pred_neusight_ms"]))


# --------------------------------------------------------------------------------- comparison
def _label(x) -> str:
    return " / ".join(str(v) for v in x) if isinstance(x, tuple) else str(x)


def compare_table(name: str, ours: pd.DataFrame, theirs: pd.DataFrame, decimals: int = 1) -> pd.DataFrame:
    """Cell-by-cell comparison at printed precision: a tidy frame (table, row, column, theirs, ours,
    equal). Equal = both blank, or both round to the same ``decimals`` (the authors print 0.1)."""
    if name == "fp16mm":  # the authors' file only carries the APE of their prediction to compare
        ours, theirs = ours[["ape"]], theirs[["ape"]]
    recs = []
    for r in theirs.index.union(ours.index, sort=False):
        for c in theirs.columns.union(ours.columns, sort=False):
            t = theirs.at[r, c] if (r in theirs.index and c in theirs.columns) else np.nan
            o = ours.at[r, c] if (r in ours.index and c in ours.columns) else np.nan
            t, o = float(t), float(o)
            if np.isnan(t) and np.isnan(o):
                continue  # blank in both: not a cell of the paper
            equal = (not np.isnan(t) and not np.isnan(o)
                     and (round(t, decimals) == round(o, decimals) or abs(t - o) < 1e-9))
            recs.append({"table": name, "row": _label(r), "column": _label(c), "theirs": t, "ours": o,
                         "equal": bool(equal)})
    return pd.DataFrame(recs, columns=["table", "row", "column", "theirs", "ours", "equal"])


def compare_all(index: pd.DataFrame, fp16: pd.DataFrame | None = None,
                summary_dir: str | Path | None = None) -> tuple[dict, pd.DataFrame]:
    """Rebuild every table from ``index`` and compare with the authors'; returns (tables, diff)."""
    tables = pt.build_tables(index, fp16)
    diffs = [compare_table(n, t, read_authors_table(n, summary_dir)) for n, t in tables.items()]
    return tables, pd.concat(diffs, ignore_index=True)


def explain_exceptions(diff: pd.DataFrame, index: pd.DataFrame, fp16: pd.DataFrame | None = None,
                       summary_dir: str | Path | None = None) -> pd.DataFrame:
    """The cells of ``diff`` that are not equal, each with a ``reason``.

    Table 6 cells are re-checked with :func:`fill_per_op_from_authors_summary`: when the cell then
    equals, the reason is the per-node labels missing from the release, which is thereby shown
    (not assumed) to be the whole cause."""
    bad = diff[~diff["equal"]].copy()
    if bad.empty:
        return bad.assign(reason=pd.Series(dtype=str))
    reasons = {}
    if (bad["table"] == "perop").any():
        filled = ev.fill_per_op_from_authors_summary(index, Path(summary_dir or paths.summary_dir()) / "summary.csv")
        n_filled = int((filled["per_op_source"] == "authors_summary").sum())
        cfgs = sorted(filled.loc[filled["per_op_source"] == "authors_summary", "model"].unique())
        recheck = compare_table("perop", pt.table_perop(filled), read_authors_table("perop", summary_dir))
        ok = {(r.row, r.column) for r in recheck.itertuples() if r.equal}
        for i, r in bad[bad["table"] == "perop"].iterrows():
            if (r["row"], r["column"]) in ok:
                reasons[i] = (f"the release lacks the per-node label CSVs of {n_filled} {'/'.join(cfgs)} "
                              "configurations (listed in ABSENT.txt) that the authors averaged over; filled in "
                              "with the authors' per-op sums from their summary.csv, this cell equals theirs")
    for i, r in bad.iterrows():
        if i not in reasons:
            reasons[i] = explain_difference(r)
    bad["reason"] = pd.Series(reasons)
    return bad


def explain_difference(row: pd.Series) -> str:
    """A generic reason for a cell that differs."""
    t, o = row["theirs"], row["ours"]
    if np.isnan(t):
        if o == 0:
            return "the authors print an APE of exactly 0 as a blank cell"
        return "the authors' table has no value here"
    if np.isnan(o):
        return "no label or prediction for this cell in the raw files"
    return f"values differ by {o - t:+.3f}"
