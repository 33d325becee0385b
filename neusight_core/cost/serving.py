"""Serving answers: time to first token (TTFT), time per output token (TPOT) and throughput of ``concurrency``
requests in flight on one serving instance, built from the engine's step predictions (docs/serving.md).

    from neusight_core.cost import serving
    q = serving.question("llama3_8b", "H100", tp=1, isl=1024, osl=128, concurrency=32, engine="trtllm")
    serving.predict([q])          # one row per question: ttft_ms, tpot_ms, tokens_per_s_per_gpu, ...

Two steps answer a question, both asked of ``engine.predict`` (graph execution, fused attention and element-wise
kernels, a paged KV cache, tensor parallelism over ``tp`` GPUs):

- ``t_dec``: one decode step of ``concurrency`` sequences whose caches hold ISL + OSL / 2 tokens (the middle of an
  answer: the mean cache over a request's decode);
- ``t_pre``: the prefill of one prompt of ISL tokens.

The steady state of continuous batching with C clients (each sends its next request when its answer is in): every
decode iteration advances each request in flight by one token, and the prompts of new requests are prefilled between
or within those iterations. Per completed request the GPU does one prefill and OSL - 1 decode iterations, and C
requests complete per request lifetime, so each request's OSL - 1 iterations also carry about C prefills:

    TPOT = step_scale x (t_dec - comm) + comm_scale x comm + prefill_share x C x t_pre / (OSL - 1)
    TTFT = t_pre x (ttft_base + ttft_per_request x (C - 1))
    E2E  = TTFT + (OSL - 1) x TPOT;  requests/s = C / E2E;  tokens/s per GPU = C x OSL / E2E / tp

``prefill_share`` = 1 when arrivals are spread evenly (each prefill costs its full time inside someone's decode);
1/2 when all C arrive together (half of a wave's prefills precede a request's first token). ``step_scale`` absorbs
what the traced step does not hold (a serving engine's own kernels and scheduling); ``comm_scale`` the engines' own
all-reduce (vLLM's and SGLang's custom all-reduce, TensorRT-LLM's all-reduce plugin: one-shot kernels over NVLink for
small messages) against NCCL's measured cost that the step's ``comm`` (its exposed all-reduces) is timed with. The five
constants per engine are
fitted on that engine's development rows only (``studies/serving_eval.py``) and kept with their provenance in
``serving_constants.yaml``; an engine without rows takes another's, and says so.

KV-cache capacity: what remains of ``MEMORY_FRACTION`` of each GPU's memory after the weights and the step's
activations, in tokens of this model; ``max_concurrency`` = capacity / (ISL + OSL). A concurrency above it is
answered and marked ``kv_limited``: requests beyond the cache queue for a free slot, which this model does not time
(its TTFT is then a lower bound).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from neusight_core.cost import error_model
from neusight_core.data import configs

from neusight_core.question.schema import Attention, Execution, KVCache, Plan, Precision, ServingEngine
from neusight_core.question.serving import SERVE_INPUTS, ServeQuestion
from neusight_core.question.step import LatencyInputError, not_given, options, plain_defaults

CONSTANTS_FILE = Path(__file__).with_name("serving_constants.yaml")

#: the share of each GPU's memory a serving engine takes for weights, activations and its KV cache: vLLM's
#: ``gpu_memory_utilization`` default 0.9, TensorRT-LLM's ``free_gpu_memory_fraction`` default 0.9 (of what the
#: weights leave; a rounding here), SGLang's ``mem_fraction_static`` 0.8-0.9 by GPU size (their docs, 2025)
MEMORY_FRACTION = 0.9
#: precisions a serving engine runs a model in; fp32 / tf32 are training precisions no engine serves in
SERVING_PRECISIONS = (Precision.BF16, Precision.FP16, Precision.FP8)

SERVE_FIELDS = options(ServeQuestion)

#: the answer's columns (``predict``), after the question's
ANSWER = ["ttft_ms", "ttft_lo_ms", "ttft_hi_ms", "tpot_ms", "tpot_lo_ms", "tpot_hi_ms", "e2e_ms", "requests_per_s", "tokens_per_s", "tokens_per_s_per_gpu",
          "decode_step_ms", "prefill_ms", "kv_capacity_tokens", "max_concurrency", "kv_limited", "fits",
          "constants_of", "note", "error"]


@dataclass(frozen=True)
class EngineConstants:
    """The fitted constants of one serving engine (the module docstring's formulas) and where they came from."""
    step_scale: float
    prefill_share: float
    ttft_base: float
    ttft_per_request: float
    comm_scale: float = 1.0       # the decode step's all-reduces against NCCL's measured cost (engines' own all-reduce)
    tpot_sigma: float = 0.0       # spread (log) of the measured TPOT around the model, each group of rows held out
    ttft_sigma: float = 0.0       # the same for TTFT
    tpot_sigma_outside: float = 0.0   # the spread with every run of a model on a GPU held out: for an answer whose
    ttft_sigma_outside: float = 0.0   # model, GPU or precision the rows do not hold (``outside_rows``), or another engine's
    rows: int = 0                 # development rows they were fitted on
    source: str = ""              # which rows, with which predictor and weights
    covers: tuple = ()            # the (model, GPU, precision) of those rows, as "model / GPU / precision"


def outside_rows(q: ServeQuestion, c: EngineConstants) -> list[str]:
    """What of ``q`` its engine's development rows do not hold (its model, GPU, precision), each a word; empty where
    they hold a run of the same model, GPU and precision, or where the constants say nothing of their rows."""
    if not c.covers:
        return []
    seen = [tuple(x.split(" / ")) for x in c.covers]
    out = []
    for i, (what, v) in enumerate((("model", str(q.model)), ("GPU", q.device), ("precision", str(q.dtype)))):
        if v not in {t[i] for t in seen}:
            out.append(f"{what} {v}")
    if not out and (str(q.model), q.device, str(q.dtype)) not in seen:
        out.append("this model, GPU and precision together")
    return out


@functools.lru_cache(maxsize=None)
def saved_constants(path: str) -> dict:
    raw = yaml.safe_load(Path(path).read_text()) or {}
    return {ServingEngine(k): EngineConstants(**{f.name: tuple(v[f.name]) if f.name == "covers" else v[f.name]
                                                 for f in dataclasses.fields(EngineConstants) if f.name in v})
            for k, v in (raw.get("engines") or {}).items()}


def constants(engine, path: Path | None = None) -> tuple[EngineConstants, ServingEngine]:
    """The constants ``engine`` is answered with and the engine they were fitted for: its own, or, for an engine
    without development rows, the engine fitted on the most rows (an extrapolation the answer names)."""
    saved = saved_constants(str(path or CONSTANTS_FILE))
    if not saved:
        raise LatencyInputError(f"no serving constants in {path or CONSTANTS_FILE}: fit them with "
                                "`python -m neusight_core.studies.serving_eval --fit`")
    engine = ServingEngine(engine)
    if engine in saved:
        return saved[engine], engine
    other = max(saved, key=lambda e: saved[e].rows)
    return saved[other], other


# ------------------------------------------------------------------------------ the question
def question(model, device, **given) -> ServeQuestion:
    """Validate a serving question (the keywords are ``ServeQuestion``'s fields; a field not given takes its default)
    and return it; one-line ``LatencyInputError`` for what no serving run could be. The checks of the steps it is
    answered with (the model, the GPU, tensor parallelism over the heads) are the step question's, made when its
    scenarios are built (``step_scenarios``)."""
    unknown = sorted(set(given) - set(SERVE_INPUTS))
    if unknown:
        raise LatencyInputError(f"unknown option(s) {', '.join(unknown)}; the options are {', '.join(SERVE_INPUTS)}")
    from neusight_core.cost import scenario
    f = {name: None for name in SERVE_INPUTS}
    f.update({k: None if not_given(v) else v for k, v in given.items()}, model=model, device=device)
    f.update({name: default for name, default in plain_defaults(ServeQuestion).items() if f[name] is None})
    f = scenario.check_fields(f, SERVE_FIELDS)       # each field by its own check, as a step question's
    if f["dtype"] not in SERVING_PRECISIONS:
        raise LatencyInputError(f"serving runs in {', '.join(SERVING_PRECISIONS)}, not {f['dtype']}: a serving "
                                "engine does not serve FP32 or TF32 weights")
    cfg = scenario.config_of(f["model"])
    maxpos = configs.max_positions(cfg)
    if maxpos is not None and f["isl"] + f["osl"] > maxpos:
        raise LatencyInputError(f"ISL + OSL = {f['isl'] + f['osl']:,} tokens exceed the model's {maxpos:,} positions")
    f["device"] = scenario.device_of(f["device"]).name
    return ServeQuestion(**f)


def step_scenarios(q: ServeQuestion) -> tuple:
    """The two step questions a serving question is answered with (the module docstring): the decode step of
    ``concurrency`` sequences at ISL + OSL / 2 cached tokens, and one prompt's prefill."""
    from neusight_core.cost import scenario
    common = dict(dtype=q.dtype, execution=Execution.GRAPH, attention=Attention.SDPA, fusion=True)
    if q.tp > 1:
        common.update(parallel=Plan.TP, gpus=q.tp)
    decode = scenario.scenario(q.model, q.device, q.concurrency, seq=1, past=q.isl + q.osl // 2,
                               kv_cache=KVCache.PAGED, **common)
    prefill = scenario.scenario(q.model, q.device, 1, seq=q.isl, **common)
    return decode, prefill


# ------------------------------------------------------------------------------ the answer
def answer(q: ServeQuestion, t_dec: float, t_pre: float, c: EngineConstants, comm_dec: float = 0.0,
           outside: bool | None = None) -> dict:
    """TTFT, TPOT, the request's end-to-end time and the throughputs of ``q`` from its two step times (ms), the decode
    step's exposed communication (ms, part of ``t_dec``) and its engine's constants (the module docstring's formulas).

    TTFT's and TPOT's intervals at ``q.coverage`` are symmetric in log: the normal quantile times the spread of the
    engine's development rows around the model, each group of them (a model on a GPU at a TP) predicted by constants
    fitted without it (``serving_eval.fit``). ``outside`` (default: ``outside_rows`` says so): the question is not
    one of the rows' model / GPU / precision, or is answered with another engine's constants, and takes the spread
    measured with every run of a model on a GPU held out, where that is the wider."""
    if outside is None:
        outside = bool(outside_rows(q, c))
    s_tpot, s_ttft = ((max(c.tpot_sigma, c.tpot_sigma_outside), max(c.ttft_sigma, c.ttft_sigma_outside)) if outside
                      else (c.tpot_sigma, c.ttft_sigma))
    C, osl = q.concurrency, q.osl
    tpot = c.step_scale * (t_dec - comm_dec) + c.comm_scale * comm_dec + c.prefill_share * C * t_pre / (osl - 1)
    ttft = t_pre * (c.ttft_base + c.ttft_per_request * (C - 1))
    e2e = ttft + (osl - 1) * tpot
    z = error_model.normal_quantile(0.5 + q.coverage / 2)
    return {"ttft_ms": ttft, "ttft_lo_ms": ttft * math.exp(-z * s_ttft), "ttft_hi_ms": ttft * math.exp(z * s_ttft),
            "tpot_ms": tpot, "tpot_lo_ms": tpot * math.exp(-z * s_tpot), "tpot_hi_ms": tpot * math.exp(z * s_tpot),
            "e2e_ms": e2e, "requests_per_s": 1e3 * C / e2e,
            "tokens_per_s": 1e3 * C * osl / e2e, "tokens_per_s_per_gpu": 1e3 * C * osl / e2e / q.tp}


def kv_capacity(q: ServeQuestion, decode_row: pd.Series, mem_gib: float) -> tuple[int, int]:
    """(KV-cache capacity in tokens, the largest concurrency whose requests' ISL + OSL tokens fit in it) on each
    GPU: ``MEMORY_FRACTION`` of its memory less the weights and the step's peak activations, over the cache's bytes
    per token (the decode step's cache holds ``concurrency`` x its ``past`` tokens)."""
    tokens_in_step = q.concurrency * (q.isl + q.osl // 2)
    per_token = decode_row["memory_kv_cache_gib"] / tokens_in_step
    free = MEMORY_FRACTION * mem_gib - decode_row["memory_weights_gib"] - decode_row["memory_activations_gib"]
    if not (per_token > 0) or not math.isfinite(free):
        return 0, 0
    capacity = max(0, int(free / per_token))
    return capacity, capacity // (q.isl + q.osl)


def step_times(questions, predictor="neusight", quick: bool | None = None, seed: int = 0, *,
               progress: bool = False) -> tuple[list, pd.DataFrame]:
    """The two step predictions of each question (``step_scenarios``), all in one engine call (tables shared between
    questions of one model): (the questions, each a ``ServeQuestion`` or the dict it could not be made of, and a
    frame with one row per question: ``t_dec``, ``t_pre`` (ms), the decode step's memory columns and ``error``, the
    question's one-line error or its steps')."""
    from neusight_core.cost import engine
    from neusight_core.cost.request import message
    qs, errors, scs = [], [], []
    for x in questions:
        try:
            q = x if isinstance(x, ServeQuestion) else question(**x)
            scs.extend(step_scenarios(q))
            qs.append(q)
            errors.append("")
        except Exception as e:  # noqa: BLE001 - one bad question never costs the others their answer
            qs.append(x)
            errors.append(message(e))
    steps = (engine.predict(scs, [predictor], seeds=[seed], quick=quick, progress=progress) if scs
             else pd.DataFrame())
    memory_cols = ["memory_weights_gib", "memory_activations_gib", "memory_kv_cache_gib", "memory_fits"]
    rows, j = [], 0
    for err in errors:
        row = {"t_dec": np.nan, "t_pre": np.nan, "comm_dec": np.nan, **dict.fromkeys(memory_cols, np.nan), "error": err}
        if not err:
            dec, pre = steps.iloc[j], steps.iloc[j + 1]
            j += 2
            row.update(t_dec=float(dec["e2e_ms"]), t_pre=float(pre["e2e_ms"]), comm_dec=float(dec["comm_exposed_ms"]),
                       error=dec["error"] or pre["error"], **{c: dec[c] for c in memory_cols})
        rows.append(row)
    return qs, pd.DataFrame(rows, columns=SERVING_STEP_COLUMNS + memory_cols + ["error"])


#: what ``step_times`` gives per question besides the memory: the decode step, the prefill, the decode step's exposed
#: communication (ms)
SERVING_STEP_COLUMNS = ["t_dec", "t_pre", "comm_dec"]


def predict(questions, predictor="neusight", quick: bool | None = None, seed: int = 0, *, progress: bool = False,
            constants_file: Path | None = None) -> pd.DataFrame:
    """Answer serving questions (``ServeQuestion`` objects or dicts of its fields): one row per question, its fields
    then ``ANSWER``. A question that fails its checks gets its one-line ``error`` and the others their answers."""
    from neusight_core.data import devices
    qs, steps = step_times(questions, predictor, quick, seed, progress=progress)
    rows = []
    for q, (_, st) in zip(qs, steps.iterrows()):
        fields = q.as_dict() if isinstance(q, ServeQuestion) else {k: q.get(k) for k in SERVE_INPUTS}
        row = dict(fields, **{k: np.nan for k in ANSWER})
        row.update(error=st["error"], note="", constants_of="")
        if not st["error"]:
            c, fitted_for = constants(q.engine, constants_file)
            row.update(answer(q, st["t_dec"], st["t_pre"], c, st["comm_dec"],
                              outside=fitted_for != q.engine or bool(outside_rows(q, c))))
            cap, most = kv_capacity(q, st, devices.get_device(q.device).mem_gb)
            fits = most >= 1         # the step of all C may not fit (above max_concurrency): the engine queues
            row.update(decode_step_ms=st["t_dec"], prefill_ms=st["t_pre"], kv_capacity_tokens=cap,
                       max_concurrency=most, fits=fits, kv_limited=fits and q.concurrency > most,
                       constants_of=str(fitted_for))
            notes = []
            wider = "; its interval is the spread of a model on a GPU the fit never saw"
            if fitted_for != q.engine:
                notes.append(f"{q.engine} has no development rows: answered with {fitted_for}'s constants "
                             f"(an extrapolation){wider}")
            elif outside := outside_rows(q, c):
                notes.append(f"an extrapolation: {q.engine}'s constants were fitted on runs without its "
                             f"{', '.join(outside)} (docs/serving.md){wider}")
            if not fits:
                notes.append(f"does not fit: the weights leave no KV cache for one request of {q.isl + q.osl:,} "
                             f"tokens on {q.tp} x {q.device}")
            elif row["kv_limited"]:
                notes.append(f"the KV cache holds {most} such requests, fewer than {q.concurrency}: the others "
                             "queue for a slot, which is not timed (TTFT is a lower bound)")
            row["note"] = "; ".join(notes)
        rows.append(row)
    return pd.DataFrame(rows, columns=SERVE_INPUTS + ANSWER)
