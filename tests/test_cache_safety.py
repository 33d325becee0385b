"""Issue 24: a cache never executes what it finds, and a damaged cache repairs itself.

The trace cache (``trace_cache``), the training-record cache (``dataset.load_collect``) and trained
weights (``state.npz``): a crafted pickle at the name a cache reads runs nothing; a changed value is
caught by the checksum; a truncated file gives one warning line and is rebuilt with the true content."""
from __future__ import annotations

import json
import pickle
import warnings

import numpy as np
import pandas as pd
import pytest

from neusight_core.question.step import Step
from neusight_core.data import datafile, dataset
from neusight_core.tracing import table_info, trace_cache
from neusight_core import paths
from neusight_core.predictors import registry
from neusight_core import predictors as P
from neusight_core.predictors.base import STATE_FILE, read_state

MODEL, BATCH, SEQ = "opt", 1, 40


class Payload:
    """Unpickling this creates ``marker`` (what a crafted cache entry could do instead)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def crafted(tmp_path) -> tuple[bytes, object]:
    """Pickle bytes that create a marker file when unpickled; checked to be live."""
    probe = tmp_path / "probe-marker"
    blob = pickle.dumps(Payload(probe))
    pickle.loads(blob).close()                     # the payload works: unpickling it creates the file
    assert probe.exists()
    probe.unlink()
    return pickle.dumps(Payload(tmp_path / "MARKER")), tmp_path / "MARKER"


def cache_warnings(fn, *args, **kw):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn(*args, **kw)
    msgs = [str(x.message) for x in w if issubclass(x.category, datafile.CacheWarning)]
    return out, msgs


def one_line(msgs, *words):
    assert len(msgs) == 1, msgs
    assert "\n" not in msgs[0] and all(wd in msgs[0] for wd in words), msgs[0]
    return msgs[0]


# ------------------------------------------------------------------ .npz members
def test_load_npz_reads_what_numpy_reads(tmp_path):
    """Plain arrays through the fast header path, the rest (Fortran order, datetimes, records) through numpy's."""
    rng = np.random.default_rng(0)
    arrays = dict(f4=rng.random((64, 32), dtype=np.float32), f8=rng.random(7), be=np.arange(5, dtype=">f8"),
                  i8=np.arange(-3, 3), u1=np.frombuffer(b"text", np.uint8), b=np.array([True, False]),
                  s=np.array("a skeleton, {'x': (1, 2)}"), u=np.array(["ab", "cde"]), empty=np.zeros((0, 3)),
                  scalar=np.float64(2.5), cube=rng.random((2, 3, 4)), fortran=np.asfortranarray(rng.random((3, 4))),
                  dt=np.array(["2026-11-27"], dtype="datetime64[D]"), rec=np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]))
    f = tmp_path / "a.npz"
    np.savez(f, **arrays)
    with np.load(f, allow_pickle=False) as z:
        want = {k: z[k] for k in z.files}
    with open(f, "rb") as fh:
        got = datafile.load_npz(fh)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert got[k].tobytes() == want[k].tobytes() and got[k].flags.writeable, k


def test_load_npz_refuses_object_arrays_and_damage(tmp_path):
    marker = tmp_path / "MARKER"
    f = tmp_path / "evil.npz"
    np.savez(f, ok=np.arange(3), evil=np.array([Payload(marker), 1], dtype=object))     # pickled inside the .npy
    with open(f, "rb") as fh, pytest.raises(ValueError, match="evil.*refused"):
        datafile.load_npz(fh)
    assert not marker.exists()
    good = tmp_path / "good.npz"
    np.savez(good, w=np.arange(1000, dtype=np.float64))
    raw = bytearray(good.read_bytes())
    raw[len(raw) // 2] ^= 0xFF                         # one byte of the array's data: the member's CRC catches it
    good.write_bytes(bytes(raw))
    with open(good, "rb") as fh, pytest.raises(Exception, match="CRC|Bad"):
        datafile.load_npz(fh)


def test_buffer_columns_round_trip_as_pairs_and_others_as_json(tmp_path):
    """(buffer, bytes) cells take the two-array form; a cell of any other shape or type keeps the whole column
    JSON, so that every value comes back with its type."""
    pairs = [((0, 514631680), (1, 16384)), (), ((3, 2 ** 63 - 1),)]
    others = {"numpy int": [((np.int64(1), 2),)], "bool": [((True, 2),)], "triple": [((1, 2, 3),)],
              "list": [[(1, 2)]], "too big": [((2 ** 63, 1),)], "mixed": [((1, 2),), "text"]}
    for label, col in [("pairs", pairs), *others.items()]:
        frame = pd.DataFrame({"x": pd.Series(col, dtype=object)})
        f = tmp_path / "f.npz"
        datafile.write_frame(f, frame)
        with np.load(f, allow_pickle=False) as z:
            stored = json.loads(z["__header__"].tobytes().decode())["columns"][0]["kind"]
        assert stored == ("int_pairs" if label == "pairs" else "object"), label
        got, _ = datafile.read_frame(f)
        assert got["x"].tolist() == col, label
        assert [repr(v) for v in got["x"]] == [repr(v) for v in col], label      # types too (np.int64, True)


# ------------------------------------------------------------------ trace cache
@pytest.fixture
def tcache(tmp_path, monkeypatch, release_root):
    d = tmp_path / "trace_cache"
    monkeypatch.setenv("NEUSIGHT_TRACE_CACHE", str(d))
    monkeypatch.delenv("NEUSIGHT_TRACE_CACHE_OFF", raising=False)
    return d


def _key():
    return trace_cache.make_key("trace", MODEL, **trace_cache.trace_kwargs(Step(model=MODEL, batch=BATCH, seq=SEQ, mode="inf")))


def _fresh(monkeypatch) -> pd.DataFrame:
    with monkeypatch.context() as m:
        m.setenv("NEUSIGHT_TRACE_CACHE_OFF", "1")
        return trace_cache.trace(Step(model=MODEL, batch=BATCH, seq=SEQ, mode="inf"))


def _same_table(got: pd.DataFrame, want: pd.DataFrame):
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert list(got.dtypes) == list(want.dtypes)
    # the whole record equal, but for the trace's wall time
    assert table_info.info(got).replace(trace_s=0.0) == table_info.info(want).replace(trace_s=0.0)


def test_trace_entry_round_trips_exactly(tcache, monkeypatch):
    first = trace_cache.trace(Step(model=MODEL, batch=BATCH, seq=SEQ, mode="inf"))            # a miss: traced and stored
    trace_cache.STATS.clear()
    again = trace_cache.trace(Step(model=MODEL, batch=BATCH, seq=SEQ, mode="inf"))
    assert trace_cache.STATS["hit"] == 1
    _same_table(again, first)
    assert table_info.info(again).trace_s == table_info.info(first).trace_s
    assert isinstance(again["reads"].iloc[0], tuple) and table_info.info(again).memory["events"] == table_info.info(first).memory["events"]
    assert trace_cache.entry_path(_key()).suffix == ".npz" and not list(tcache.glob("*.pkl"))


def test_crafted_trace_entry_runs_nothing(tcache, tmp_path, monkeypatch):
    blob, marker = crafted(tmp_path)
    key = _key()
    p = trace_cache.entry_path(key)
    old_key = {**key, "versions": {**key["versions"], "cache": 1}}     # the name the pickle cache read
    old = trace_cache.cache_dir() / f"trace-{trace_cache.key_hash(old_key)[:40]}.pkl"
    tcache.mkdir(parents=True)
    for f in (p, p.with_suffix(".pkl"), old):
        f.write_bytes(blob)
    trace_cache.STATS.clear()
    got, msgs = cache_warnings(trace_cache.trace, Step(model=MODEL, batch=BATCH, seq=SEQ, mode="inf"))
    assert not marker.exists()
    one_line(msgs, "trace cache", "damaged", p.name, "rebuilding")
    assert trace_cache.STATS["corrupt"] == 1 and trace_cache.STATS["store"] == 1
    _same_table(got, _fresh(monkeypatch))
    again, msgs = cache_warnings(trace_cache.trace, Step(model=MODEL, batch=BATCH, seq=SEQ, mode="inf"))     # replaced by a good entry
    assert msgs == [] and trace_cache.STATS["hit"] == 1 and not marker.exists()
    _same_table(again, got)


def _tamper(path, column_index, row=0, factor=0.01):
    """Change one value of a stored column, keep everything else (header, key, checksum member)."""
    with np.load(path, allow_pickle=False) as z:
        members = {n: z[n].copy() for n in z.files}
    assert members[f"c{column_index}"][row] != 0
    members[f"c{column_index}"][row] *= factor
    with open(path, "wb") as f:
        np.savez(f, **members)


def test_tampered_trace_value_is_caught_by_the_checksum(tcache, monkeypatch):
    true = trace_cache.trace(Step(model=MODEL, batch=BATCH, seq=SEQ, mode="inf"))
    p = trace_cache.entry_path(_key())
    row = int(true["flops"].to_numpy().argmax())           # a GEMM: 100x fewer FLOPs would predict ~100x faster
    _tamper(p, list(true.columns).index("flops"), row=row)
    got, msgs = cache_warnings(trace_cache.trace, Step(model=MODEL, batch=BATCH, seq=SEQ, mode="inf"))
    one_line(msgs, "checksum mismatch", p.name)
    assert got["flops"].iloc[row] == true["flops"].iloc[row] > 0
    _same_table(got, _fresh(monkeypatch))


def test_truncated_trace_entry_is_rebuilt(tcache, monkeypatch):
    trace_cache.trace(Step(model=MODEL, batch=BATCH, seq=SEQ, mode="inf"))
    p = trace_cache.entry_path(_key())
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    trace_cache.STATS.clear()
    got, msgs = cache_warnings(trace_cache.trace, Step(model=MODEL, batch=BATCH, seq=SEQ, mode="inf"))
    one_line(msgs, "damaged", p.name)
    assert trace_cache.STATS["corrupt"] == 1 and trace_cache.STATS["store"] == 1
    _same_table(got, _fresh(monkeypatch))
    _, msgs = cache_warnings(trace_cache.trace, Step(model=MODEL, batch=BATCH, seq=SEQ, mode="inf"))
    assert msgs == [] and trace_cache.STATS["hit"] == 1


# ------------------------------------------------------------------ training-record cache
@pytest.fixture(scope="module")
def collect_true(release_root):
    return dataset.load_collect(cache=False)


@pytest.fixture
def tdir(tmp_path, monkeypatch):
    d = tmp_path / "trained"
    monkeypatch.setattr(paths, "trained_dir", lambda: d)
    return d


def _collect_path():
    return dataset._cache_path("collect", dataset.checksum(dataset.collect_files()))


def _same_records(got, want):
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert list(got.dtypes) == list(want.dtypes)


def test_collect_cache_round_trips_and_runs_no_crafted_pickle(tdir, tmp_path, collect_true):
    blob, marker = crafted(tmp_path)
    cp = _collect_path()
    cp.parent.mkdir(parents=True)
    for f in (cp, cp.with_suffix(".pkl")):                # the new name and the pickle cache's name
        f.write_bytes(blob)
    got, msgs = cache_warnings(dataset.load_collect)
    assert not marker.exists()
    one_line(msgs, "dataset cache", "damaged", cp.name, "rebuilding")
    _same_records(got, collect_true)
    again, msgs = cache_warnings(dataset.load_collect)      # the rebuilt cache is read, exactly
    assert msgs == [] and not marker.exists()
    _same_records(again, collect_true)


def test_tampered_collect_value_is_caught_by_the_checksum(tdir, collect_true):
    dataset.load_collect()
    cp = _collect_path()
    _tamper(cp, list(collect_true.columns).index("latency_ms"), row=7)
    got, msgs = cache_warnings(dataset.load_collect)
    one_line(msgs, "checksum mismatch", cp.name)
    assert got["latency_ms"].iloc[7] == collect_true["latency_ms"].iloc[7]
    _same_records(got, collect_true)


def test_truncated_collect_cache_is_rebuilt(tdir, collect_true):
    dataset.load_collect()
    cp = _collect_path()
    cp.write_bytes(cp.read_bytes()[: cp.stat().st_size - 1000])
    got, msgs = cache_warnings(dataset.load_collect)
    one_line(msgs, "damaged", cp.name)
    _same_records(got, collect_true)
    _, msgs = cache_warnings(dataset.load_collect)
    assert msgs == []


# ------------------------------------------------------------------ trained weights (state.npz)
def test_truncated_or_crafted_weights_warn_once_and_retrain(tdir, tmp_path, monkeypatch, release_root):
    from tests.test_predictors import random_kernels
    k = random_kernels(100, seed=2)
    first = P.get("li", quick=True)                  # the cheapest predictor with fitted weights
    want = first.predict(k, "L4")
    f = P.folder("li", quick=True) / STATE_FILE
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    again, msgs = cache_warnings(P.get, "li", quick=True)
    one_line(msgs, "damaged weights", str(f), "retraining")
    assert np.array_equal(again.predict(k, "L4"), want)
    read_state(f.parent)                              # saved again, readable

    # weights of an earlier version (state.pt, read with torch.load) are never loaded: a crafted one runs nothing
    blob, marker = crafted(tmp_path)
    f.unlink()
    (f.parent / "state.pt").write_bytes(blob)
    again, msgs = cache_warnings(P.get, "li", quick=True)
    one_line(msgs, "state.pt", "retraining")
    assert not marker.exists() and np.array_equal(again.predict(k, "L4"), want)

    # good weights load without a warning and without training
    monkeypatch.setattr(registry.CLASSES["li"], "fit", lambda *a, **kw: pytest.fail("retrained good weights"))
    _, msgs = cache_warnings(P.get, "li", quick=True)
    assert msgs == []
    assert json.loads((f.parent / "meta.json").read_text())["name"] == "li"


def test_two_callers_needing_the_same_weights_train_them_once(tmp_path, monkeypatch):
    """predictors.get holds a lock on the weights folder while training (test workers, two terminals): the second
    caller waits, then loads what the first saved, instead of training the same weights again."""
    import threading
    import time as _time

    from neusight_core.data import dataset
    from neusight_core import predictors as P
    from neusight_core.predictors.roofline import RooflinePredictor

    monkeypatch.setenv("NEUSIGHT_TRAINED", str(tmp_path / "trained"))
    monkeypatch.setattr(dataset, "training_checksum", lambda **kw: "sum")
    monkeypatch.setattr(dataset, "training_data", lambda **kw: type("T", (), {"checksum": "sum"})())
    fits = []
    real_fit = RooflinePredictor.fit

    def slow_fit(self, train=None, quick=False):
        fits.append(threading.get_ident())
        _time.sleep(0.5)            # long enough for the other caller to arrive while this one trains
        real_fit(self, train, quick)
    monkeypatch.setattr(RooflinePredictor, "fit", slow_fit)
    got = []
    callers = [threading.Thread(target=lambda: got.append(P.get("roofline", quick=True, seed=3))) for _ in range(2)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(30)
    assert len(got) == 2 and all(p.fitted for p in got)
    assert len(fits) == 1                                   # trained once, loaded once
    assert (tmp_path / "trained" / ".roofline-quick-seed3.lock").exists()
