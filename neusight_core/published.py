"""Whole-model measurements published by others (``published.yaml``), beside our predictions (issue 26).

``load()`` -> one row per measurement (``set``, ``model``, ``gpu``, ``measured_on``, ``mode``, ``precision``,
``batch``, ``latency_ms``, ``source``, ``settings``). ``compare(predictor, quick)`` adds ``predicted_ms``,
``ape`` (% against the measurement), ``error`` ('' when predicted) and ``label``: every row is a third-party
measurement, and an image model's prediction is an extrapolation wherever its convolutions lie outside the
release's conv records (``latency.conv_note``). Small batches are where a whole-model measurement includes host
launch gaps that a sum of kernel times does not: say so when reading the table.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from neusight_core import latency, report

PUBLISHED_FILE = Path(__file__).with_name("published.yaml")
LABEL = "third-party measurement"


def load(path: Path = PUBLISHED_FILE) -> pd.DataFrame:
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    rows = []
    for name, s in data.items():
        for r in s["rows"]:
            rows.append({"set": name, "model": s["model"], **r, "source": " ".join(s["source"].split()),
                         "settings": " ".join(s["settings"].split())})
    return pd.DataFrame(rows)


def compare(predictor="neusight", quick: bool = False, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Our prediction for every published row, under its settings (model, GPU, mode, precision, batch)."""
    t = (load() if table is None else table).copy()
    pred, err, note = [], [], []
    for r in t.itertuples(index=False):
        try:
            out = latency.predict_model(r.model, r.gpu, int(r.batch), None, r.mode, predictor=predictor,
                                        quick=quick, dtype=r.precision)
            pred.append(out["e2e_ms"]), err.append(""), note.append(out.get("conv_note", ""))
        except (ValueError, LookupError) as e:      # one-line input errors (unknown GPU / model, ...)
            msg = (str(e.args[0]) if e.args else str(e)).splitlines()[0]
            pred.append(float("nan")), err.append(msg), note.append("")
    t["predictor"] = predictor if isinstance(predictor, str) else predictor.name
    t["predicted_ms"] = pred
    t["ape"] = report.ape(t["latency_ms"], t["predicted_ms"])
    t["error"], t["extrapolation"], t["label"] = err, note, LABEL
    return t
