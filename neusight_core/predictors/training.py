"""Training and loading the predictors: which weights answer a question (quick or full), where they live
(``paths.trained_dir()/<name>[-quick]-seed<seed>/``), training them once per config and training-data checksum
(a lock per folder, several processes at a time), and saving / loading them.

``get(name, quick=False, seed=0)`` returns a trained predictor: the saved weights when their config and training-data
checksum match, otherwise it trains on the five training GPUs' kernels and saves (``meta.json`` records the config,
the data checksum, the training wall time, where it trained and the validation errors). Weights that match but
cannot be loaded (a truncated or damaged ``state.npz``) give one warning line naming the file and are retrained.
The predictors themselves are made by ``registry.create``. What this module knows of the methods: ``has_weights`` /
``trains_mlps``, that the NeuSight recipes train for long (``trains_long``, ``training_cost``), and the BF16 networks a
NeuSight recipe may lack.
"""
from __future__ import annotations

import contextlib
import json
import sys
import warnings
from pathlib import Path

from neusight_core import paths
from neusight_core.data.datafile import CacheWarning
from neusight_core.predictors.base import STATE_FILE, KernelPredictor, PredictorLoadError, config_hash, read_state
from neusight_core.predictors.registry import create
from neusight_core.predictors.registry import names as registry_names
from neusight_core.question.schema import OpClass


def folder(name: str, quick: bool = False, seed: int = 0, config: dict | None = None,
           rows: int | None = None) -> Path:
    """Where trained weights live; a config override (ablation variants) or a training subset of
    ``rows`` records per class gets its own folder."""
    tag = f"-{config_hash(name, config)[:10]}" if config else ""
    sub = f"-rows{int(rows)}" if rows else ""
    return paths.trained_dir() / f"{name}{tag}{sub}{'-quick' if quick else ''}-seed{seed}"


def is_trained(name: str, quick: bool = False, seed: int = 0, config: dict | None = None,
               rows: int | None = None) -> bool:
    """Saved weights exist for this recipe, seed, config and training data (``get`` would load them).
    The checksum alone decides, without loading the training records."""
    from neusight_core.data import dataset
    p = create(name, seed, config)
    subset = dict(quick=True, quick_rows=int(rows)) if rows else dict(quick=quick)
    meta_file = folder(name, quick, seed, config, rows) / "meta.json"
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return (meta.get("config_hash") == config_hash(name, {**p.config, "seed": seed})
            and meta.get("info", {}).get("data_checksum") == dataset.training_checksum(**subset))


def _train_job(job: tuple) -> tuple:
    """Worker of ``train_parallel`` (its environment says no progress bars and the parent's weights
    folder): one thread; returns (job, seconds)."""
    import time

    import torch
    torch.set_num_threads(1)
    name, quick, seed, config, rows = job
    t0 = time.perf_counter()
    get(name, quick=quick, seed=seed, config=config, rows=rows)
    return job, time.perf_counter() - t0


def train_parallel(jobs, workers: int | None = None, progress: bool = True) -> list:
    """Train the (name, quick, seed, config, rows) jobs that have no current weights, ``workers`` processes
    at a time (default: one per CPU core), one thread each (measured on 2 cores: two seeds of the authors'
    recipe side by side, 15 epochs, 245 s each; the small batches of the 8 x 512 MLPs gain little from a
    second thread). Returns [(job, seconds)] of what was trained; ``get`` then loads them."""
    import multiprocessing as mp
    import os
    import time
    from concurrent.futures import ProcessPoolExecutor

    from tqdm.auto import tqdm
    todo = [j for j in dict.fromkeys((n, q, int(s), _freeze(c), r) for n, q, s, c, r in jobs)]
    todo = [(n, q, s, _thaw(c), r) for n, q, s, c, r in todo if not is_trained(n, q, s, _thaw(c), r)]
    if not todo:
        return []
    # longest first: with two workers, three 100-epoch seeds of the authors' recipe and three shorter
    # seeds of ours end together instead of one long job running alone at the end
    todo.sort(key=lambda j: -training_cost(*j))
    cores = max(1, workers or os.cpu_count() or 1)
    workers = min(len(todo), cores)
    # more cores than full trainings: every job in a thread of this process, every MLP member of every job in
    # one pool of processes (members.pool), so the cores that one process per seed leaves idle train too (a
    # member's weights are the same bits wherever it trains: predictors/members.py). Quick weights train in
    # seconds: not worth the pool's start.
    pooled = cores > len(todo) and not all(j[1] for j in todo)
    done = []
    with tqdm(total=len(todo), desc=f"training {len(todo)} predictor(s), {workers} at a time", disable=not progress) as bar:
        if workers == 1 and not pooled:
            # in this process, with its progress bars (training itself runs on one thread: nets.one_thread, so
            # the weights are those a worker would train)
            for j in todo:
                t0 = time.perf_counter()
                get(j[0], quick=j[1], seed=j[2], config=j[3], rows=j[4])
                done.append((j, time.perf_counter() - t0))
                bar.update(1)
            return done
        with contextlib.ExitStack() as stack:
            stack.enter_context(worker_environment())        # before any worker starts: they inherit it
            if pooled:
                runs = _train_members_pooled(todo, cores)
            else:
                pool = stack.enter_context(ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")))
                runs = pool.map(_train_job, todo)
            for job, secs in runs:
                done.append((job, secs))
                bar.update(1)
                bar.set_postfix_str(f"{job[0]} seed {job[2]}: {secs / 60:.1f} min")
    return done


def _train_members_pooled(todo: list, cores: int):
    """``train_parallel``'s jobs each in a thread, their members in a pool of ``cores`` processes; yields
    (job, seconds) as jobs finish. What a job trains in its thread runs on one thread with denormals flushed as
    in a process of its own: torch's thread count and the flush-to-zero flag are per thread
    (nets.one_thread / flush_denormals set and restore the calling thread's; tests/test_members.py).

    On the CPU unless ``NEUSIGHT_TRAIN_DEVICE=cuda`` asks for the GPU: on a lent H200 machine (16 cores,
    docs/tier2/2026-11-26-h200-training) one `neusight` seed alone on the GPU had 554 of its 720 epochs done
    after 330 s (its networks' small batches leave the GPU 10-17 % busy, and seeds sharing it time-slice),
    while the pool on the 16 cores had 20 of the 45 networks of both recipes' three seeds done after 190 s, the
    longest (`neusight-paper` BMM, 40 epochs) running at 11-12 s an epoch."""
    import os
    import time
    from concurrent.futures import ThreadPoolExecutor, as_completed

    import neusight_core.predictors.members as members

    def one(job):
        t0 = time.perf_counter()
        get(job[0], quick=job[1], seed=job[2], config=job[3], rows=job[4])
        return job, time.perf_counter() - t0
    device = os.environ.get("NEUSIGHT_TRAIN_DEVICE")
    if (device or "auto").strip().lower() == "auto":
        os.environ["NEUSIGHT_TRAIN_DEVICE"] = "cpu"       # the pool's workers inherit it when they start
    try:
        with members.pool(cores), ThreadPoolExecutor(len(todo)) as ex:
            for f in as_completed([ex.submit(one, j) for j in todo]):
                yield f.result()
    finally:
        if device is None:
            os.environ.pop("NEUSIGHT_TRAIN_DEVICE", None)
        else:
            os.environ["NEUSIGHT_TRAIN_DEVICE"] = device


@contextlib.contextmanager
def worker_environment():
    """The environment spawned training workers inherit: no progress bars of their own (the parent's bar
    counts their jobs), and they save where this process loads from (``NEUSIGHT_TRAINED``)."""
    import os
    env = {"TQDM_DISABLE": "1", "NEUSIGHT_TRAINED": str(paths.trained_dir())}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# records per op class that the full NeuSight recipes train on (the authors' filter applied): only for
# ordering jobs by their cost
_ROWS_HINT = {OpClass.BMM: 88_000, OpClass.LINEAR: 32_000, OpClass.VEC: 8_300, OpClass.SOFTMAX: 1_500, OpClass.LAYERNORM: 1_500}


def training_cost(name: str, quick: bool = False, seed: int = 0, config: dict | None = None,
                  rows: int | None = None) -> float:
    """A rough relative cost of training a job (epochs x records x MLP multiply-adds per record, summed
    over op classes), used only to start the longest jobs first. Baselines and quick jobs are cheap."""
    from neusight_core.predictors.neusight import NeuSightPredictor, per_class
    p = create(name, seed, config)
    if not isinstance(p, NeuSightPredictor) or quick:
        return 0.0
    c = p.config
    total = 0.0
    for cls, n in _ROWS_HINT.items():
        h, layers = per_class(c["hidden"], cls), per_class(c["layers"], cls)
        n = min(n, int(rows)) if rows else n
        total += per_class(c["epochs"], cls) * n * h * h * max(layers - 2, 1) * p._members(cls)
    return total


# ----------------------------------------------------------------------------- which weights answer
WEIGHTS = ("auto", "full", "quick")


def trains_long(name: str) -> bool:
    """The NeuSight recipes train for minutes to half an hour per seed on 2 cores (docs/recipes.md);
    the baselines train in seconds."""
    from neusight_core.predictors.neusight import NeuSightPredictor
    return isinstance(create(name), NeuSightPredictor)


def choose_quick(name: str, seed: int = 0, weights: str = "auto") -> bool:
    """Whether a question is answered with the quick weights. ``auto``: the full weights when they are
    trained (or train in seconds), else the quick ones, which train in seconds, so that a first question
    never starts half an hour of training unasked; full weights that are there but damaged count as missing
    (one line on stderr names the file); ``full`` / ``quick`` force one."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    if weights != "auto":
        return weights == "quick"
    if not trains_long(name):
        return False
    damage = full_weights_damage(name, seed)
    if damage:
        # weights that match but cannot be read are as good as missing; ``get`` would retrain them
        # (hours for the full recipes), which a question never starts unasked. --full (or ``train``) retrains.
        _say_damaged(name, damage)
        return True
    return not is_trained(name, False, seed)


def full_weights_damage(name: str, seed: int = 0) -> str | None:
    """Why the full weights of ``name`` / ``seed`` cannot be used although their folder is there (one line naming
    the file: ``meta.json`` unreadable, or ``state.npz`` truncated / damaged), or None (they load, or the folder
    holds no weights at all). Stale weights (another config or training data) are not damage: ``get`` retrains
    them like missing ones. Reads the whole state.npz (a few MB), as loading it would."""
    f = folder(name, False, seed)
    meta = f / "meta.json"
    if not meta.exists() and not (f / STATE_FILE).exists():
        return None
    try:
        json.loads(meta.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"{meta}: cannot read ({type(e).__name__})"
    if not is_trained(name, False, seed):
        return None
    try:
        read_state(f, keep=True)       # the load that follows takes this state instead of reading it again
    except PredictorLoadError as e:
        return str(e).splitlines()[0]
    return None


def _say_damaged(name: str, damage: str) -> None:
    # one line on stderr (a warning's default format would add a source line): what is damaged, what answers
    print(f"warning: the full `{name}` weights are damaged ({damage}); answering with the quick weights; "
          f"`{paths.python_command()} -m neusight_core train --predictor {name}` or --full retrains them", file=sys.stderr, flush=True)


def quick_note(name: str, how_full: str) -> str:
    """The line said when a question is answered with the quick weights because the full ones are not trained
    (the CLI on stderr, ``latency.predict_model`` as a warning); ``how_full``: how this caller asks for them."""
    return (f"the full `{name}` weights are not trained here; answering with the quick ones (higher kernel error, "
            f"docs/recipes.md). Full weights: `{paths.python_command()} -m neusight_core train --predictor {name}` "
            f"({full_training_estimate(name)}), then ask again, or {how_full}.")


def auto_quick(names, seeds=(0,), how_full: str = "pass quick=False", say=None) -> bool:
    """``choose_quick`` of a question that does not say which weights (the CLI without --quick / --full; Python
    with ``quick=None``): quick for all when any named predictor x seed is answered quick, with one ``quick_note``
    per predictor whose full weights are missing, given to ``say`` (default: a warning). Objects among ``names``
    (trained predictors) are skipped, and so are unknown names: the engine records their error in their rows,
    and the other predictors answer."""
    known = set(registry_names())
    names = [n for n in names if isinstance(n, str) and n in known]
    quick = any(choose_quick(n, int(s), "auto") for n in names for s in seeds)
    if quick:
        for n in dict.fromkeys(names):
            if trains_long(n) and any(not is_trained(n, False, int(s)) for s in seeds):
                if say is None:
                    warnings.warn(quick_note(n, how_full), stacklevel=3)
                else:
                    say(quick_note(n, how_full))
    return quick


def full_training_estimate(name: str) -> str:
    """How long training one full seed of ``name`` took here before (from saved weights' meta.json),
    or the range measured in docs/recipes.md."""
    times = []
    for f in paths.trained_dir().glob(f"{name}-seed*/meta.json"):
        try:
            t = json.loads(f.read_text()).get("info", {}).get("train_seconds")
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(t, (int, float)) and t > 0:
            times.append(t)
    if times:
        return f"about {min(times) / 60:.0f}-{max(times) / 60:.0f} min per seed (earlier seeds on this machine)"
    import os
    many = (os.cpu_count() or 1) > 6
    return ("about 8-30 min per seed on 2 cores, measured 460-1,650 s (docs/recipes.md)"
            + ("; here every network of every seed trains side by side on the cores (16 cores: about 8 min for "
               "both recipes' three seeds, extrapolated from a 190 s run, docs/evaluators.md)" if many else ""))


def describe(p: KernelPredictor, quick: bool) -> dict:
    """What answered: predictor, recipe file, seed, quick or full weights, their folder and training time."""
    recipe = Path(__file__).parent / "recipes" / f"{p.name}.yaml"
    f = folder(p.name, quick, p.seed)
    if not p.has_weights:
        return {"predictor": p.name, "seed": int(p.seed), "weights": "none (nothing to train)", "recipe": None,
                "folder": None, "config_hash": None, "train_seconds": None, "trained_on": None}
    return {"predictor": p.name, "seed": int(p.seed), "weights": "quick" if quick else "full",
            "recipe": str(recipe.relative_to(paths.REPO_ROOT)) if recipe.is_file() else None,
            "folder": str(f) if (f / "meta.json").is_file() else None,
            "config_hash": config_hash(p.name, {**p.config, "seed": p.seed})[:12],
            "train_seconds": (p.info or {}).get("train_seconds"),
            "trained_on": (p.info or {}).get("trained_on")}


def describe_line(d: dict) -> str:
    trained = f", trained in {d['train_seconds']:.0f} s" if d.get("train_seconds") else ""
    trained += f" on {d['trained_on'].split(' (')[0]}" if trained and d.get("trained_on") else ""
    where = f"; {d['folder']}" if d.get("folder") else ""
    recipe = f", recipe {d['recipe']}" if d.get("recipe") else ""
    if d["weights"].startswith("none"):
        return f"{d['predictor']}: no weights (nothing to train)"
    return f"{d['predictor']} seed {d['seed']}, {d['weights']} weights{recipe}{trained}{where}"


def _freeze(config):
    return None if config is None else json.dumps(config, sort_keys=True)


def _thaw(frozen):
    return None if frozen is None else json.loads(frozen)


def get(name: str, quick: bool = False, seed: int = 0, config: dict | None = None,
        retrain: bool = False, rows: int | None = None) -> KernelPredictor:
    """Load trained weights if config + data checksum are unchanged, else train and save.

    ``rows``: train on a fixed random subset of that many records per op class (the ablation's CPU
    budget), with the recipe's own epochs, or with the quick epochs when ``quick``; ``quick`` alone uses
    the quick subset (4,000 records per class) and the quick epochs."""
    from neusight_core.data import dataset
    p = create(name, seed, config)
    subset = dict(quick=True, quick_rows=int(rows)) if rows else dict(quick=quick)
    f = folder(name, quick, seed, config, rows)
    if not retrain and is_trained(name, quick, seed, config, rows):
        try:
            return _completed(load(name, f), f, quick)
        except (PredictorLoadError, json.JSONDecodeError, KeyError) as e:
            # damaged: one line naming the file, then retrain below and save over it
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            msg = msg if isinstance(e, PredictorLoadError) else f"{f}: {type(e).__name__}: {msg}"
            warnings.warn(f"predictors: ignoring damaged weights of {name!r} ({msg}); retraining", CacheWarning,
                          stacklevel=2)
    with training_lock(f):
        # another process (a test worker, a second terminal) may have trained these weights while this one waited
        if not retrain and is_trained(name, quick, seed, config, rows):
            try:
                return _completed(load(name, f), f, quick)
            except (PredictorLoadError, json.JSONDecodeError, KeyError):
                pass                # damaged again: said above; retrain
        train = dataset.training_data(**subset)
        _fit(p, train, quick)
        p.save(f)
    return p


# ----------------------------------------------------------------------------- what the trainer hands over
def data_for(p: KernelPredictor, train):
    """``train`` (``dataset.TrainingData``) with what ``p.data_wanted()`` asks for read and added: NVIDIA's measured
    kernels of the training GPUs, the release's test-set rows of the training GPUs. The trainer reads the files so
    that a predictor reads none."""
    import dataclasses
    want, extra = p.data_wanted(), {}
    if "measured" in want and train.measured is None:
        from neusight_core.data import measured_kernels
        extra["measured"] = measured_kernels.training_kernels(want["measured"])
    if "seen_test" in want and train.seen_test is None:
        from neusight_core.data import dataset
        extra["seen_test"] = dataset.seen_test_kernels(want["seen_test"])
    return dataclasses.replace(train, **extra) if extra else train


_LAW: dict | None = None


def memory_law_params() -> dict:
    """The memory law's numbers (``memory_law.fit``) on the training GPUs' measured kernels
    (``measured_kernels.load_quantize``), read once per package version and kept with the traces (``trace_cache``),
    or ``memory_law.DEFAULT_LAW`` without the database."""
    global _LAW
    if _LAW is None:
        import pandas as pd

        from neusight_core.data import measured_kernels
        import neusight_core.predictors.memory_law as memory_law
        from neusight_core.tracing import trace_cache
        if measured_kernels.unavailable():
            _LAW = dict(memory_law.DEFAULT_LAW)
        else:
            key = {"kind": "memory-law", "package": measured_kernels.package_version() or "",
                   "root": str(measured_kernels.data_root()), "l2_share": memory_law.L2_SHARE}
            f = trace_cache.cached(key, lambda: pd.DataFrame([memory_law.fit(measured_kernels.load_quantize("training"))]))
            _LAW = {c: float(f[c].iloc[0]) for c in memory_law.DEFAULT_LAW}
    return _LAW


def hand_over(p: KernelPredictor) -> KernelPredictor:
    """``p`` with what it uses at prediction time and does not save: the memory law's numbers (read when first
    needed), for a predictor with tensor-core networks."""
    if getattr(p, "tc", None) is not None:
        p.memory_law = memory_law_params
    return p


# ----------------------------------------------------------------------------- BF16 networks without their data
# The recipe ``neusight`` also trains BF16 tensor-core networks on the measured-kernel database of the optional
# package aiconfigurator-core (``measured_kernels``). Without it the FP32 networks are trained
# and saved as usual; the weights record why the BF16 networks are absent (meta.json info.tensor_core.missing),
# their BF16 / FP16 GEMM and attention rows are refused in one line naming the package, and once the package is
# there the next ``get`` trains the BF16 networks alone (seeded apart from the FP32 classes, so they are the ones
# a whole training gives: seconds quick, about a minute full) and saves them beside the FP32 ones.
def _tensor_core_missing(p: KernelPredictor) -> str | None:
    """Why ``p``'s BF16 tensor-core networks cannot be trained here, or None (none in its recipe, or the data is there)."""
    if getattr(p, "tc", None) is None:
        return None
    from neusight_core.data import measured_kernels
    return measured_kernels.unavailable()


def _refusal(p: KernelPredictor, why: str) -> str:
    return (f"{p.name} seed {p.seed}: no BF16 tensor-core networks in these weights ({why}); FP32 questions answer, "
            f"BF16 / FP16 GEMM and attention rows need the networks: install the package and ask again")


def _fit(p: KernelPredictor, train, quick: bool) -> None:
    """``p.fit``, checked first: without the measured-kernel database the FP32 networks alone (see above)."""
    why = _tensor_core_missing(p)
    # before fitting too: the FP8 GEMM network trains beside its activations' quantisation, timed by the memory law
    hand_over(p)
    if not why:
        p.fit(data_for(p, train), quick=quick)
    else:
        _fit_without_tensor_core(p, train, quick, why)
    # what the weights were trained on: ``is_trained`` compares it, so a predictor's ``fit`` need not record it
    p.info["data_checksum"] = getattr(train, "checksum", None)
    # where it trained: the weights' meta.json, `describe` and SUMMARY.md say it
    if p.trains_mlps:
        from neusight_core.predictors.nets import device_label
        p.info["trained_on"] = device_label()
    else:
        p.info["trained_on"] = "cpu (numpy)"
    hand_over(p)


def _fit_without_tensor_core(p: KernelPredictor, train, quick: bool, why: str) -> None:
    print(f"note: training {p.name} seed {p.seed} without its BF16 tensor-core networks ({why})",
          file=sys.stderr, flush=True)
    tc, p.tc = p.tc, None
    try:
        p.fit(data_for(p, train), quick=quick)
    finally:
        p.tc = tc
    p.info["tensor_core"] = {"missing": why}
    p.missing_networks = _refusal(p, why)


def _completed(p: KernelPredictor, f: Path, quick: bool) -> KernelPredictor:
    """Loaded weights saved without their BF16 networks: refused for BF16 rows while the database is still missing,
    else completed (the BF16 networks trained and saved into ``f``)."""
    tc_info = (p.info or {}).get("tensor_core")
    if getattr(p, "tc", None) is None or not isinstance(tc_info, dict) or "missing" not in tc_info:
        return p
    why = _tensor_core_missing(p)
    if why:
        p.missing_networks = _refusal(p, why)
        return p
    print(f"note: {f}: training the BF16 tensor-core networks these weights were saved without "
          f"({'seconds' if quick else 'about a minute'})", file=sys.stderr, flush=True)
    from neusight_core.data import measured_kernels
    p.info["tensor_core"] = p.tc.fit(measured_kernels.training_kernels(p.tc.config["networks"]), quick=quick,
                                     law=p.law_numbers())
    p.missing_networks = None
    p.save(f)
    return p


@contextlib.contextmanager
def training_lock(f: Path):
    """Hold an exclusive lock on the weights folder ``f`` while training it, so that two processes that need the
    same weights train them once: the second waits, then loads what the first saved. The lock file sits beside
    the folder (``.<name>.lock``); the kernel releases it when its holder exits, however it exits."""
    try:
        import fcntl
    except ImportError:         # no flock (Windows): train without it, as before
        yield
        return
    f.parent.mkdir(parents=True, exist_ok=True)
    with open(f.parent / f".{f.name}.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def load(name: str, f: Path) -> KernelPredictor:
    """The predictor ``name`` saved in folder ``f`` (``KernelPredictor.save``); PredictorLoadError (one line naming
    the folder) when it cannot be read or holds another predictor."""
    f = Path(f)
    try:
        meta = json.loads((f / "meta.json").read_text())
        state = read_state(f)
    except PredictorLoadError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise PredictorLoadError(f"{f}: cannot load saved predictor ({str(e).splitlines()[0]})") from None
    if meta.get("name") != name:
        raise PredictorLoadError(f"{f}: holds predictor {meta.get('name')!r}, not {name!r}")
    p = create(name, seed=meta.get("seed", 0), config=meta["config"])
    p.set_state(state)
    p.info = meta.get("info", {})
    p.fitted = True
    return hand_over(p)
