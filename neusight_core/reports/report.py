"""Writing a notebook's outputs, the same way for every notebook.

Layout under the output folder a notebook is given (papermill parameter ``output_dir``):
  tables/<name>.csv and tables/<name>.md   tidy tables (Markdown for people, CSV for code)
  figures/<name>.png and figures/<name>.pdf
  metrics.json                             the notebook's key numbers; ``status`` is OK or SKIPPED
  summary.md                               optional short Markdown that run_all.sh copies into SUMMARY.md
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from neusight_core.data.datafile import jsonable
from neusight_core.paths import out_dir




def save_table(df: pd.DataFrame, output_dir: str | Path, name: str, floatfmt: str = ".1f",
               index: bool = False, title: str = "", na: dict | None = None) -> Path:
    """Write ``df`` as CSV (full precision) and Markdown (``floatfmt``); return the CSV path.

    In the Markdown, a non-zero value that ``floatfmt`` would print as 0 (e.g. 0.03 ms at ".1f") is
    written with two significant digits instead: "0.0 ms" would read as nothing at all. ``title``: a line above the
    Markdown table that says what its numbers are (metric, seeds, recipe) where the column names cannot; ``na``:
    column -> why its empty cells are empty, written in them in the Markdown (a bare "nan" says nothing). The CSV keeps
    its columns and NaNs as they are (what code reads back)."""
    d = out_dir(output_dir) / "tables"
    csv = d / f"{name}.csv"
    df.to_csv(csv, index=index)
    (d / f"{name}.md").write_text((f"{title}\n\n" if title else "") + markdown_table(df, floatfmt, index, na) + "\n")
    return csv


def markdown_table(df: pd.DataFrame, floatfmt: str = ".1f", index: bool = False, na: dict | None = None) -> str:
    """``df.to_markdown`` where a non-zero float that ``floatfmt`` would round to zero is printed with
    two significant digits (0.03, not 0.0), and the empty cells of a column of ``na`` hold its reason."""
    m = re.fullmatch(r"\.(\d+)f", floatfmt)
    floats = [c for c in df.columns if pd.api.types.is_float_dtype(df[c])]
    na = {c: why for c, why in (na or {}).items() if c in df.columns and df[c].isna().any()}
    half = 0.5 * 10.0 ** -int(m.group(1)) if m else 0.0
    tiny = bool(m) and any(((df[c] != 0) & (df[c].abs() < half)).any() for c in floats)
    if not tiny and not na:
        return df.to_markdown(index=index, floatfmt=floatfmt)
    out = df.copy()
    for c in set(floats) | set(na):
        out[c] = [na.get(c, "nan") if pd.isna(v) else
                  (f"{v:.2g}" if m and isinstance(v, float) and v != 0 and abs(v) < half
                   else format(v, floatfmt) if isinstance(v, float) else str(v)) for v in df[c]]
    cols = ([None] if index else []) + list(df.columns)
    align = ["right" if c in floats or (c is not None and pd.api.types.is_numeric_dtype(df[c])) else "left" for c in cols]
    return out.to_markdown(index=index, floatfmt=floatfmt, disable_numparse=True, colalign=align)


def save_figure(fig, output_dir: str | Path, name: str) -> Path:
    """Write a matplotlib figure as PNG (150 dpi) and PDF; return the PNG path."""
    d = out_dir(output_dir) / "figures"
    png = d / f"{name}.png"
    fig.savefig(png, dpi=150, bbox_inches="tight")
    fig.savefig(d / f"{name}.pdf", bbox_inches="tight")
    return png




def write_metrics(output_dir: str | Path, metrics: dict, status: str = "OK", reason: str | None = None) -> Path:
    """Write metrics.json with a ``status`` (OK | SKIPPED | FAILED) that run_all.sh reads.

    FAILED: the notebook ran to its end but its result is a failure (e.g. every prediction failed);
    the run then counts it as failed and exits non-zero. ``reason`` is required for SKIPPED/FAILED."""
    if status not in ("OK", "SKIPPED", "FAILED"):
        raise ValueError(f"status must be OK, SKIPPED or FAILED, not {status!r}")
    if status != "OK" and not reason:
        raise ValueError(f"status {status} needs a reason")
    body = {"status": status, **({"reason": reason} if reason else {}), **metrics}
    p = out_dir(output_dir) / "metrics.json"
    tmp = p.with_name(".metrics.json.tmp")  # never a half-written metrics.json
    tmp.write_text(json.dumps(jsonable(body), indent=2, allow_nan=False))
    tmp.replace(p)
    return p


def write_summary(output_dir: str | Path, markdown: str) -> Path:
    """Short Markdown (a table or two) that run_all.sh includes in SUMMARY.md."""
    p = out_dir(output_dir) / "summary.md"
    p.write_text(markdown.rstrip() + "\n")
    return p
