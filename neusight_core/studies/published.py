"""Whole-model measurements published by others (``published.yaml``), beside our predictions.

``load()`` -> one row per measurement (``set``, ``model``, ``gpu``, ``measured_on``, ``mode``, ``precision``,
``batch``, ``latency_ms``, ``throughput_img_s`` (NaN where the source gives a latency), ``source``, ``settings``).
A row published as a throughput gets ``latency_ms`` = batch / throughput (one iteration). ``compare(predictor, quick)`` adds ``predicted_ms``,
``ape`` (% against the measurement), ``error`` ('' when predicted) and ``label``: every row is a third-party
measurement, and an image model's prediction is an extrapolation wherever its convolutions lie outside the
release's conv records (``latency.conv_note``). Small batches are where a whole-model measurement includes host
launch gaps that a sum of kernel times does not: say so when reading the table.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from neusight_core.question.step import PAPER
from neusight_core.cost import latency
from neusight_core.studies import error_metric
from neusight_core.question.schema import Mode

PUBLISHED_FILE = Path(__file__).with_name("published.yaml")
LABEL = "third-party measurement"


def load(path: Path = PUBLISHED_FILE) -> pd.DataFrame:
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    rows = []
    for name, s in data.items():
        for r in s["rows"]:
            if "latency_ms" not in r:       # published as images per second: one iteration of the batch
                r = {**r, "latency_ms": 1000.0 * float(r["batch"]) / float(r["throughput_img_s"])}
            rows.append({"set": name, "model": s["model"], **r, "source": " ".join(s["source"].split()),
                         "settings": " ".join(s["settings"].split())})
    out = pd.DataFrame(rows)
    if "throughput_img_s" not in out:
        out["throughput_img_s"] = float("nan")
    return out


def compare(predictor="neusight", quick: bool = False, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Our prediction for every published row, under its settings (model, GPU, mode, precision, batch)."""
    t = (load() if table is None else table).copy()
    pred, err, note = [], [], []
    for r in t.itertuples(index=False):
        try:
            out = latency.predict_model(r.model, r.gpu, int(r.batch), None, r.mode, predictor=predictor,
                                        quick=quick, dtype=r.precision, **PAPER)
            pred.append(out["e2e_ms"]), err.append(""), note.append(out.get("conv_note", ""))
        except (ValueError, LookupError) as e:      # one-line input errors (unknown GPU / model, ...)
            msg = (str(e.args[0]) if e.args else str(e)).splitlines()[0]
            pred.append(float("nan")), err.append(msg), note.append("")
    t["predictor"] = predictor if isinstance(predictor, str) else predictor.name
    t["predicted_ms"] = pred
    t["ape"] = error_metric.ape(t["latency_ms"], t["predicted_ms"])
    t["error"], t["extrapolation"], t["label"] = err, note, LABEL
    return t


def panels(t: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The comparison by (GPU, mode, precision), one figure panel each: (title, rows)."""
    def where(gpu, g):
        # the board NVIDIA measured on when it is not the catalogue's (V100 SXM2 16GB vs our V100 PCIe 32GB)
        on = str(g["measured_on"].iloc[0]) if "measured_on" in g else ""
        board = on.split(",")[-1].split("(")[0].strip() if on else ""
        return f"measured on {board}, predicted as {gpu}" if board and "SXM2" in board and "SXM2" not in gpu else gpu
    return [(f"ResNet-50 {prec.upper()} {'inference' if mode == Mode.INF else 'training'}, {where(gpu, g)}", g)
            for (gpu, mode, prec), g in t.groupby(["gpu", "mode", "precision"], sort=True)]


def summary(t: pd.DataFrame, within_pct: float | None = None) -> pd.DataFrame:
    """Per predictor, GPU, mode and precision: rows, MAPE, the largest APE and how many rows are within
    ``within_pct`` % of the measurement (the image models' bar where the settings match; ``targets.yaml``, 20 %)."""
    from neusight_core.studies import targets
    within_pct = targets.section("published")["within_pct"] if within_pct is None else within_pct
    ok = t[t["error"] == ""]
    g = ok.groupby(["predictor", "gpu", "mode", "precision"], sort=False)["ape"]
    out = g.agg(rows="size", mape="mean", max_ape="max").reset_index()
    out[f"within_{within_pct:g}pct"] = g.apply(lambda a: int((a <= within_pct).sum())).to_numpy()
    return out
