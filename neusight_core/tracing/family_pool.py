"""Several shape-derivation families built at once, one per worker process.

A sweep of the paper's six models asks for 24 families (model x mode x batch 1 or more). Each is 4 to 10
traces of a reduced model, 0.2 to 8.5 s on this project's 2-core machine, and they were built one after
another on one core. They are independent, so where more than one core is free they are built in forked
worker processes and sent back whole; ``table_families.family`` then finds them memoised. A family is
deterministic (sample traces of a config on meta tensors), so where it was built changes none of its
tables (tests/test_derive_pool.py compares them).

Forked, not spawned: a spawned worker re-imports the caller's main script, and a user's script without an
``if __name__ == "__main__":`` guard would run its whole sweep again in every worker. A forked worker
inherits what the parent imported (torch, transformers' model code: about 5 s saved per worker) and traces on meta
tensors only, which never enter torch's thread pools (as a DataLoader worker, forked after the parent
computed, does more than that); none once CUDA is initialised here, whose context a forked child must not
inherit. ``NEUSIGHT_TRACE_WORKERS`` caps the workers (1: build in this process).
"""
from __future__ import annotations

import os
import sys
import warnings

import pandas as pd

from neusight_core.data import configs
from neusight_core.tracing import table_families, trace_cache
from neusight_core.question.schema import Mode

MIN_FAMILIES = 4     # below this, a pool saves less than a second


def worker_count(todo: int, workers: int | None = None) -> int:
    """Processes to build ``todo`` families in: at most the CPUs, ``NEUSIGHT_TRACE_WORKERS`` and ``todo``."""
    if workers is None:
        env = os.environ.get("NEUSIGHT_TRACE_WORKERS", "").strip()
        try:
            workers = int(env) if env else (os.cpu_count() or 1)
        except ValueError:
            raise ValueError(f"NEUSIGHT_TRACE_WORKERS must be a whole number, not {env!r}") from None
    return max(1, min(int(workers), todo))


def _build(spec: dict, points: list) -> table_families.Family:
    """The family, with its compact table at ``points`` made here too (``compact``): the caller's last serial step
    before predicting, done on the workers' cores while the other families are still being built."""
    fam = table_families.family(**spec)
    if points and isinstance(fam, table_families.Family) and fam.ok:
        fam._pool_compact = (tuple(points), fam.compact(points))
    return fam


def compact(fam: table_families.Family, points) -> pd.DataFrame:
    """``fam.compact(points)``: the table a worker made beside the family when it was built for these points (taken
    once: the caller changes it), else computed now."""
    made = fam.__dict__.pop("_pool_compact", None)
    if made is not None and made[0] == tuple(points):
        return made[1]
    return fam.compact(points)


def _worker_start() -> None:
    """A worker's first step: freeze what is alive (the caller imported what every trace needs before forking).

    Python's collector walks every tracked object in its oldest generation: here the million or so objects of
    torch's and transformers' modules, which never become garbage. Tracing allocates enough to run that walk
    again and again; it took 1.6 of the 15 CPU-seconds of the paper models' 24 families (measured with gc
    callbacks), 0.3 s once those objects are frozen. Only in the worker, which ends with the pool: a caller
    that goes on (a notebook) keeps its collector as it was. Reference counting frees what it frees as before,
    and the tables are the same (tests/test_derive_pool.py)."""
    import gc

    gc.freeze()
    gc.enable()      # forked from an engine call, which pauses the collector (gc_pause.py): a worker collects as before


def _build_cached(todo: list) -> list:
    """Build here the families whose traces are all in the trace cache; the rest, to trace. A second sweep of the same
    grid found every family's traces cached, yet imported torch and transformers' model code (3.5-4 s) to fork
    workers that only read them; reading them here needs neither (1-2 s for the 24 families of the paper models)."""
    left = []
    with trace_cache.cached_only():
        for key, spec in todo:
            try:
                table_families.family(**spec)          # memoised where the engine finds it
            except Exception:  # noqa: BLE001 - NotCached, or any failure: built later as before (workers or caller)
                pass
            if key not in table_families.FAMILIES:
                left.append((key, spec))
    return left


def _cost(spec: dict) -> int:
    """Rough order of a family's cost, to start the longest first: Switch Transformers' families trace
    an encoder and a decoder at four seq samples and two check points (5 to 8 s here), the others 0.2-1.1 s."""
    content = configs.config_content(spec["model"])
    return (2 if configs.expert_tokens_fn(content) else 1) * (2 if spec["mode"] == Mode.TRAIN else 1) \
        * (1 if spec.get("batch_one") else 2)


def build(specs: list[dict], workers: int | None = None, progress: bool = False) -> int:
    """Build the families of ``specs`` (``table_families.family``'s arguments, each with the ``point`` (batch, seq) the caller
    will ask of it in ``compact``, or none) that are not yet memoised, in worker
    processes when there are at least ``MIN_FAMILIES`` of them and more than one worker; returns how many
    were built in workers (0: the caller's loop builds them as before, one at a time).

    A worker that fails (a broken pool, out of memory) costs nothing but time: the families it did not
    return are built by the caller, in this process, when it asks for them."""
    todo, seen, points = [], set(), {}
    for spec in specs:
        spec = dict(spec)
        point = spec.pop("point", None)       # a (batch, seq) the caller will ask of the family, in its order
        key = table_families.family_key(**spec)
        if point is not None:
            points.setdefault(key, []).append(point)
        if key not in table_families.FAMILIES and key not in seen:
            seen.add(key)
            todo.append((key, spec))
    todo = _build_cached(todo)
    n = worker_count(len(todo), workers)
    torch = sys.modules.get("torch")
    if len(todo) < MIN_FAMILIES or n < 2 or (torch is not None and torch.cuda.is_initialized()):
        return 0          # (a forked child must not inherit a CUDA context: notebook 05 after timing on the GPU)
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from tqdm.auto import tqdm

    # torch and transformers' model code (about 2.5 s each) imported once, here, before forking: every worker
    # shares these pages instead of importing its own copy (it did: 2 x 2.5 CPU-s on 2 cores for the same wall time)
    from neusight_core.tracing import trace  # noqa: F401
    import transformers.modeling_utils  # noqa: F401
    todo.sort(key=lambda ks: -_cost(ks[1]))
    built = 0
    bar = tqdm(total=len(todo), desc=f"model families ({n} processes)", disable=not progress, leave=False)
    try:
        with ProcessPoolExecutor(n, mp_context=mp.get_context("fork"), initializer=_worker_start) as ex:
            futures = {ex.submit(_build, spec, points.get(key, [])): key for key, spec in todo}
            for f in as_completed(futures):
                try:
                    table_families.FAMILIES[futures[f]] = f.result()
                    built += 1
                except Exception:  # noqa: BLE001 - built again in this process when asked for
                    pass
                bar.update()
    except Exception as e:  # noqa: BLE001 - the pool itself failed to start or broke: same fallback
        warnings.warn(f"model families: the worker pool failed ({type(e).__name__}: {e}); the rest are built "
                      "in this process", RuntimeWarning, stacklevel=2)
    finally:
        bar.close()
    return built
