"""Command line: ``python -m neusight_core predict | sweep | train | devices | models``, also installed as
the command ``neusight`` (pyproject.toml's console script calls ``main``; the same thing).

    python -m neusight_core predict --model gpt3_27 --device H100 --batch 1 --seq 2048 --mode train
    python -m neusight_core predict --model gpt2_large --device A100-40GB --batch 4 --seq 1024 \
        --mode train --parallel dp --gpus 4 --json
    python -m neusight_core devices
    python -m neusight_core models
    python -m neusight_core train --predictor neusight --seed 0

Which weights answer: the full ones when they are trained, else the quick ones (they train in seconds),
with one line saying so; ``--full`` / ``--quick`` choose. Every answer names its predictor, recipe, seed
and weights. ``train`` trains the full weights once, with an estimate of how long it takes.

Bad input (unknown GPU or model, zero batch, ...) ends with one line ``error: ...`` and exit code 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from neusight_core import __version__
from neusight_core.predictors import registry
from neusight_core.question import schema, step
from neusight_core.question.schema import Execution, Precision

# the registry (no torch, no pandas): the parser stays fast. A bad NEUSIGHT_PREDICTORS file is said in one line
# by ``main`` (here it would be a traceback at import)
try:
    PREDICTORS = registry.names()
except registry.RegistryError as _e:
    PREDICTORS, _REGISTRY_ERROR = (), _e
else:
    _REGISTRY_ERROR = None


def _models() -> list[tuple[str, str]]:
    """(name, source) of every model config the tracer knows by name."""
    from neusight_core import paths
    out = []
    try:
        for p in sorted(paths.model_configs_dir().glob("*.json")):
            out.append((p.stem, "authors' release"))
    except Exception:  # release not provisioned: still list ours
        pass
    from neusight_core.data.configs import OUR_CONFIGS_DIR
    for p in sorted(OUR_CONFIGS_DIR.glob("*.json")):
        out.append((p.stem, "neusight_core/data/model_configs (ours)"))
    return out


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors are one line ``error: ...`` and exit 2 (not the whole usage text)."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    # usage and error lines name the command as it was typed
    prog = "neusight" if Path(sys.argv[0]).name == "neusight" else "python -m neusight_core"
    ap = _OneLineParser(prog=prog,
                                 description="NeuSight re-implementation: predict GPU latency of a model.")
    ap.add_argument("--version", action="version", version=f"%(prog)s {__version__} (neusight_core)")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_OneLineParser)
    p = sub.add_parser("predict", help="predict one configuration")
    _add_question_options(p, many=False)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_sweep_parser(sub)
    _add_serve_parser(sub)
    t = sub.add_parser("train", help="train a predictor's full weights once (NeuSight: minutes per seed)")
    t.add_argument("--predictor", default="neusight", help="predictor(s), comma-separated (default neusight)")
    t.add_argument("--seed", default="0", help="seed(s), comma-separated (default 0)")
    t.add_argument("--quick", action="store_true", help="the quick weights instead (seconds)")
    t.add_argument("--workers", type=int, default=None,
                   help="processes to train in (default: one per CPU core; more cores than seeds also train the "
                        "networks of one seed side by side)")
    d = sub.add_parser("devices", help="list the GPUs in the catalogue")
    d.add_argument("--all", action="store_true", help="every field with its source, one GPU per block")
    sub.add_parser("models", help="list the model configs known by name")
    h = sub.add_parser("host", help="measure this machine's host cost per kernel launch (for --execution eager)")
    h.add_argument("--repeats", type=int, default=30, help="decode steps timed (default 30; the median counts)")
    h.add_argument("--json", action="store_true", help="print JSON instead of text")
    return ap


def _seed(v) -> int:
    """A training seed: a non-negative integer (torch and numpy refuse negative ones deep inside)."""
    try:
        x = int(v)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"takes non-negative integers, got {v!r}") from None
    if x < 0:
        raise argparse.ArgumentTypeError(f"takes non-negative integers, got {v!r}")
    return x


def _seeds(v) -> list[int]:
    """``--seed`` of sweep / train: comma-separated non-negative integers."""
    seeds = _csv_list(v, "seed", int)
    bad = [s for s in seeds if s < 0]
    if bad:
        raise ValueError(f"--seed takes non-negative integers, got {', '.join(map(str, bad))}")
    return seeds


def _add_weights_options(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true",
                   help="answer with the quick weights (4,000 records per class, quick epochs; trained in seconds)")
    g.add_argument("--full", action="store_true",
                   help="answer with the full weights, training them first if needed (NeuSight: minutes per seed)")


def _choose_quick(a, names, seeds) -> bool:
    """The weights of this question (``predictors.auto_quick`` unless --quick / --full), saying on stderr what is
    about to happen."""
    from neusight_core import predictors as _pred
    if a.quick or a.full:
        quick = bool(a.quick)
    else:
        quick = _pred.auto_quick(names, seeds, "add --full",
                                 say=lambda line: print(f"note: {line}", file=sys.stderr, flush=True))
    for n in dict.fromkeys(names):
        if not _pred.trains_long(n):
            continue
        missing = [s for s in seeds if not _pred.is_trained(n, False, s)]
        if not quick and missing:
            print(f"training the full `{n}` weights of seed(s) {', '.join(map(str, missing))} first: "
                  f"{_pred.full_training_estimate(n)}; Ctrl-C stops it (--quick answers in seconds)",
                  file=sys.stderr, flush=True)
    return quick


def _train(a) -> int:
    import time
    from neusight_core import paths, predictors as _pred
    if a.workers is not None and a.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {a.workers}")
    names, seeds = _csv_list(a.predictor, "predictor"), _seeds(a.seed)
    unknown = [x for x in names if x not in PREDICTORS]
    if unknown:
        raise ValueError(f"unknown predictor(s) {', '.join(unknown)}; choose from {', '.join(PREDICTORS)}")
    todo = [(n, a.quick, s, None, None) for n in names for s in seeds if not _pred.is_trained(n, a.quick, s)]
    for n in dict.fromkeys(j[0] for j in todo):
        if _pred.trains_long(n) and not a.quick:
            print(f"training `{n}`: {_pred.full_training_estimate(n)}; weights go to {paths.trained_dir()}",
                  flush=True)
    t0 = time.perf_counter()
    _pred.train_parallel(todo, workers=a.workers, progress=True)
    for n in names:
        for s in seeds:
            p = _pred.get(n, quick=a.quick, seed=s)
            print(_pred.describe_line(_pred.describe(p, a.quick)))
    print(f"{len(todo)} trained, {len(names) * len(seeds) - len(todo)} already there; {time.perf_counter() - t0:.0f} s")
    return 0


def _predict(a) -> int:
    from neusight_core.cost import latency
    from neusight_core import predictors as _pred
    from neusight_core.cost import scenario
    # bad input first, before any training: --seq for text, --image-size for image models
    sc = scenario.scenario(**{name: getattr(a, name) for name in step.INPUTS})
    quick = _choose_quick(a, [a.predictor], [a.seed])
    r = latency.predict_scenario(sc, predictor=a.predictor, quick=quick, seed=a.seed)
    k = r.pop("kernels")
    r.update(model=a.model, batch=sc.batch, seq=sc.seq, past=sc.past, mode=sc.mode, fusion=sc.fusion, dtype=sc.dtype,
             parallel=sc.parallel, gpus=sc.gpus, kernels=int(len(k)))
    if sc.image:
        r.update(image_size=sc.image_size)
    if not r["conv_note"]:
        r.pop("conv_note")
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    plan = f" {sc.parallel}x{sc.gpus} ({sc.comm} collectives)" if sc.parallel else ""
    from neusight_core.cost import memory
    mem = r["memory"]
    if not mem.get("fits", True):   # say it first: the latency below is of a run that cannot happen
        print(f"WARNING: {mem['verdict']}")
    size = f"image={sc.size}x{sc.size}" if sc.image else f"seq={sc.size}"
    print(f"{a.model} {sc.mode} batch={sc.batch} {size}{f' past={sc.past}' if sc.past else ''}"
          f"{' fused' if sc.fusion else ''}{plan} {sc.dtype} {r['attention']} attention, {r['execution']} execution"
          f"{', ' + r['grads'] + ' gradients' if sc.mode == schema.Mode.TRAIN else ''} "
          f"on {r['device']} ({r['predictor']})"
          + ("" if sc.dtype == Precision.FP32 else f"  [{sc.dtype}: {_half_label(r, sc.dtype)}]"))
    for note in ("dtype_note", "conv_note", "range_note", "moe_note"):
        if r.get(note):
            print(f"NOTE: {r[note]}")
    print(f"  weights     {_pred.describe_line(r['weights'])}")
    print(f"  end-to-end  {r['e2e_ms']:12.3f} ms")
    if r["interval_ms"]:
        lo, hi = r["interval_ms"]
        print(f"  interval    {lo:12.3f} - {hi:.3f} ms holds {r['coverage']:.0%} of such answers; widest parts: "
              f"{r['interval_by']} (docs/error_bars.md)")
    else:
        print(f"  interval    {r['interval_note']}")
    if r["execution"] == Execution.EAGER:
        verdict = (f"host-bound: the host's {r['launches']} launches take {r['host_ms']:.3f} ms, the kernels "
                   f"{r['kernel_ms']:.3f} ms ({r['host_ms'] / max(r['kernel_ms'], 1e-12):.1f}x)" if r["host_bound"]
                   else f"GPU-bound: kernels {r['kernel_ms']:.3f} ms, the host's {r['launches']} launches "
                        f"{r['host_ms']:.3f} ms")
        print(f"  execution   eager PyTorch, {verdict} (host.py; graph execution: {r['kernel_ms']:.3f} ms)")
    for key, label in (("fw_ms", "forward"), ("bw_ms", "backward"), ("acc_ms", "grad acc"),
                       ("comm_ms", "comm"), ("comm_exposed_ms", "comm exposed")):
        if r.get(key):
            print(f"  {label:<11} {r[key]:12.3f} ms")
    share, law = r["measured_share"], r.get("law_share", {})
    if not any(share.values()) and not any(law.values()):
        share = law = {}                                       # none measured: the header says so
    print("  by op class:" + (f"{'':18s}(share of the time from models trained on measured {_measured_words(sc.dtype)} kernels)"
                               if share else ""))
    for c, v in r["breakdown"].items():
        if share.get(c):
            tail = f"   measured {100 * share[c]:3.0f} %"
        elif law.get(c):
            tail = f"   memory law {100 * law[c]:3.0f} % (extrapolation)"
        else:
            tail = "   extrapolation" if share or law else ""
        print(f"    {c:<12} {v:12.3f} ms{tail}")
    for line in memory.format_footprint(mem):
        print("  " + line)
    print(f"  {r['kernels']} kernel rows; trace {r['trace_s']:.2f} s, predict {r['predict_s']:.2f} s")
    return 0


def _measured_words(dtype: str) -> str:
    """The measured kernels an answer in ``dtype`` rests on: fp8's GEMMs are FP8, its attention BF16 (its activations)."""
    p = schema.Precision(dtype)
    return p.value if p.activations is p else f"{p.value} GEMM and {p.activations.value}"


def _half_label(r: dict, dtype: str) -> str:
    """What a bf16 / fp16 answer rests on, in the header line (the breakdown gives it per op class)."""
    measured = [c for c, v in r["measured_share"].items() if v > 0]
    law = [c for c, v in r.get("law_share", {}).items() if v > 0 and c not in measured]
    if not measured and not law:
        return "extrapolation, the predictors are validated on FP32"
    parts = [f"{', '.join(measured)} from models trained on measured {_measured_words(dtype)} kernels (checked on held-out GPUs, "
             "notebook 07)"] if measured else []
    if law:
        parts.append(f"{', '.join(law)} by a memory law fitted on measured {schema.Precision(dtype).activations} element-wise kernels (an "
                     "extrapolation to other kinds)")
    return "; ".join(parts) + "; any other kernels are extrapolations of FP32-trained models"


def _arg_type(kind):
    """argparse's type of one value of a kind (``step.Kind.text``): a builtin as it is (argparse says "invalid int
    value"), else its ValueError's text as the error."""
    if kind.text in (int, float, str):
        return kind.text

    def one(s):
        try:
            return kind.text(s)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return one


def _default_text(o) -> str:
    """The defaults an option's help states, from its declaration (``step.option``)."""
    if o.user is step.REQUIRED:
        return ""
    user = o.user.says if isinstance(o.user, step.Rule) else ("none" if o.user is None else str(o.user).lower())
    paper = "" if o.paper is step.REQUIRED else f"; the paper's: {o.paper}"
    return f" (default: {user}{paper})" if user not in ("none", "false") or paper else ""


def _add_question_options(p, many: bool) -> None:
    """The options of a question, generated from its declaration (``step.Scenario``'s fields): for ``predict`` one
    value each, checked by argparse; for ``sweep`` (``many``) comma-separated lists where the field declares a list
    help (``Option.many``), each value checked by ``_list_of``. Every default is None (not given): the declaration's
    user default applies when the Scenario is built."""
    for name, o in step.options().items():
        flag = "--" + name.replace("_", "-")
        kw = dict(required=True) if o.user is step.REQUIRED else dict(default=None)
        if many and o.many is not None:
            p.add_argument(flag, help=o.many + _default_text(o), **kw)
        elif isinstance(o.kind, step.Flag):
            p.add_argument(flag, action="store_true", help=o.help, **kw)
        else:
            p.add_argument(flag, type=_arg_type(o.kind), choices=o.kind.choices, help=o.help + _default_text(o), **kw)
    # who answers: not part of the question
    if many:
        p.add_argument("--predictor", default="neusight",
                       help=f"predictor(s), comma-separated, of: {', '.join(PREDICTORS)}")
        p.add_argument("--seed", default="0", help="predictor seed(s), comma-separated")
    else:
        p.add_argument("--predictor", default="neusight", choices=PREDICTORS,
                       help="neusight (ours: the authors' recipe also trained on the training GPUs' transformer-shaped "
                            "kernels, seed 0), neusight-paper (the authors' recipe, docs/recipes.md), neusight-logo "
                            "(our earlier leave-one-GPU-out recipe) or a baseline")
        p.add_argument("--seed", type=_seed, default=0, help="the predictor's training seed (default 0)")
    _add_weights_options(p)


def _add_sweep_parser(sub) -> None:
    """``sweep``: the product of comma-separated lists, one CSV row per configuration x predictor."""
    p = sub.add_parser("sweep", help="predict many configurations (comma-separated lists) into a CSV")
    _add_question_options(p, many=True)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--chunk", type=int, default=5000,
                   help="configurations predicted together (the CSV is written part by part; default 5000)")
    p.add_argument("--out", required=True, help="CSV file to write")


def _list_of(name: str, value, cls=step.Scenario) -> list:
    """A sweep's option (a field of ``cls``'s declaration) as the list of its values (``step.Kind.text`` each, a
    choice among its words, or "none" for an option whose default is none); a value that is none of them is a usage
    error naming the option."""
    o = step.options(cls)[name]
    flag = name.replace("_", "-")
    if o.many is None:
        return [value]
    if name == "device":
        return _devices(value)
    items = _csv_list(value, flag)
    if o.kind.choices is not None:
        allowed = o.kind.choices + (("none",) if o.user is None else ())
        bad = [x for x in items if x not in allowed]
        if bad:
            raise ValueError(f"--{flag} must be of {', '.join(allowed)}, got {', '.join(bad)}")
        return items
    return _csv_list(value, flag, o.kind.text)


def _csv_list(value, what: str, conv=str) -> list:
    """A comma-separated option as a list: repeated values once, an empty list a usage error."""
    items = [x.strip() for x in str(value).split(",") if x.strip()]
    if not items:
        raise ValueError(f"--{what} names no value (got {value!r})")
    try:
        return list(dict.fromkeys(conv(x) for x in items))
    except ValueError:
        raise ValueError(f"--{what} takes comma-separated integers, got {value!r}") from None


def _devices(value) -> list[str]:
    """``--device`` of a sweep: each GPU once, however it is named (``H100`` and ``NVIDIA_H100_80GB_HBM3`` are one
    GPU, one row); an unknown name stays as given, for its row's error."""
    from neusight_core.data import devices
    out = []
    for name in _csv_list(value, "device"):
        try:
            name = devices.get_device(name).name
        except Exception:  # noqa: BLE001 - said in that row's error column
            pass
        out.append(name)
    return list(dict.fromkeys(out))


def _sweep(a) -> int:
    from neusight_core.cost import sweep

    names = _csv_list(a.predictor, "predictor")
    unknown = [x for x in names if x not in PREDICTORS]
    if unknown:
        raise ValueError(f"unknown predictor(s) {', '.join(unknown)}; choose from {', '.join(PREDICTORS)}")
    lists = {name: None if getattr(a, name) is None else _list_of(name, getattr(a, name)) for name in step.INPUTS}
    configs = sweep.grid(*(lists.pop(name) for name in ("model", "device", "batch", "seq", "mode")), **lists)
    seeds = _seeds(a.seed)
    # refused here, before anything is computed (and while another sweep writes the same file); `with`: a sweep
    # that stops before writing (a bad --chunk, Ctrl-C in training) leaves neither its .tmp nor its lock
    with sweep.CsvTarget(a.out) as target:
        quick = _choose_quick(a, names, seeds)
        pieces = list(sweep.chunks(configs, a.chunk))
        # written part by part; Ctrl-C / SIGTERM keep the finished parts as NAME.partial.csv, or the next free
        # NAME.partial-N.csv (sweep.write_csv)
        done = sweep.write_csv(target, pieces, lambda part: sweep.run(part, names, seeds, quick=quick,
                               progress=not a.no_progress), progress=not a.no_progress)
    rows, bad, tables_s, total_s = done["rows"], done["bad"], done["tables_s"], done["total_s"]
    from neusight_core.data import devices
    for dev_name, dt in dict.fromkeys(zip(configs["device"], configs["dtype"])):
        try:
            note = devices.get_device(dev_name).precision_note(dt)
        except Exception:  # noqa: BLE001 - an unknown device or dtype is in that row's error column
            note = ""
        if note:
            print(f"NOTE: {note}", file=sys.stderr)
    if configs["image_size"].notna().any():
        from neusight_core.cost import latency
        for n in names:
            if latency.conv_by_roofline(n, quick):
                print(f"NOTE: {n}: the convolutions of the image models (column CONV_ms) are predicted by the roofline: "
                      "no trained convolution model; an extrapolation, no measured latency of an image "
                      "model validates it", file=sys.stderr)
    weighted = [n for n in names if registry.CLASSES[n].has_weights]
    said = (f"{'quick' if quick else 'full'} weights of {', '.join(weighted)} seed(s) {', '.join(map(str, seeds))}"
            if weighted else "no weights (nothing to train)")
    print(f"{rows} rows ({bad} with an error) -> {target.path}; tables {tables_s:.1f} s, total {total_s:.1f} s; {said}")
    return 0


def _add_serve_parser(sub) -> None:
    """``serve``: its options generated from ``question.serving.ServeQuestion``'s declaration, each a
    comma-separated list (several values: one row per combination)."""
    from neusight_core.question.serving import ServeQuestion
    p = sub.add_parser("serve", help="serving: TTFT, TPOT and throughput at a concurrency (docs/serving.md)")
    for name, o in step.options(ServeQuestion).items():
        kw = dict(required=True) if o.user is step.REQUIRED else dict(default=None)
        p.add_argument("--" + name.replace("_", "-"), help=o.many + _default_text(o), **kw)
    p.add_argument("--seed", type=_seed, default=0, help="the predictor's training seed (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON (a list with several questions)")
    p.add_argument("--out", help="write the answers as CSV to this file")
    _add_weights_options(p)


def _serve(a) -> int:
    import itertools
    import json
    from neusight_core.cost import serving
    from neusight_core.question.serving import SERVE_INPUTS, ServeQuestion
    lists = {n: [None] if getattr(a, n) is None else _list_of(n, getattr(a, n), ServeQuestion) for n in SERVE_INPUTS}
    if lists["device"] != [None]:
        lists["device"] = _devices(",".join(lists["device"]))
    questions = [dict(zip(SERVE_INPUTS, combo)) for combo in itertools.product(*lists.values())]
    if len(questions) == 1:      # one question: its bad input is the command's one-line error, before any training
        serving.step_scenarios(serving.question(**questions[0]))
    from contextlib import nullcontext
    from neusight_core.cost import sweep
    # the file is checked (and locked) before anything is computed; written aside and renamed when all is answered
    with sweep.CsvTarget(a.out) if a.out else nullcontext() as target:
        quick = _choose_quick(a, ["neusight"], [a.seed])
        df = serving.predict(questions, quick=quick, seed=a.seed)
        if target is not None:
            f = target.open()
            df.to_csv(f, index=False)
            if target.tmp is None:
                f.close()
            target.commit()
    if len(df) == 1 and df["error"].iloc[0]:
        raise ValueError(df["error"].iloc[0])
    if a.json:
        recs = [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()} for r in df.to_dict("records")]
        print(json.dumps(recs[0] if len(recs) == 1 else recs, indent=2, default=str))
        return 0
    weights = "quick" if quick else "full"
    for r in df.to_dict("records"):
        head = (f"{r['model']} on {r['tp']} x {r['device']} ({r['engine']}, {r['dtype']}), ISL {r['isl']}, "
                f"OSL {r['osl']}, concurrency {r['concurrency']}")
        if r["error"]:
            print(f"{head}\n  error: {r['error']}")
            continue
        print(head + f"  [neusight {weights} weights seed {a.seed}; constants of {r['constants_of']}]")
        if r["note"]:    # a run that does not fit says so first: the numbers below are of a run that cannot happen
            print(f"{'NOTE' if r['fits'] else 'WARNING'}: {r['note']}")
        band = f"{r['coverage']:.0%} interval"
        print(f"  TTFT        {r['ttft_ms']:12.1f} ms   {band} {r['ttft_lo_ms']:.1f} - {r['ttft_hi_ms']:.1f} ms\n"
              f"  TPOT        {r['tpot_ms']:12.2f} ms   {band} {r['tpot_lo_ms']:.2f} - {r['tpot_hi_ms']:.2f} ms "
              "(the spread of the engine's measured runs around the model: docs/serving.md)\n"
              f"  throughput  {r['tokens_per_s_per_gpu']:12.0f} output tokens/s per GPU, "
              f"{r['requests_per_s']:.2f} requests/s\n"
              f"  steps       decode {r['decode_step_ms']:.2f} ms (batch {r['concurrency']}), prefill "
              f"{r['prefill_ms']:.1f} ms (one prompt)\n"
              f"  KV cache    {r['kv_capacity_tokens']:,} tokens per GPU: at most {r['max_concurrency']} such requests")
    if a.out:
        print(f"{len(df)} rows ({int(df['error'].ne('').sum())} with an error) -> {a.out}")
    return 0


def _host(a) -> int:
    """host.calibrate on this machine, and how to predict with it (NEUSIGHT_HOST_LAUNCH_US)."""
    import json
    from neusight_core.cost import host
    if a.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {a.repeats}")
    c = host.calibrate(cuda=True, repeats=a.repeats)
    now = host.launch_us()
    src = ("NEUSIGHT_HOST_LAUNCH_US" if os.environ.get("NEUSIGHT_HOST_LAUNCH_US", "").strip()
           else "the default, host.DEFAULT_LAUNCH_US")
    if a.json:
        print(json.dumps({**c, "in_use_us": now, "in_use_source": src}))
        return 0
    print(f"host cost per kernel launch of eager PyTorch on this machine: {c['launch_us']:.1f} us")
    print(f"  from  {c['launch_source']}")
    print(f"  CPU   {c['per_kernel_cpu_us']:.1f} us per kernel of a tiny Llama's eager decode step "
          f"({c['kernels']} kernels, median of {a.repeats} steps)")
    print(f"  CUDA  + {c['cuda_launch_extra_us']:.1f} us per launch ({c['extra_source']})")
    if "gpu_decode_us" in c:
        print(f"  GPU   {c['gpu_decode_us']:.1f} us per kernel of the same step on the GPU, "
              f"{c['gpu_train_us']:.1f} us of its training step")
    else:
        print("  (no CUDA GPU here: this CPU with the lent H100's launch cost; hosts differ, so measure on the "
              "machine the model will run on)")
    print(f"in use now: {now:.1f} us ({src}). To predict with this machine's host:")
    print(f"  export NEUSIGHT_HOST_LAUNCH_US={c['launch_us']:.1f}" + (f"   # and the GPU's own cost per eager launch, "
          f"{host.eager_gap_us():.2f} us in use:\n  export NEUSIGHT_EAGER_GAP_US={c['eager_gap_us']:.2f}" if "eager_gap_us" in c else ""))
    return 0


def main(argv=None) -> int:
    """The command line; ``argv`` None reads ``sys.argv``, as ``python -m neusight_core`` and the ``neusight``
    script do: the command then has its process to itself, which ends when it returns."""
    code = _command(argv)
    if argv is None:
        # The command is over: it wrote its files through closed handles (atomically), and its worker pools have
        # been shut down. Python would now tear the interpreter down, freeing every object of every module one by
        # one: 0.3-0.4 s once torch and transformers are loaded (a cold sweep's 10.1 s -> 9.7 s, measured), 0.1 s
        # of a 0.55 s answer from the trace cache. Nothing left to free or run matters any more, so the process
        # ends here, with what it printed flushed. (Not for an argv list: tests and notebooks call main in a
        # process that goes on.)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):    # a reader that has gone (`| head`), a closed stream
                pass
        os._exit(code)
    return code


def _command(argv) -> int:
    if _REGISTRY_ERROR is not None:
        print(f"error: {_REGISTRY_ERROR}", file=sys.stderr)
        return 2
    a = _parser().parse_args(argv)
    try:
        if a.cmd == "predict":
            return _predict(a)
        if a.cmd == "sweep":
            return _sweep(a)
        if a.cmd == "serve":
            return _serve(a)
        if a.cmd == "train":
            return _train(a)
        if a.cmd == "host":
            return _host(a)
        if a.cmd == "devices":
            from neusight_core.data import devices
            print(devices.describe(every_field=a.all))
            return 0
        if a.cmd == "models":
            for name, src in _models():
                print(f"{name:<16} {src}")
            return 0
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:          # `... | head`: the reader has gone; nothing to say to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # one line for the user; the traceback helps nobody here
        msg = step.one_line(str(e)) or type(e).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
