"""NVIDIA's measured serving runs, read in place: ``aiconfigurator_core/systems/silicon_sample.csv`` of the pinned
aiconfigurator-core package (Apache-2.0; SPEC section 10): one row per benchmark run of a model on a GPU system with a
serving engine, prompt / answer lengths, concurrency and parallelism, and its measured mean TTFT and TPOT.

The split (issue of the serving model): the **development rows** are every aggregated (``agg``) run of the
Llama-3.1 family in BF16 or FP8 (``development``); the serving constants are fitted on them only. Every row of every
other model is **held out** (``held_out``: never fitted, tuned or looked at by the fit; the independent check reads
them). FP4 runs are outside both (no FP4 precision here), and so are disaggregated runs (prefill and decode on
separate instances: not this model).

Columns of the returned frames, in our vocabulary: ``id``, ``model`` (our config name), ``device`` (the catalogue's
name), ``engine``, ``engine_version``, ``dtype`` (bf16 / fp8), ``quant`` (the file's GEMM quantisation: ``bf16``,
``fp8`` per tensor or ``fp8_block``), ``tp``, ``isl``, ``osl``, ``concurrency``, ``ttft_ms``, ``tpot_ms``.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from neusight_core.data import measured_kernels
from neusight_core.question.schema import Precision

SERVING_FILE = "silicon_sample.csv"
#: the Hugging Face models of the development rows -> our configs (model_configs/: the same dimensions)
DEVELOPMENT_MODELS = {"meta-llama/Llama-3.1-8B-Instruct": "llama3_8b", "nvidia/Llama-3.1-8B-Instruct-FP8": "llama3_8b",
                      "meta-llama/Llama-3.1-70B": "llama3_70b"}
#: the held-out models we have a config for (the others are mixture-of-experts or latent-attention models without one
#: here: their rows are counted, not answered)
HELD_OUT_MODELS = {"Qwen/Qwen3-32B": "qwen3_32b"}
#: the file's GEMM quantisation -> our precision (no quantisation: BF16)
QUANT_PRECISION = {Precision.BF16.value: Precision.BF16, Precision.FP8.value: Precision.FP8, "fp8_block": Precision.FP8}
SERVING_COLUMNS = ["id", "model", "device", "engine", "engine_version", "dtype", "quant", "tp", "isl", "osl", "concurrency",
           "ttft_ms", "tpot_ms"]


class ServingDataError(RuntimeError):
    """The measured serving runs cannot be read: one line."""


def path(root: str | Path | None = None) -> Path:
    """The file, beside the package's ``systems/data`` folder (``root``: a folder holding ``SERVING_FILE``)."""
    p = Path(root) / SERVING_FILE if root is not None else measured_kernels.data_root().parent / SERVING_FILE
    if not p.is_file():
        raise ServingDataError(f"{p}: the measured serving runs are missing (reinstall aiconfigurator-core "
                               f"{measured_kernels.PINNED_VERSION}: pip install -r requirements.txt)")
    return p


def _read(root=None) -> pd.DataFrame:
    d = pd.read_csv(path(root))
    d = d[d["mode"] == "agg"]
    quant = d["gemm_quant_mode"].fillna(Precision.BF16.value)
    return d.assign(quant=quant)[quant.isin(list(QUANT_PRECISION))]


def _ours(d: pd.DataFrame, models: dict) -> pd.DataFrame:
    dev = d["system"].map(measured_kernels.CATALOGUE)
    out = pd.DataFrame({"id": d["id"], "model": d["model_path"].map(models).fillna(d["model_path"]), "device": dev,
                        "engine": d["backend"], "engine_version": d["backend_version"].fillna("").astype(str),
                        "dtype": d["quant"].map(QUANT_PRECISION), "quant": d["quant"], "tp": d["tp_size"].astype(int),
                        "isl": d["isl"].astype(int), "osl": d["osl"].astype(int),
                        "concurrency": d["batch_size"].astype(int), "ttft_ms": d["silicon_ttft_ms"].astype(float),
                        "tpot_ms": d["silicon_tpot_ms"].astype(float)})
    return out[dev.notna().to_numpy()].reset_index(drop=True)[SERVING_COLUMNS]


def development(root=None) -> pd.DataFrame:
    """The development rows: aggregated BF16 and FP8 runs of the Llama-3.1 family (about 550)."""
    d = _read(root)
    return _ours(d[d["model_path"].isin(list(DEVELOPMENT_MODELS))], DEVELOPMENT_MODELS)


def held_out(root=None) -> pd.DataFrame:
    """Every other model's aggregated BF16 and FP8 runs on the catalogue's GPUs: for the independent check only."""
    d = _read(root)
    return _ours(d[~d["model_path"].isin(list(DEVELOPMENT_MODELS))], HELD_OUT_MODELS)
