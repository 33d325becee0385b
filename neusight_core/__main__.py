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
import math
import os
import sys
from pathlib import Path

from neusight_core import __version__, registry, schema
from neusight_core.schema import Precision

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
    for p in sorted((Path(__file__).parent / "model_configs").glob("*.json")):
        out.append((p.stem, "neusight_core/model_configs (ours)"))
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


def _link_gbs(v: str) -> float:
    """``--link-gbs``: a positive, finite number of GB/s (a NaN in a sweep's frame would mean "not given")."""
    try:
        x = float(v)
    except ValueError:
        x = float("nan")
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"link bandwidth must be a positive number of GB/s, got {v!r}")
    return x


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
    from neusight_core import latency
    from neusight_core import predictors as _pred
    from neusight_core import scenario
    # bad input first, before any training: --seq for text, --image-size for image models
    sc = scenario.scenario(a.model, a.device, a.batch, a.seq, a.mode, image_size=a.image_size, past=a.past,
                           dtype=a.dtype, fusion=a.fusion, parallel=a.parallel, gpus=a.gpus,
                           micro_batches=a.micro_batches, link_gbs=a.link_gbs, attention=a.attention,
                           execution=a.execution, grads=a.grads, comm=a.comm)
    a.gpus, a.seq, image = sc.gpus, sc.size, sc.image
    quick = _choose_quick(a, [a.predictor], [a.seed])
    r = latency.predict_scenario(sc, predictor=a.predictor, quick=quick, seed=a.seed)
    k = r.pop("kernels")
    r.update(model=a.model, batch=a.batch, seq=a.seq, past=a.past, mode=a.mode, fusion=a.fusion, dtype=a.dtype,
             parallel=a.parallel, gpus=a.gpus, kernels=int(len(k)))
    if image:
        r.update(seq=None, image_size=a.seq)
    if not r["conv_note"]:
        r.pop("conv_note")
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    plan = f" {a.parallel}x{a.gpus} ({sc.comm} collectives)" if a.parallel else ""
    from neusight_core import memory
    mem = r["memory"]
    if not mem.get("fits", True):   # say it first: the latency below is of a run that cannot happen
        print(f"WARNING: {mem['verdict']}")
    size = f"image={a.seq}x{a.seq}" if image else f"seq={a.seq}"
    print(f"{a.model} {a.mode} batch={a.batch} {size}{f' past={a.past}' if a.past else ''}"
          f"{' fused' if a.fusion else ''}{plan} {a.dtype} {r['attention']} attention, {r['execution']} execution"
          f"{', ' + r['grads'] + ' gradients' if a.mode == 'train' else ''} "
          f"on {r['device']} ({r['predictor']})"
          + ("" if a.dtype == Precision.FP32 else f"  [{a.dtype}: {_half_label(r, a.dtype)}]"))
    for note in ("dtype_note", "conv_note", "range_note", "moe_note"):
        if r.get(note):
            print(f"NOTE: {r[note]}")
    print(f"  weights     {_pred.describe_line(r['weights'])}")
    print(f"  end-to-end  {r['e2e_ms']:12.3f} ms")
    if r["execution"] == "eager":
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
    print("  by op class:" + (f"{'':18s}(share of the time from models trained on measured {a.dtype} kernels)"
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


def _half_label(r: dict, dtype: str) -> str:
    """What a bf16 / fp16 answer rests on, in the header line (the breakdown gives it per op class)."""
    measured = [c for c, v in r["measured_share"].items() if v > 0]
    law = [c for c, v in r.get("law_share", {}).items() if v > 0 and c not in measured]
    if not measured and not law:
        return "extrapolation, the predictors are validated on FP32"
    parts = [f"{', '.join(measured)} from models trained on measured {dtype} kernels (checked on held-out GPUs, "
             "notebook 07)"] if measured else []
    if law:
        parts.append(f"{', '.join(law)} by a memory law fitted on measured {dtype} element-wise kernels (an "
                     "extrapolation to other kinds)")
    return "; ".join(parts) + "; any other kernels are extrapolations of FP32-trained models"


def _add_question_options(p, many: bool) -> None:
    """The options of a question, one builder for ``predict`` (one value each, checked by argparse) and ``sweep``
    (``many``: comma-separated lists where a sweep multiplies, checked per value by ``_choices`` / ``_csv_list``)."""
    def opt(flag, one: dict, lists: dict | None = None, **both):
        p.add_argument(flag, **both, **(lists if many and lists is not None else one))
    opt("--model", dict(help="config name (see `models`) or path to a HF config JSON"),
        dict(help="model name(s) or config path(s), comma-separated"), required=True)
    opt("--device", dict(help="GPU name, file stem or alias (see `devices`)"),
        dict(help="GPU name(s), comma-separated"), required=True)
    opt("--batch", dict(type=int, help="global batch size"), dict(help="batch size(s), e.g. 1,2,4,8"), required=True)
    opt("--seq", dict(type=int, help="sequence length (text models)"),
        dict(help="sequence length(s) of the text models, e.g. 512,1024"), default=None)
    opt("--image-size", dict(type=int, help="image side in pixels (image models: resnet50, vit_b16; default 224)"),
        dict(help="image side(s) of the image models, e.g. 224,384 (default 224)"), default=None)
    opt("--mode", dict(choices=schema.MODES,
                       help="inf (a forward pass: prefill, or one decode step with --seq 1 --past N) or train "
                            "(forward, backward, optimizer step)"),
        dict(help="inf, train or inf,train (a decode step: --seq 1 --past N)"), default="inf")
    opt("--fusion", dict(help="operator fusion as torch.compile would do"), action="store_true")
    opt("--parallel", dict(choices=schema.PLANS, help="dp, tp, pp or ep (tensor parallelism whose mixture-of-experts "
                                                     "layers spread their experts over the GPUs)"),
        dict(help="dp, tp, pp or ep (comma-separated for several)"),
        default=None)
    opt("--gpus", dict(type=int, help="GPUs for --parallel (default 4, the paper's setting; 1 without --parallel)"),
        dict(help="GPUs for --parallel (default 4)"), default=None)
    opt("--link-gbs", dict(help="link peak GB/s (default: catalogue)"),
        dict(help="link peak GB/s of --parallel (default: the catalogue's, per GPU)"), type=_link_gbs, default=None)
    opt("--micro-batches", dict(help="PP micro-batches (default 1)"), type=int, default=1)
    opt("--past", dict(type=int, help="inference on a KV cache of this many tokens (extension; --seq 1 = one decode "
                                      "step)"),
        dict(help="KV cache length(s) of inference, e.g. 1024,4096 (a decode step: --seq 1 --past N)"), default=0)
    opt("--dtype", dict(choices=schema.PRECISIONS,
                        help="precision (default fp32 = the paper, TF32 off). bf16 / fp16 with neusight: GEMMs and "
                             "fused attention from networks trained on measured kernels, memory-bound kernels by a "
                             "memory law; else extrapolations: GEMMs at the dense tensor-core peak, 2-byte elements"),
        dict(help="precision(s), comma-separated, of fp32 (the paper), tf32, fp16, bf16 (extrapolations)"),
        default=Precision.FP32)
    opt("--attention", dict(choices=schema.ATTENTIONS,
                            help="eager (the paper's: Q K^T, softmax, P V as separate kernels) or sdpa (one fused "
                                 "kernel per layer); default: what Hugging Face picks for the model (sdpa where it "
                                 "supports it)"),
        dict(help="eager or sdpa, comma-separated for both (default: what Hugging Face picks per model)"), default=None)
    opt("--execution", dict(choices=schema.EXECUTIONS,
                            help="eager (default: eager PyTorch, the host launching each kernel: the step takes at "
                                 "least the host's launch time, NEUSIGHT_HOST_LAUNCH_US) or graph (CUDA graphs, "
                                 "torch.compile with cudagraphs, serving engines: the kernel sum)"),
        dict(help="eager (default) or graph, comma-separated for both"), default=None)
    opt("--grads", dict(choices=schema.GRADS,
                        help="training: fresh (default: gradients start from none, PyTorch's zero_grad default) or "
                             "accumulate (added into the step before's, the paper's loop: one more kernel per "
                             "parameter; pipeline parallelism always accumulates)"),
        dict(help="fresh (default) or accumulate, comma-separated for both"), default=None)
    opt("--comm", dict(choices=schema.COMMS,
                       help="collectives of --parallel: nccl (default: the link's bandwidth plus NCCL's measured fixed "
                            "cost per all-reduce, 8-19 us on 2-8 GPUs) or bandwidth (the link alone, the paper's model)"),
        dict(help="nccl (default) or bandwidth, comma-separated for both"), default=None)
    opt("--predictor", dict(choices=PREDICTORS,
                            help="neusight (ours: the authors' recipe also trained on the training GPUs' "
                                 "transformer-shaped kernels, seed 0), neusight-paper (the authors' recipe, "
                                 "docs/recipes.md), neusight-logo (our earlier leave-one-GPU-out recipe) or a baseline"),
        dict(help=f"predictor(s), comma-separated, of: {', '.join(PREDICTORS)}"), default="neusight")
    opt("--seed", dict(type=_seed, default=0, help="the predictor's training seed (default 0)"),
        dict(default="0", help="predictor seed(s), comma-separated"))
    _add_weights_options(p)


def _add_sweep_parser(sub) -> None:
    """``sweep``: the product of comma-separated lists, one CSV row per configuration x predictor."""
    p = sub.add_parser("sweep", help="predict many configurations (comma-separated lists) into a CSV")
    _add_question_options(p, many=True)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--chunk", type=int, default=5000,
                   help="configurations predicted together (the CSV is written part by part; default 5000)")
    p.add_argument("--out", required=True, help="CSV file to write")


def _choices(value, what: str, allowed) -> list:
    """A comma-separated option whose values must be of ``allowed`` ([None]: not given, the default)."""
    if value is None:
        return [None]
    items = _csv_list(value, what)
    bad = [x for x in items if x not in allowed]
    if bad:
        raise ValueError(f"--{what} must be of {', '.join(allowed)}, got {', '.join(bad)}")
    return items


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
    from neusight_core import devices
    out = []
    for name in _csv_list(value, "device"):
        try:
            name = devices.get_device(name).name
        except Exception:  # noqa: BLE001 - said in that row's error column
            pass
        out.append(name)
    return list(dict.fromkeys(out))


def _sweep(a) -> int:
    from neusight_core import sweep

    names = _csv_list(a.predictor, "predictor")
    unknown = [x for x in names if x not in PREDICTORS]
    if unknown:
        raise ValueError(f"unknown predictor(s) {', '.join(unknown)}; choose from {', '.join(PREDICTORS)}")
    ints = lambda v, what: _csv_list(v, what, int)        # noqa: E731
    configs = sweep.grid(_csv_list(a.model, "model"), _devices(a.device), ints(a.batch, "batch"),
                         ints(a.seq, "seq") if a.seq is not None else None, _csv_list(a.mode, "mode"), fusion=a.fusion,
                         parallel=_csv_list(a.parallel, "parallel") if a.parallel is not None else [None],
                         gpus=ints(a.gpus, "gpus") if a.gpus is not None else None,
                         micro_batches=a.micro_batches, link_gbs=a.link_gbs, past=ints(a.past, "past"),
                         dtype=_csv_list(a.dtype, "dtype"),
                         attention=_choices(a.attention, "attention", schema.ATTENTIONS),
                         execution=_choices(a.execution, "execution", schema.EXECUTIONS),
                         grads=_choices(a.grads, "grads", schema.GRADS), comm=_choices(a.comm, "comm", schema.COMMS),
                         image_sizes=ints(a.image_size, "image-size") if a.image_size is not None else None)
    seeds = _seeds(a.seed)
    target = sweep.CsvTarget(a.out)     # refused here, before anything is computed
    quick = _choose_quick(a, names, seeds)
    pieces = list(sweep.chunks(configs, a.chunk))
    # written part by part; Ctrl-C / SIGTERM keep the finished parts as NAME.partial.csv (sweep.write_csv)
    done = sweep.write_csv(target, pieces, lambda part: sweep.run(part, names, seeds, quick=quick,
                           progress=not a.no_progress), progress=not a.no_progress)
    rows, bad, tables_s, total_s = done["rows"], done["bad"], done["tables_s"], done["total_s"]
    from neusight_core import devices
    for dev_name, dt in dict.fromkeys(zip(configs["device"], configs["dtype"])):
        try:
            note = devices.get_device(dev_name).precision_note(dt)
        except Exception:  # noqa: BLE001 - an unknown device or dtype is in that row's error column
            note = ""
        if note:
            print(f"NOTE: {note}", file=sys.stderr)
    if configs["image_size"].notna().any():
        from neusight_core import latency
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


def _host(a) -> int:
    """host.calibrate on this machine, and how to predict with it (NEUSIGHT_HOST_LAUNCH_US)."""
    import json
    from neusight_core import host
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
        if a.cmd == "train":
            return _train(a)
        if a.cmd == "host":
            return _host(a)
        if a.cmd == "devices":
            from neusight_core import devices
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
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
