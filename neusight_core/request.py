"""One request to the engine (``engine.predict``): the fields a question has (``INPUTS``), each checked and
normalised the same way whether it comes as a :class:`scenario.Scenario` or a dict (``normalise``, ``requests``;
a configuration frame's rows become dicts in the sweep, ``rows_of_frame``), and the kernel table it needs (``table_key``); the predictor runs it is asked of
(``jobs``). A request that fails gets its one-line error (``message``) and the others go on.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from neusight_core.scenario import LatencyInputError, Scenario
from neusight_core.scenario import scenario as make_scenario
from neusight_core.scenario import tracer_size
from neusight_core.schema import Precision

INPUTS = ["model", "device", "batch", "seq", "image_size", "mode", "fusion", "parallel", "gpus", "micro_batches",
          "link_gbs", "past", "dtype", "attention", "execution"]


class SweepInputError(ValueError):
    """A cell of a configuration frame that is not a value of its field (a non-integer batch, ...)."""


#: No size of a request is larger (2^40 tokens, sequences or GPUs): beyond it a number is a typo, and numpy's
#: 64-bit integers would overflow on the products of sizes the tracer and the memory model take
MAX_SIZE = 2 ** 40


def _int(v, what, minimum=1):
    bad = SweepInputError(f"{what} must be an integer from {minimum} to {MAX_SIZE:,}, got {v!r}")
    if isinstance(v, bool) or v is None or (isinstance(v, float) and (not math.isfinite(v) or v != int(v))):
        raise bad
    try:
        iv = int(v)
    except (TypeError, ValueError, OverflowError):
        raise bad from None
    if not minimum <= iv <= MAX_SIZE:
        raise bad
    return iv


def _given(v):
    """None for a missing value of a configuration frame (None, NaN, pandas' NA), else the value."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA else v


def _row_of(sc: Scenario, r: dict | None = None) -> dict:
    """A validated scenario as the frame's fields (over the request ``r`` as given)."""
    out = dict(r or {})
    out.update(sc.as_dict())
    return out


def normalise(r: dict) -> dict:
    """One request (a configuration row or a dict of ``INPUTS`` fields; NaN = not given, integers from floats)
    -> its validated fields, checked by ``scenario.scenario`` exactly as ``predict`` checks a request."""
    def opt_int(key, what, minimum=1):
        v = _given(r.get(key))
        return None if v is None else _int(v, what, minimum)

    plan = _given(r.get("parallel"))
    plan = None if plan in ("", "none") else plan
    dt = _given(r.get("dtype"))
    fusion = _given(r.get("fusion"))
    if isinstance(fusion, str):       # "False" is a word, not a truthy value
        if fusion.strip().lower() not in ("true", "false", "1", "0", ""):
            raise SweepInputError(f"fusion must be true or false, got {fusion!r}")
        fusion = fusion.strip().lower() in ("true", "1")
    link = _given(r.get("link_gbs"))
    sc = make_scenario(
        r.get("model"), str(r.get("device")), _int(r.get("batch"), "batch"), opt_int("seq", "seq"),
        _given(r.get("mode")) or "inf", image_size=opt_int("image_size", "image_size"),
        past=opt_int("past", "past", 0) or 0, dtype=dt if dt not in (None, "") else Precision.FP32, fusion=bool(fusion),
        parallel=plan, gpus=opt_int("gpus", "gpus"), micro_batches=opt_int("micro_batches", "micro_batches") or 1,
        link_gbs=None if link is None else float(link), attention=_given(r.get("attention")) or None,
        execution=_given(r.get("execution")) or None)
    return _row_of(sc, r)


def message(e: BaseException) -> str:
    """The one-line error of a request that could not be predicted."""
    s = str(e).strip()
    return f"{type(e).__name__}: {s.splitlines()[0] if s else ''}"[:300]


def table_key(r: dict) -> tuple:
    return (str(r["model"]), r["batch"], tracer_size(r), r["mode"], r["past"], r["fusion"], r["parallel"],
            r["gpus"] if r["parallel"] else 1, r["micro_batches"] if r["parallel"] == "pp" else 1, r["dtype"],
            r.get("attention") or "eager")


def rows_of_frame(frame: pd.DataFrame) -> list[dict]:
    """A configuration frame (columns ``INPUTS``; a missing column or a NaN cell is not given) as the engine's
    requests, one dict per row. The engine itself takes scenarios and dicts only: this is the sweep's adapter."""
    cfg = frame.reset_index(drop=True)
    return [{c: (r.get(c) if c in cfg else None) for c in INPUTS} for r in cfg.to_dict("records")]


def requests(scenarios) -> tuple[list[dict], list[dict | None], list[str]]:
    """(the requests as given, their validated fields or None, the error of each or ''): ``scenarios`` is one
    Scenario or dict, or a sequence of them."""
    if isinstance(scenarios, pd.DataFrame):
        raise TypeError("engine.predict takes Scenarios or dicts of their fields, not a frame: "
                        "sweep.run(frame) predicts a configuration frame (request.rows_of_frame)")
    scenarios = [scenarios] if isinstance(scenarios, (Scenario, dict)) else list(scenarios)
    given = [_row_of(s) if isinstance(s, Scenario) else {c: s.get(c) for c in INPUTS} if isinstance(s, dict)
             else {"_not_a_request": type(s).__name__} for s in scenarios]
    for g, s in zip(given, scenarios):
        if isinstance(s, dict) and set(s) - set(INPUTS):
            g["_unknown"] = sorted(set(s) - set(INPUTS))
    norm: list[dict | None] = [None] * len(given)
    err = [""] * len(given)
    for i, (r, s) in enumerate(zip(given, scenarios)):
        try:
            if "_not_a_request" in r:
                raise LatencyInputError(f"a request is a Scenario or a dict of the fields {', '.join(INPUTS)}, "
                                        f"not a {r.pop('_not_a_request')}")
            if "_unknown" in r:
                raise LatencyInputError(f"unknown scenario field(s) {', '.join(r.pop('_unknown'))}; "
                                        f"the fields are {', '.join(INPUTS)}")
            norm[i] = _row_of(s) if isinstance(s, Scenario) else normalise(r)   # a Scenario is validated already
        except Exception as e:  # noqa: BLE001 - recorded in the row
            err[i] = message(e)
    return given, norm, err


class Job(NamedTuple):
    """One predictor run over the pool: a registered ``predictor`` name with its ``seed`` (trained weights from
    ``predictors.get``), or a trained object ``obj`` (its label as ``predictor``, its own seed)."""
    predictor: str
    seed: int
    obj: object = None


def jobs(predictors, seeds=(0,)) -> list[Job]:
    """The jobs of ``predict``'s ``predictors`` and ``seeds``: a name runs once per seed; a trained object, or a
    (label, object) pair (the ablation's variants), runs once with its own seed."""
    one = (isinstance(predictors, str) or hasattr(predictors, "predict")
           or (isinstance(predictors, tuple) and len(predictors) == 2 and hasattr(predictors[1], "predict")))
    predictors = [predictors] if one else list(predictors)     # one name, object or (label, object) pair
    seeds = [int(seeds)] if isinstance(seeds, (int, np.integer)) else [int(s) for s in seeds]
    out = []
    for p in predictors:
        if isinstance(p, str):
            out += [Job(p, seed) for seed in seeds]
        elif isinstance(p, tuple):
            out.append(Job(p[0], int(getattr(p[1], "seed", 0)), p[1]))
        else:
            out.append(Job(p.name, int(getattr(p, "seed", 0)), p))
    return out
