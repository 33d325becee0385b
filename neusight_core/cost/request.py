"""One request to the engine (``engine.predict``): a :class:`scenario.Scenario`, validated when built. Dicts of
its fields (``INPUTS``; a configuration frame's rows, ``rows_of_frame``) become Scenarios through the adapter
``parse``, which turns a request that fails its checks into a :class:`Rejected` with its one-line error
(``message``), so that the others go on. Also the predictor runs a request is asked of (``jobs``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from neusight_core.cost.scenario import FIELDS as scenario_fields
from neusight_core.cost.scenario import scenario as make_scenario
from neusight_core.question.step import (INPUTS, MAX_SIZE, LatencyInputError, Scenario, SweepInputError,  # noqa: F401
                                one_line)


def scenario_of(r: dict) -> Scenario:
    """One request (a configuration row or a dict of ``INPUTS`` fields; NaN = not given, integers from floats)
    -> its :class:`Scenario`: each cell read by its field's kind (``step.option``; a cell that is no value of its
    field raises ``SweepInputError``), then checked by ``scenario.scenario`` (its one-line error)."""
    f = {name: None if (v := r.get(name)) is None else o.kind.cell(name, v) for name, o in scenario_fields.items()}
    if f["batch"] is None:
        raise SweepInputError(f"batch must be an integer from 1 to {MAX_SIZE:,}, got {r.get('batch')!r}")
    return make_scenario(**f)


def message(e: BaseException) -> str:
    """The one-line error of a request that could not be predicted."""
    return f"{type(e).__name__}: {one_line(str(e))}"[:300]


def rows_of_frame(frame: pd.DataFrame) -> list[dict]:
    """A configuration frame (columns ``INPUTS``; a missing column or a NaN cell is not given) as one dict per
    row, for :func:`parse`."""
    cfg = frame.reset_index(drop=True)
    return [{c: (r.get(c) if c in cfg else None) for c in INPUTS} for r in cfg.to_dict("records")]


class Rejected(NamedTuple):
    """A request that failed its checks: its fields as given and its one-line error (``message``). The engine
    answers it with an error row, so that one bad row never costs the others their answer."""
    fields: dict
    error: str


def parse(rows) -> list:
    """The adapter from dicts to the engine's requests: each dict of ``INPUTS`` fields (a configuration frame's
    rows: ``rows_of_frame``) becomes its :class:`Scenario`, or a :class:`Rejected` with the one-line error of an
    unknown field, a bad value or something that is not a dict. Scenarios and Rejected pass as they are."""
    out = []
    for r in ([rows] if isinstance(rows, (dict, Scenario, Rejected)) else rows):
        if isinstance(r, (Scenario, Rejected)):
            out.append(r)
            continue
        if not isinstance(r, dict):
            out.append(Rejected({}, message(LatencyInputError(
                f"a request is a Scenario or a dict of the fields {', '.join(INPUTS)}, not a {type(r).__name__}"))))
            continue
        given = {c: r.get(c) for c in INPUTS}
        unknown = sorted(set(r) - set(INPUTS))
        try:
            if unknown:
                raise LatencyInputError(f"unknown scenario field(s) {', '.join(unknown)}; "
                                        f"the fields are {', '.join(INPUTS)}")
            out.append(scenario_of(given))
        except Exception as e:  # noqa: BLE001 - recorded in the row
            out.append(Rejected(given, message(e)))
    return out


def requests(scenarios) -> tuple[list[dict], list[dict | None], list[str]]:
    """(each request's fields, its validated fields or None, its error or ''): ``scenarios`` is one Scenario or a
    sequence of Scenarios and Rejected (``parse``'s output). Anything else is a one-line TypeError."""
    if isinstance(scenarios, pd.DataFrame):
        raise TypeError("engine.predict takes Scenarios, not a frame: sweep.run(frame) predicts a configuration "
                        "frame (request.parse(request.rows_of_frame(frame)))")
    scenarios = [scenarios] if isinstance(scenarios, (Scenario, Rejected)) else list(scenarios)
    other = next((s for s in scenarios if not isinstance(s, (Scenario, Rejected))), None)
    if other is not None:
        raise TypeError(f"engine.predict takes Scenarios (scenario.scenario(...), or request.parse(dicts)), "
                        f"not a {type(other).__name__}")
    norm = [s.as_dict() if isinstance(s, Scenario) else None for s in scenarios]
    given = [n if n is not None else dict(s.fields) for n, s in zip(norm, scenarios)]
    return given, norm, ["" if isinstance(s, Scenario) else s.error for s in scenarios]


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
