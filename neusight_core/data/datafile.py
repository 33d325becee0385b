"""Data-only files for the caches (a cache must never execute what it finds).

:func:`write_frame` stores a DataFrame (values, dtypes, index, column labels, ``attrs``) plus a small
JSON-able ``meta`` (e.g. a cache key) as one ``.npz`` that is read back with
``np.load(allow_pickle=False)``: nothing in the file can run code on load (no pickle anywhere), and
a file that was damaged or changed is detected. Used by the trace cache (``trace_cache.py``) and the
training-record cache (``dataset.load_collect``); trained weights (``predictors/base.py``) use
:func:`atomic_savez`.

Members of the ``.npz``:

* ``__header__``: UTF-8 JSON (as a uint8 array): format version, ``meta``, the columns in order with
  how each is stored, the index, the column labels and ``frame.attrs``;
* one or two arrays per column: numpy columns (int, uint, float, bool, complex, datetime, timedelta)
  as their array, dtype kept; string columns (pandas ``str`` / ``string``) as int64 codes plus the
  distinct strings as JSON (missing = code -1, restored as the dtype's own NA); categoricals as
  their codes plus the categories (stored like a column), ``ordered`` kept; object columns whose every cell
  is a tuple of (int, int) tuples (a trace's ``reads`` / ``writes``) as the cells' lengths plus the pairs;
  other object columns (tuples, mixed values) as JSON of the values;
* arrays found in ``attrs`` (and the fields of :data:`DECODABLE_CLASSES`, e.g. ``schema.MemoryTimeline``) as
  their own members;
* ``__sha256__``: SHA-256 over the header and every other member (name, dtype, shape, bytes).

Values in JSON keep their type: tuples, sets, dicts with non-string keys, numpy scalars and the
classes of :data:`DECODABLE_CLASSES` are tagged; decoding builds only those (an object of :data:`DECODABLE_CLASSES` gets
its attributes set; none of its code runs). Any other type is refused when writing.

:func:`read_frame` raises :class:`DataFileError` (one line) for anything wrong: not a zip, truncated,
a checksum mismatch, a missing or extra member, a malformed header. Callers warn once and rebuild.
Writes are atomic (temporary file in the same folder, then ``os.replace``).
"""
from __future__ import annotations

import hashlib
import importlib
import io
import json
import math
import os
import re
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

FORMAT = 1
#: classes that may appear in attrs, stored as their ``__dict__`` (name -> module)
DECODABLE_CLASSES = {"MemoryTimeline": "neusight_core.question.schema", "TableInfo": "neusight_core.tracing.table_info"}
_TAG = "__t"
_NUMPY_KINDS = "biufcmM"


class DataFileError(ValueError):
    """A data file that cannot be used: unreadable, truncated, changed (checksum) or malformed."""


class CacheWarning(UserWarning):
    """A damaged cache entry (or weights file) that is ignored and rebuilt."""


# ---------------------------------------------------------------- plain values <-> tagged JSON
def _enc(v, arrays: dict):
    t = type(v)
    if v is None or t in (bool, int, float, str):
        return v
    if isinstance(v, str):          # an enum of the vocabulary (schema.OpClass, Precision): stored as its text
        return str(v)
    if isinstance(v, np.generic):
        if v.dtype.kind not in "biufU":
            raise DataFileError(f"cannot store a numpy {v.dtype} scalar")
        return {_TAG: "np", "dtype": v.dtype.str, "v": v.item()}
    if t is list:
        return [_enc(x, arrays) for x in v]
    if t in (tuple, set, frozenset):
        return {_TAG: t.__name__, "v": [_enc(x, arrays) for x in v]}
    if t is dict:
        if all(isinstance(k, str) for k in v) and _TAG not in v:
            return {str(k): _enc(x, arrays) for k, x in v.items()}
        return {_TAG: "dict", "v": [[_enc(k, arrays), _enc(x, arrays)] for k, x in v.items()]}
    if t is np.ndarray:
        if v.dtype.kind not in _NUMPY_KINDS + "U":
            raise DataFileError(f"cannot store an array of dtype {v.dtype}")
        name = f"a{len(arrays)}"
        arrays[name] = v
        return {_TAG: "ndarray", "v": name}
    if DECODABLE_CLASSES.get(t.__name__) == t.__module__:
        return {_TAG: "obj", "cls": t.__name__, "v": _enc(dict(vars(v)), arrays)}
    raise DataFileError(f"cannot store a value of type {t.__name__}")


def _decoder(arrays: dict):
    def hook(d: dict):
        tag = d.get(_TAG)
        if tag is None:
            return d
        v = d["v"]
        if tag == "tuple":
            return tuple(v)
        if tag == "set":
            return set(v)
        if tag == "frozenset":
            return frozenset(v)
        if tag == "dict":
            return {k: x for k, x in v}
        if tag == "np":
            dt = np.dtype(d["dtype"])
            if dt.kind not in "biufU":
                raise DataFileError(f"numpy scalar of dtype {dt}")
            return dt.type(v)
        if tag == "ndarray":
            return arrays[v]
        if tag == "obj" and d["cls"] in DECODABLE_CLASSES and isinstance(v, dict):
            cls = getattr(importlib.import_module(DECODABLE_CLASSES[d["cls"]]), d["cls"])
            obj = object.__new__(cls)
            obj.__dict__.update(v)
            return obj
        raise DataFileError(f"unknown tag {tag!r}")
    return hook


def _json_bytes(x) -> np.ndarray:
    return np.frombuffer(json.dumps(x, separators=(",", ":")).encode(), dtype=np.uint8)


def _json_load(a: np.ndarray, arrays: dict):
    return json.loads(a.tobytes().decode(), object_hook=_decoder(arrays))


# ---------------------------------------------------------------- columns
def _put(values, name: str, arrays: dict) -> dict:
    """Store one column (Series, Index or array) under ``name``; returns how it is stored."""
    s = pd.Series(values, copy=False) if not isinstance(values, pd.Series) else values
    dt = s.dtype
    if isinstance(dt, pd.CategoricalDtype):
        arrays[name] = np.asarray(s.cat.codes)
        return {"kind": "category", "ordered": bool(dt.ordered), "categories": _put(dt.categories, name + ".cat", arrays)}
    if isinstance(dt, pd.StringDtype):
        codes, uniques = pd.factorize(s, use_na_sentinel=True)
        arrays[name] = codes.astype(np.int64)
        arrays[name + ".u"] = _json_bytes(list(uniques))
        return {"kind": "string", "storage": dt.storage, "na": "nan" if dt.na_value is np.nan else "NA"}
    if isinstance(dt, np.dtype) and dt.kind in _NUMPY_KINDS:
        arrays[name] = s.to_numpy()
        return {"kind": "numpy", "dtype": dt.str}
    if isinstance(dt, np.dtype) and dt.kind == "O":
        values = s.tolist()
        if _int_pairs(values):        # a trace's buffer columns: two arrays instead of tagged JSON per tuple
            arrays[name] = np.array([len(c) for c in values], dtype=np.int64)
            arrays[name + ".pairs"] = np.array([p for c in values for p in c], dtype=np.int64).reshape(-1, 2)
            return {"kind": "int_pairs", "n": len(values)}
        cells = [_enc(v, arrays) for v in values]
        arrays[name] = _json_bytes(cells)
        return {"kind": "object", "n": len(cells)}
    raise DataFileError(f"cannot store column {s.name!r} of dtype {dt}")


def _int_pairs(values: list) -> bool:
    """Whether every cell is a tuple of (int, int) tuples in int64's range (the trace's ``reads`` / ``writes``:
    (buffer, bytes) per operand), Python ints only, so that they come back as they were."""
    lo, hi = -2 ** 63, 2 ** 63 - 1
    return bool(values) and all(
        type(c) is tuple and all(type(p) is tuple and len(p) == 2 and type(p[0]) is int and type(p[1]) is int
                                 and lo <= p[0] <= hi and lo <= p[1] <= hi for p in c) for c in values)


def _get(spec: dict, name: str, arrays: dict):
    """The array (numpy or pandas extension array) stored by ``_put``."""
    kind = spec["kind"]
    if kind == "numpy":
        a = arrays[name]
        if a.dtype.str != spec["dtype"] or a.ndim != 1:
            raise DataFileError(f"column {name}: dtype {a.dtype.str}, shape {a.shape}, header says {spec['dtype']}")
        return a
    if kind == "string":
        codes = arrays[name]
        uniques = _json_load(arrays[name + ".u"], arrays)
        if codes.dtype != np.int64 or not all(type(u) is str for u in uniques):
            raise DataFileError(f"column {name}: malformed string codes")
        dtype = pd.StringDtype(spec["storage"], na_value=np.nan if spec["na"] == "nan" else pd.NA)
        pool = np.array(uniques + [dtype.na_value], dtype=object)
        return pd.array(pool[codes], dtype=dtype)        # code -1: the last entry, NA
    if kind == "category":
        cats = pd.Index(_get(spec["categories"], name + ".cat", arrays))
        return pd.Categorical.from_codes(arrays[name], categories=cats, ordered=spec["ordered"])
    if kind == "int_pairs":
        counts, flat = arrays[name], arrays[name + ".pairs"]
        if (counts.dtype != np.int64 or counts.ndim != 1 or len(counts) != spec["n"] or (counts < 0).any()
                or flat.dtype != np.int64 or flat.shape != (int(counts.sum()), 2)):
            raise DataFileError(f"column {name}: malformed (buffer, bytes) pairs")
        pairs = list(map(tuple, flat.tolist()))
        out = np.empty(len(counts), dtype=object)
        ends = np.cumsum(counts).tolist()
        for i, (a, b) in enumerate(zip([0] + ends[:-1], ends)):
            out[i] = tuple(pairs[a:b])
        return out
    if kind == "object":
        cells = _json_load(arrays[name], arrays)
        if len(cells) != spec["n"]:
            raise DataFileError(f"column {name}: {len(cells)} values, header says {spec['n']}")
        out = np.empty(len(cells), dtype=object)
        for i, v in enumerate(cells):
            out[i] = v
        return out
    raise DataFileError(f"column {name}: unknown kind {kind!r}")


def _put_index(index: pd.Index, name: str, arrays: dict) -> dict:
    if isinstance(index, pd.MultiIndex):
        raise DataFileError("cannot store a MultiIndex")
    out = {"name": _enc(index.name, arrays)}
    if type(index) is pd.RangeIndex:
        return {**out, "kind": "range", "range": [index.start, index.stop, index.step]}
    return {**out, "kind": "values", "values": _put(index, name, arrays)}


def _get_index(spec: dict, name: str, arrays: dict) -> pd.Index:
    if spec["kind"] == "range":
        return pd.RangeIndex(*spec["range"], name=spec["name"])
    return pd.Index(_get(spec["values"], name, arrays), name=spec["name"], copy=False)


# ---------------------------------------------------------------- files
def _digest(names, members: dict) -> str:
    h = hashlib.sha256()
    for n in names:
        a = members[n]
        h.update(f"{n}:{a.dtype.str}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def atomic_savez(path: Path, members: dict) -> None:
    """``np.savez`` (no pickle) to a temporary file in ``path``'s folder, then ``os.replace``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, allow_pickle=False, **members)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# the header numpy writes for a plain array (``np.lib.format``); anything else is read by numpy itself
_NPY_HEADER = re.compile(r"\{'descr': '([<>|=]?[a-zA-Z]\d*)', 'fortran_order': False, 'shape': \(([\d, ]*)\), \} *\n?")


def load_npz(fh) -> dict:
    """Every member of an ``.npz`` that ``np.savez`` wrote, as ``np.load(fh, allow_pickle=False)`` gives them (object
    arrays refused). Plain arrays skip numpy's header parser (``ast.literal_eval`` per member: 30-40 ms of a weights
    file's 282 members, in every new process's first answer); zipfile still checks each member's CRC."""
    out = {}
    with zipfile.ZipFile(fh) as zf:
        for info in zf.infolist():
            if not info.filename.endswith(".npy"):
                raise ValueError(f"member {info.filename!r} is not an array")
            b = zf.read(info)
            if b[:6] != b"\x93NUMPY" or b[6] not in (1, 2, 3):
                raise ValueError(f"member {info.filename!r} is not an .npy array")
            start = 10 if b[6] == 1 else 12              # header length: 2 bytes in version 1, 4 after
            end = start + int.from_bytes(b[8:start], "little")
            m = _NPY_HEADER.fullmatch(b[start:end].decode("latin1"))
            if m is None:
                a = np.lib.format.read_array(io.BytesIO(b), allow_pickle=False)
            else:       # a writable array, as np.load gives
                dt, shape = np.dtype(m.group(1)), tuple(int(x) for x in m.group(2).split(",") if x.strip())
                if dt.hasobject:
                    raise ValueError(f"member {info.filename!r} holds Python objects (a pickle): refused")
                a = np.frombuffer(bytearray(b), dt, math.prod(shape), end).reshape(shape)
            out[info.filename[:-4]] = a
    return out


def write_frame(path, frame: pd.DataFrame, meta=None) -> None:
    """Write ``frame`` (and ``meta``: plain values) to ``path`` data-only, with a checksum, atomically.
    Raises DataFileError for a value it cannot store (nothing is written then)."""
    arrays: dict = {}
    header = {"format": FORMAT, "meta": _enc(meta, arrays), "rows": len(frame),
              "index": _put_index(frame.index, "index", arrays),
              "labels": _put_index(frame.columns, "labels", arrays),
              "columns": [_put(frame.iloc[:, i], f"c{i}", arrays) for i in range(frame.shape[1])],
              "attrs": _enc(dict(frame.attrs), arrays)}
    header["arrays"] = sorted(arrays)
    members = {"__header__": _json_bytes(header), **{k: np.ascontiguousarray(v) for k, v in arrays.items()}}
    members["__sha256__"] = np.array(_digest(["__header__"] + header["arrays"], members))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_savez(Path(path), members)


def read_frame(path) -> tuple[pd.DataFrame, object]:
    """``(frame, meta)`` written by :func:`write_frame`; DataFileError (one line, without the file's
    name: the caller names it) for any damage."""
    try:
        with open(path, "rb") as fh:                # ours to close, also when reading fails
            if fh.read(4) != b"PK\x03\x04":
                raise DataFileError("not an .npz archive")
            fh.seek(0)
            members = load_npz(fh)
        raw = json.loads(members["__header__"].tobytes().decode())
        names = list(raw["arrays"])
        if set(members) != set(names) | {"__header__", "__sha256__"}:
            raise DataFileError("members differ from the header's list")
        stored = str(members.pop("__sha256__"))
        if _digest(["__header__", *names], members) != stored:
            raise DataFileError("checksum mismatch (content changed since it was written)")
        if raw.get("format") != FORMAT:
            raise DataFileError(f"format {raw.get('format')!r}, expected {FORMAT}")
        arrays = {n: members[n] for n in names}
        header = _json_load(members["__header__"], arrays)
        index = _get_index(header["index"], "index", arrays)
        labels = _get_index(header["labels"], "labels", arrays)
        cols = [_get(spec, f"c{i}", arrays) for i, spec in enumerate(header["columns"])]
        if len(labels) != len(cols) or len(index) != header["rows"] or any(len(c) != len(index) for c in cols):
            raise DataFileError("column or row counts differ from the header")
        frame = pd.DataFrame(dict(enumerate(cols)), index=index) if cols else pd.DataFrame(index=index)
        frame.columns = labels
        frame.attrs = header["attrs"]
        return frame, header["meta"]
    except DataFileError:
        raise
    except Exception as e:  # noqa: BLE001 - any damage of the file: one line, the caller rebuilds
        msg = str(e).splitlines()[0][:160] if str(e) else ""
        raise DataFileError(f"{type(e).__name__}: {msg}" if msg else type(e).__name__) from None


def jsonable(x):
    """``x`` with numpy scalars as Python numbers, NaN and infinities as None and paths as text: what
    ``json.dumps(..., allow_nan=False)`` accepts (metrics.json and the live sections' files)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, (np.bool_,)):
        return bool(x)
    if isinstance(x, Path):
        return str(x)
    return x
