"""On-disk cache of kernel tables (docs/interfaces.md, "Trace cache").

A traced kernel table depends on the model config's content, the step's fields the trace reads (batch, size,
mode, past, dtype, attention -- every field of the ``question.step.Step`` but those applied after the trace, so a
new option becomes part of the key without a change here), the table transforms applied after
tracing (fusion, parallel plan) and the code that produced it (torch and transformers versions, a
hash of the tracer's source files). All of that goes into one JSON-able *key dict*; its SHA-256
names the cache file. Invalidation is by key only: change anything and a new entry is written;
nothing is ever deleted by hand.

Entries live in ``$NEUSIGHT_TRACE_CACHE`` or ``<NEUSIGHT_HOME>/artifacts/trace_cache/``
(git-ignored), one data-only ``.npz`` per key (``datafile.write_frame``: the frame's columns, dtypes,
index and attrs as arrays and JSON, the key as its meta, a SHA-256 of the content; read with
``np.load(allow_pickle=False)``, so nothing in an entry can run code). They are written atomically
(temporary file in the same folder, then ``os.replace``). An entry that cannot be read (not an
archive, truncated), whose checksum does not match its content or whose stored key differs from the
requested one is ignored with one warning line and rebuilt (the rebuilt entry replaces it). Entries
of earlier versions (``*.pkl`` pickles) are never read: the file name and ``CACHE_VERSION`` changed.

A cache hit reads the config file and the entry only: ``transformers`` is not imported (its
version comes from the installed package's metadata).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import warnings
from collections import Counter
from pathlib import Path

import pandas as pd

from neusight_core.data import configs, datafile
from neusight_core.tracing import table_info
from neusight_core.question.schema import Grads
from neusight_core import paths

#: bump when the layout of a cache entry changes (2: data-only .npz instead of a pickle; 3: the table's metadata
#: one ``table_info.TableInfo`` instead of loose ``attrs`` keys)
CACHE_VERSION = 3
#: source files whose content changes kernel tables: part of every key
CODE_FILES = ("tracing/trace.py", "tracing/shape_memo.py", "tracing/aten_ops.py", "tracing/fused_attention.py",
              "tracing/meta_device_model.py", "data/configs.py", "plans/fusion.py", "plans/parallel.py",
              "plans/parallel_experts.py")

#: hits / misses / corrupt entries / stores of this process (tests and benchmarks read it)
STATS: Counter = Counter()


class TraceCacheWarning(datafile.CacheWarning):
    pass


def cache_dir() -> Path:
    env = os.environ.get("NEUSIGHT_TRACE_CACHE")
    return Path(env).expanduser().resolve() if env else paths.home() / "artifacts" / "trace_cache"


@functools.lru_cache(maxsize=1)
def versions() -> dict:
    """torch / transformers versions (from the installed packages' metadata: neither is imported) and a
    hash of the tracing code."""
    import importlib.metadata as md

    def version(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "absent"
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent.parent           # the package: CODE_FILES are named from it
    for f in CODE_FILES:
        p = here / f
        h.update(f.encode())
        h.update(p.read_bytes() if p.is_file() else b"")
    return {"cache": CACHE_VERSION, "torch": version("torch"), "transformers": version("transformers"),
            "code": h.hexdigest()[:16]}


#: fields of a step applied to its traced table afterwards (``plans/``): the key of a planned table, not of the trace
AFTER_TRACE = ("fusion", "parallel", "gpus", "micro_batches")
#: fields of a step the trace's key does not take as they are: the model (hashed by content), its size (one ``seq``:
#: the sequence length or the image side), and its gradients (the cache traces the accumulating step; ``engine``
#: drops a fresh step's ``acc`` rows, so both share their entry)
NOT_KEYED = ("model", "seq", "image_size", "grads")


def trace_kwargs(step) -> dict:
    """The trace's part of the cache key of a :class:`question.step.Step`: its size as ``seq``, every field the trace
    reads (batch, mode, past, dtype, attention, and any table field declared since), the accumulating gradients and
    the authors' heads the cache traces with."""
    out = {f.name: getattr(step, f.name) for f in dataclasses.fields(step)
           if f.name not in NOT_KEYED and f.name not in AFTER_TRACE}
    out.update(seq=step.size, accumulate_grads=True, authors_heads=True)
    return {k: (int(v) if hasattr(v, "__index__") and not isinstance(v, bool) else v) for k, v in out.items()}


def table_fields(step) -> dict:
    """The fields of a step its kernel table is built with after the trace: fusion, the plan, its GPUs and
    micro-batches (``AFTER_TRACE``)."""
    return {name: getattr(step, name) for name in AFTER_TRACE}


def make_key(kind: str, model, **fields) -> dict:
    return {"kind": kind, "config": configs.config_content(model), **fields, "versions": versions()}


def key_hash(key: dict) -> str:
    body = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def _canonical(key: dict) -> str:
    """The key as the JSON text that is stored in (and compared with) an entry."""
    return json.dumps(key, sort_keys=True, default=str)


def entry_path(key: dict) -> Path:
    return cache_dir() / f"{key['kind']}-{key_hash(key)[:40]}.npz"


def load(key: dict) -> pd.DataFrame | None:
    """The cached frame of ``key``, or None (miss; a damaged entry warns once and counts as a miss)."""
    p = entry_path(key)
    if not p.is_file():
        STATS["miss"] += 1
        return None
    try:
        frame, stored_key = datafile.read_frame(p)
        if stored_key != _canonical(key):
            raise datafile.DataFileError("stored key differs")
    except datafile.DataFileError as e:      # any damage: ignore the entry, rebuild it
        STATS["corrupt"] += 1
        STATS["miss"] += 1
        warnings.warn(f"trace cache: ignoring damaged entry {p.name} ({e}); rebuilding it", TraceCacheWarning,
                      stacklevel=3)
        return None
    STATS["hit"] += 1
    return frame


def store(key: dict, frame: pd.DataFrame) -> Path:
    """Write ``frame`` under ``key`` atomically (temp file + rename); a failure to write is not fatal."""
    p = entry_path(key)
    try:
        datafile.write_frame(p, frame, meta=_canonical(key))
    except (OSError, datafile.DataFileError) as e:
        warnings.warn(f"trace cache: cannot write {p} ({e}); continuing without caching", TraceCacheWarning,
                      stacklevel=3)
        return p
    STATS["store"] += 1
    return p


def cached(key: dict, build):
    """``load(key)`` or ``build()`` and store it."""
    if os.environ.get("NEUSIGHT_TRACE_CACHE_OFF"):
        return build()
    frame = load(key)
    if frame is None:
        frame = build()
        store(key, frame)
    return frame


def canonical_buffers(kernels: pd.DataFrame) -> pd.DataFrame:
    """Replace the process-specific buffer keys of ``reads`` / ``writes`` by first-use numbers.

    The tracer names buffers by storage address; only equality matters (fusion), so numbering them
    in order of first appearance gives the same table from every process and every run.
    """
    if "reads" not in kernels or "writes" not in kernels:
        return kernels
    ids: dict = {}

    def ren(t):
        return tuple([(ids.setdefault(k, len(ids)), b) for k, b in t])

    reads, writes = [], []
    for r, w in zip(kernels["reads"].tolist(), kernels["writes"].tolist()):
        reads.append(ren(r))
        writes.append(ren(w))
    out = kernels.copy()
    out["reads"] = reads
    out["writes"] = writes
    return table_info.carry(out, kernels)


_SHARED_MODELS: dict | None = None      # the models that traces within ``reusing_models`` share (trace.reusing_models)


@contextlib.contextmanager
def reusing_models():
    """Traces built within share their meta models (``trace.reusing_models``); a cache hit builds none, and
    torch is not imported here for it."""
    global _SHARED_MODELS
    outer = _SHARED_MODELS
    if outer is None:
        _SHARED_MODELS = {}
    try:
        yield
    finally:
        if outer is None:
            _SHARED_MODELS = None


class NotCached(LookupError):
    """``trace`` within ``cached_only``: the table is not in the cache (nothing was traced)."""


_CACHED_ONLY = False


@contextlib.contextmanager
def cached_only():
    """Within: ``trace`` answers only what the cache holds and raises NotCached for the rest, so that work that needs
    no new trace is found without importing torch (``family_pool.build`` builds such families in its own process)."""
    global _CACHED_ONLY
    outer, _CACHED_ONLY = _CACHED_ONLY, True
    try:
        yield
    finally:
        _CACHED_ONLY = outer


def trace(step) -> pd.DataFrame:
    """``trace.trace_model`` of a :class:`step.Step` through the cache (the same table; buffer keys renumbered)."""
    args = trace_kwargs(step)
    key = make_key("trace", step.model, **args)
    if _CACHED_ONLY and (os.environ.get("NEUSIGHT_TRACE_CACHE_OFF") or not entry_path(key).exists()):
        raise NotCached(f"not in the trace cache: {entry_path(key).name} (batch {step.batch}, size {step.size})")

    def build():
        from neusight_core.tracing import trace as _trace
        with _trace.reusing_models(_SHARED_MODELS):
            return canonical_buffers(_trace.trace_model(step.replace(grads=Grads.ACCUMULATE)))

    return cached(key, build)
