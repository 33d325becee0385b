"""Model latency: from a kernel table and a device to forward / backward / end-to-end time.

Pipeline: ``trace.trace_model`` -> (``fusion.fuse``) -> (``parallel.apply_plan``) -> a predictor's
per-launch latency for every row -> ``network.NetworkModel`` for the COMM rows -> the sums below.

Aggregation (SPEC 3.3: kernels of one GPU run one after another):
- ``fw_ms`` / ``bw_ms`` / ``acc_ms``: sum over rows of that phase of ``pred_ms`` (= per-launch time x
  ``count``), compute only.
- ``comm_ms``: time of all COMM rows. Rows marked ``overlap`` (DP gradient all-reduce) run under the
  backward pass, so only the part longer than backward + accumulation is exposed:
  ``exposed = max(0, overlapped_comm - (bw_ms + acc_ms)) + other_comm``.
- single GPU, DP, TP: ``e2e_ms = fw_ms + bw_ms + acc_ms + exposed comm``.
- PP: the kernel table holds one micro-batch with a ``stage`` per row. With stage times T_s
  (compute + its send/recv) and m micro-batches, a GPipe-style schedule takes
  ``sum_s T_s + (m - 1) x max_s T_s``; with m = 1 (the paper's ``pp4_1`` labels) this is the plain
  sum, i.e. the stages wait for each other.

The result is a dict (see :func:`predict_model`) whose ``kernels`` frame carries ``pred_ms`` so that
any number can be traced back to the kernels that make it up.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core.cost import error_model, network
from neusight_core.question import schema
# the tables' pieces and the request's error, named here too: their callers (whatif, live, the CLI, the tests)
# read them as latency.*
from neusight_core.cost.tables import aggregate, loaded_predictor, predict_kernels, trace
from neusight_core.cost.scenario import LatencyInputError, device_of, scenario
from neusight_core.question.schema import OpClass, Plan, Precision

__all__ = ["LatencyInputError", "aggregate", "conv_by_roofline", "conv_note", "loaded_predictor", "moe_note", "predict_kernels",
           "predict_model", "predict_scenario", "trace"]


def predict_model(model, device, batch: int, seq: int | None = None, mode: str | None = None, predictor="neusight",
                  *, quick: bool | None = None, efficiency: float = network.DEFAULT_EFFICIENCY, optimizer: str = "adamw",
                  master_weights: bool = True, **options) -> dict:
    """Predict one configuration: a text model at ``seq`` tokens, or an image model at ``image_size`` pixels a side
    (default 224; ``seq`` for an image model, or ``image_size`` for a text one, is refused, as on the CLI).

    The question's keywords (``options``) are the fields of ``step.Scenario``, each with its help and defaults
    there: ``image_size``, ``fusion``, ``parallel`` (dp/tp/pp/ep: ``batch`` is the global batch), ``gpus``,
    ``micro_batches``, ``link_gbs`` (default the device's catalogue link), ``past`` (> 0: ``seq`` new tokens on a KV
    cache of ``past`` tokens; ``seq=1``: one decode step), ``dtype`` (fp32 = the paper; others extrapolate),
    ``attention``, ``execution``, ``grads``, ``comm``; a field not given takes the user's default (the paper's
    setting is ``step.PAPER``). ``model``: a config name known to ``trace.load_config`` or a path; ``device``:
    anything ``devices.get_device`` accepts or a Device; ``predictor``: a name in ``predictors.names()`` or a
    fitted KernelPredictor. ``quick``: None (default) answers as the CLI does, with the full weights when they
    are trained (or train in seconds) and else with the quick ones and a warning, so that a question never starts
    half an hour of training unasked; False: the full weights, trained first if missing; True: the quick ones.
    ``optimizer`` / ``master_weights``: the training state counted in ``memory`` (``memory.footprint``).

    Returns ``e2e_ms`` (the step as executed: with eager execution at least the host's launch time, host.py),
    ``kernel_ms`` (the kernel sum), ``host_ms``, ``host_bound``, ``fw_ms``, ``bw_ms``, ``acc_ms``, ``comm_ms``, ``comm_exposed_ms``,
    ``breakdown`` (ms per op class), ``stage_ms`` (PP only), ``trace_s`` and ``predict_s`` (wall
    times), ``memory`` (per-GPU footprint and ``fits`` / ``verdict``, ``memory.footprint``), ``dtype``,
    ``dtype_note`` ("" or the sentence of ``Device.precision_note``: this GPU has no tensor cores for
    ``dtype``, its GEMMs use the FP32 peak), ``measured_share`` (bf16 / fp16 only, else {}: per op class the share
    of its time answered by models trained on measured kernels of that precision, ``KernelPredictor.measured_rows``;
    the rest is an extrapolation), ``law_share`` (the same for the rows a law fitted on measured kernels of that
    precision answers, ``KernelPredictor.law_rows``: an extrapolation too, from one kind of kernel), ``range_note``
    ("" or, where measured-kernel models answered, the sentence of ``range_note``: this GPU's figures lie
    outside those of the GPUs they were trained on), ``moe_note`` ("" or the sentence of ``moe_note``: how the
    experts' grouped GEMMs of a mixture-of-experts model are predicted) and ``kernels`` (the table with ``pred_ms``).
    """
    sc = scenario(model, device, batch, seq, mode, **options)
    return predict_scenario(sc, predictor, quick=quick, efficiency=efficiency, optimizer=optimizer,
                            master_weights=master_weights)


def _signature_with_options(fn):
    """``fn``'s signature with the question's fields as keywords (``help(predict_model)`` and editors show them)."""
    import inspect
    from neusight_core.question.step import INPUTS
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    have = {p.name for p in params}
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None) for name in INPUTS
               if name not in have]
    fn.__signature__ = sig.replace(parameters=params)
    return fn


predict_model = _signature_with_options(predict_model)


def predict_scenario(sc, predictor="neusight", quick: bool | None = None,
                     efficiency: float = network.DEFAULT_EFFICIENCY, optimizer: str = "adamw",
                     master_weights: bool = True, seed: int = 0) -> dict:
    """``predict_model`` of a validated :class:`scenario.Scenario` (the CLI builds one, so a request is
    checked once); same result. One scenario through ``engine.predict`` with its kernel table kept."""
    from neusight_core.cost import engine
    quick = _weights(predictor, quick, int(seed))
    dev = device_of(sc.device)
    frame = engine.predict([sc], [predictor], seeds=(int(seed),), quick=quick, efficiency=efficiency, optimizer=optimizer,
                           master_weights=master_weights, keep_kernels=True, raise_errors=True)
    run = engine.run_info(frame)
    kernels = run.kernels[0]
    out = aggregate(kernels, sc.micro_batches if sc.parallel == Plan.PP else 1)
    row = frame.iloc[0]
    out.update(kernel_ms=out["e2e_ms"], e2e_ms=float(row["e2e_ms"]), host_ms=float(row["host_ms"]),
               host_bound=bool(row["host_bound"]), launches=int(row["kernels"]), attention=sc.attention,
               execution=sc.execution, grads=sc.grads, comm=sc.comm)
    from neusight_core import predictors as _pred
    pred = loaded_predictor(predictor, quick, int(seed)) if isinstance(predictor, str) else predictor
    # which weights answered, as the CLI's --json says it
    out["weights"] = _pred.describe(pred, quick)
    out.update(trace_s=run.tables_s, predict_s=run.predict_s, kernels=kernels,
               device=dev.name, predictor=predictor if isinstance(predictor, str) else predictor.name,
               dtype=sc.dtype, dtype_note=dev.precision_note(sc.dtype), memory=run.memory[0],
               conv_note=conv_note(kernels, predictor, quick), measured_share=measured_share(kernels, pred, sc.dtype),
               law_share=measured_share(kernels, pred, sc.dtype, rows=pred.law_rows))
    out["range_note"] = range_note(dev) if any(out["measured_share"].values()) else ""
    out["moe_note"] = moe_note(kernels)
    # the interval (cost/error_model.py): [lo, hi] at the request's coverage and its two largest contributors
    lo, hi = float(row["lo_ms"]), float(row["hi_ms"])
    calibrated = np.isfinite(lo) and np.isfinite(hi)
    out.update(coverage=sc.coverage, interval_ms=[lo, hi] if calibrated else None,
               interval_by=row["interval_by"] if calibrated else "", sigma=float(row["sigma"]) if calibrated else None,
               interval_note="" if calibrated else error_model.missing_note(out["predictor"], int(seed), bool(quick),
                                                                                 pred.calibrated))
    return out


def range_note(device) -> str:
    """"" when ``device``'s figures (``tensor_core.RANGE_FIGURES``) lie within those of the BF16 networks' training GPUs
    (``measured_kernels.split``), else one sentence naming the figures outside: its GEMM and attention times are then
    an extrapolation beyond every GPU the networks saw."""
    from neusight_core.cost import error_model
    from neusight_core.data import devices
    dev = devices.get_device(device)
    out = error_model.outside_figures(dev.name)
    if not out:
        return ""
    return (f"{dev.name} lies outside the GPUs the BF16 networks were trained on: {'; '.join(out)}; its GEMM and "
            "attention times extrapolate beyond them (notebook 07 scores two GPUs outside them, B200 and GB200)")


def moe_note(kernels: pd.DataFrame) -> str:
    """"" or the sentence that says how the grouped GEMMs of mixture-of-experts layers are predicted, with their
    share of the predicted time: balanced routing, dense GEMMs over the stacked tokens; an extrapolation."""
    grouped = (kernels["sub_op"] == schema.GROUPED_GEMM).to_numpy() if "sub_op" in kernels else None
    if grouped is None or not grouped.any():
        return ""
    pred_ms = kernels["pred_ms"].to_numpy(float)
    share = float(pred_ms[grouped].sum() / max(pred_ms.sum(), 1e-30))
    return (f"the experts of its mixture-of-experts layers run as grouped GEMMs ({int(grouped.sum())} rows, "
            f"{'under 1%' if share < 0.01 else f'{share:.0%}'} of the kernels' predicted time), taken as balanced routing and "
            "predicted as dense GEMMs over the stacked tokens: an extrapolation, checked against NVIDIA's measured MoE "
            "layers in docs/recipes.md, \"Mixture of experts\"")


def measured_share(kernels: pd.DataFrame, pred, dtype: str, rows=None) -> dict:
    """{op class: share (0-1) of its predicted time answered by models trained on measured kernels of ``dtype``}
    for a bf16 / fp16 table (``KernelPredictor.measured_rows``, or the ``rows`` method given, e.g. ``law_rows``);
    {} for the other precisions."""
    if dtype not in schema.HALF_ACTIVATIONS or kernels.empty:
        return {}
    k = kernels.reset_index(drop=True)
    ms = k["pred_ms"].to_numpy(float)              # every launch of the row (per-launch time x count)
    got = pd.DataFrame({"op_class": k["op_class"].astype(str).to_numpy(), "ms": ms,
                        "measured": np.where((rows or pred.measured_rows)(k), ms, 0.0)}).groupby("op_class", sort=False).sum()
    return {c: float(m / t) if t > 0 else 0.0 for c, m, t in zip(got.index, got["measured"], got["ms"])}


def _weights(predictor, quick: bool | None, seed: int) -> bool:
    """``quick`` as given, or for None what the CLI's default picks (``predictors.auto_quick``)."""
    if quick is not None:
        return bool(quick)
    from neusight_core import predictors as _pred
    return _pred.auto_quick([predictor], [seed])


def conv_by_roofline(predictor="neusight", quick: bool = False) -> bool:
    """Whether ``predictor`` times convolutions by the roofline, i.e. has no model of its own for them:
    one convolution (a 3 x 3 conv of ResNet-50's third stage at batch 32) predicted on the A100 against
    the roofline. The roofline baseline itself counts as having its model."""
    from neusight_core.predictors import common
    pred = loaded_predictor(predictor, quick) if isinstance(predictor, str) else predictor
    if getattr(pred, "name", "") == "roofline":
        return False
    cin = cout = 256
    k, size, b = 3, 14, 32
    row = pd.DataFrame([{"op_class": OpClass.CONV, "sub_op": "fwd", "B": b, "M": b * size * size, "N": cin * k * k,
                         "K": cout, "H": np.nan, "flops": 2.0 * b * size * size * cin * k * k * cout,
                         "bytes_read": 4.0 * (b * cin * size * size + cout * cin * k * k),
                         "bytes_written": 4.0 * b * cout * size * size, "precision": Precision.FP32, "count": 1,
                         "conv_cin": cin, "conv_cout": cout, "conv_k": k, "conv_in": size, "conv_stride": 1,
                         "conv_pad": 1, "conv_groups": 1}])
    dev = device_of("A100")
    got = float(np.asarray(pred.predict(row, dev), dtype=float)[0])
    return bool(np.isclose(got, float(common.roofline_ms(row, common.device_arrays(row, dev))[0]), rtol=1e-9))


def conv_note(kernels: pd.DataFrame, predictor="neusight", quick: bool = False) -> str:
    """"" or the sentence that says the convolutions of this prediction are timed by the roofline (a
    predictor without a convolution model, ``conv_by_roofline``), or, for one with a model, what share of the
    predicted time is in convolutions unlike the release's measured ones (forward 3 x 3 stride-1 FP32)."""
    conv = (kernels["op_class"] == OpClass.CONV).to_numpy()
    if not conv.any():
        return ""
    pred_ms = kernels["pred_ms"].to_numpy(float)

    def pct(rows):
        share = float(pred_ms[rows].sum() / max(pred_ms.sum(), 1e-30))
        return "under 1%" if share < 0.01 else f"{share:.0%}"
    if not conv_by_roofline(predictor, quick):
        pred = loaded_predictor(predictor, quick) if isinstance(predictor, str) else predictor
        if getattr(pred, "name", "") == "roofline":
            return ""
        col = lambda c, fill: kernels.get(c, pd.Series(fill, index=kernels.index))  # noqa: E731
        # a trained conv model (predictor side) learnt forward 3 x 3 stride-1 FP32 convolutions only
        # (the release's records): any other convolution is an extrapolation of it, except the 1 x 1 ones a
        # recipe predicts as GEMMs (``as_gemm``: its LINEAR network, trained on GEMMs, not on convolutions)
        measured = (conv & col("sub_op", "").eq("fwd").to_numpy() & col("conv_k", np.nan).eq(3).to_numpy()
                    & col("conv_stride", np.nan).eq(1).to_numpy()
                    & col("precision", Precision.FP32).isin([Precision.FP32]).to_numpy())
        as_gemm = getattr(pred, "as_gemm", None)
        gemm = (conv & (as_gemm(kernels)["op_class"] != OpClass.CONV).to_numpy()) if as_gemm else np.zeros_like(conv)
        outside = conv & ~measured & ~gemm
        parts = []
        if outside.any():
            parts.append(f"convolutions unlike the measured ones this predictor's conv model learnt (forward 3 x 3 "
                         f"stride-1 FP32; backward, other kernel sizes, strides or precisions) take {pct(outside)} "
                         "of the predicted time")
        if gemm.any():
            parts.append(f"1 x 1 convolutions, predicted as the GEMMs they are by the network trained on GEMMs, "
                         f"take {pct(gemm)}")
        if not parts:
            return ""
        return "; ".join(parts) + ": extrapolations, no measured latency of an image model validates them"
    return (f"convolutions ({pct(conv)} of the predicted time) are predicted by the roofline: this predictor "
            "has no trained convolution model; an extrapolation, no measured latency of an image "
            "model validates it")
