"""Families built side by side in worker processes (family_pool) are the families built one by one."""
import pandas as pd
import pytest

from neusight_core.question.step import Step
from neusight_core.tracing import table_families, family_pool

SPECS = [dict(model="gpt2_large", mode=m, batch_one=one, past=0, dtype="fp32", attention="sdpa")
         for m in ("inf", "train") for one in (False, True)]
POINTS = {False: [(2, 256), (8, 100), (5, 1000)], True: [(1, 77), (1, 512)]}


@pytest.fixture
def fresh_families(tmp_path, monkeypatch):
    monkeypatch.setenv("NEUSIGHT_TRACE_CACHE", str(tmp_path / "tc"))
    saved = dict(table_families.FAMILIES)
    table_families.FAMILIES.clear()
    yield
    table_families.FAMILIES.clear()
    table_families.FAMILIES.update(saved)


def test_pool_builds_the_same_families(fresh_families, monkeypatch):
    assert family_pool.build(SPECS, workers=2) == len(SPECS)          # every one came from a worker
    pooled = {k: table_families.FAMILIES[table_families.family_key(**s)] for k, s in enumerate(SPECS)}
    table_families.FAMILIES.clear()
    monkeypatch.setenv("NEUSIGHT_TRACE_CACHE_OFF", "1")                # traced again here, not read back
    for k, spec in enumerate(SPECS):
        here = table_families.family(**spec)
        assert here.ok and pooled[k].ok
        pts = POINTS[spec["batch_one"]]
        pd.testing.assert_frame_equal(pooled[k].compact(pts), here.compact(pts), check_exact=True)


def test_a_worker_makes_the_compact_table_of_the_points_it_is_given(fresh_families):
    """Each spec may name a (batch, seq) the caller will ask: the worker that builds the family makes its compact
    table at those points too; the caller takes it once, equal to computing it itself; other points are computed."""
    specs = [dict(s, point=p) for s in SPECS for p in POINTS[s["batch_one"]]]
    assert family_pool.build(specs, workers=2) == len(SPECS)
    for spec in SPECS:
        fam = table_families.FAMILIES[table_families.family_key(**spec)]
        pts = POINTS[spec["batch_one"]]
        assert fam.__dict__["_pool_compact"][0] == tuple(pts)
        made = family_pool.compact(fam, pts)
        assert "_pool_compact" not in fam.__dict__                    # taken once: the caller changes it
        pd.testing.assert_frame_equal(made, fam.compact(pts), check_exact=True)
        pd.testing.assert_frame_equal(family_pool.compact(fam, pts[:1]), fam.compact(pts[:1]), check_exact=True)


def test_a_failed_worker_leaves_its_family_to_this_process(fresh_families, monkeypatch):
    real = table_families.family

    def flaky(**spec):            # forked workers inherit the patch
        if spec["mode"] == "train" and spec["batch_one"]:
            raise MemoryError("worker killed")
        return real(**spec)

    monkeypatch.setattr(table_families, "family", flaky)
    assert family_pool.build(SPECS, workers=2) == len(SPECS) - 1
    monkeypatch.setattr(table_families, "family", real)
    missing = table_families.family_key(**SPECS[3])
    assert missing not in table_families.FAMILIES
    assert table_families.family_for("gpt2_large", 1, 200, "train", past=0, dtype="fp32", attention="sdpa").ok
    assert missing in table_families.FAMILIES


def test_few_families_or_one_worker_build_nothing_in_workers(fresh_families, monkeypatch):
    assert family_pool.build(SPECS[:family_pool.MIN_FAMILIES - 1], workers=2) == 0
    monkeypatch.setenv("NEUSIGHT_TRACE_WORKERS", "1")
    assert family_pool.build(SPECS) == 0
    assert not table_families.FAMILIES            # nothing built: the caller's loop builds them when it asks
    monkeypatch.setenv("NEUSIGHT_TRACE_WORKERS", "two")
    with pytest.raises(ValueError, match="NEUSIGHT_TRACE_WORKERS must be a whole number"):
        family_pool.build(SPECS)


def test_no_workers_once_cuda_is_initialised(fresh_families, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert family_pool.build(SPECS, workers=2) == 0 and not table_families.FAMILIES


def test_workers_trace_with_torch_and_transformers_frozen_and_the_caller_keeps_its_collector(fresh_families,
                                                                                            monkeypatch):
    """Each worker has transformers' model code (the caller imports it before forking) and freezes what is alive
    before its first family, so the collector stops walking those objects while it traces; the calling process is
    left as it was."""
    import gc
    import sys

    def probe(**spec):            # forked workers inherit the patch: report what the worker looks like
        return (gc.get_freeze_count(), "transformers.modeling_utils" in sys.modules)

    monkeypatch.setattr(table_families, "family", probe)
    before = gc.get_freeze_count()
    assert family_pool.build(SPECS, workers=2) == len(SPECS)
    seen = [table_families.FAMILIES[table_families.family_key(**s)] for s in SPECS]
    assert all(frozen > 10_000 and imported for frozen, imported in seen), seen
    assert gc.get_freeze_count() == before


def test_families_whose_traces_are_cached_are_built_here_without_torch(fresh_families, tmp_path):
    """A second sweep of a grid: every family's traces are in the cache, so ``build`` reads them in this process
    (no workers, and in a new process no torch import); the families are the ones the workers built."""
    import os
    import subprocess
    import sys

    from neusight_core import paths
    from neusight_core.tracing import trace_cache
    assert family_pool.build(SPECS, workers=2) == len(SPECS)          # cold: traced in workers
    pooled = {k: table_families.FAMILIES[table_families.family_key(**s)] for k, s in enumerate(SPECS)}
    table_families.FAMILIES.clear()
    assert family_pool.build(SPECS, workers=2) == 0                   # warm: built here, from the cache
    for k, spec in enumerate(SPECS):
        here = table_families.FAMILIES[table_families.family_key(**spec)]
        pts = POINTS[spec["batch_one"]]
        pd.testing.assert_frame_equal(pooled[k].compact(pts), here.compact(pts), check_exact=True)
    with trace_cache.cached_only(), pytest.raises(trace_cache.NotCached):
        trace_cache.trace(Step(model="gpt2_large", batch=3, seq=333, mode="inf"))                 # a miss is not traced
    code = ("import sys; from neusight_core.tracing import table_families, family_pool; "
            f"specs = {SPECS!r}; n = family_pool.build(specs, workers=2); "
            "assert n == 0 and all(table_families.family(**s).ok for s in specs), n; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=paths.REPO_ROOT,
                       env={**os.environ})
    assert r.returncode == 0, r.stderr[-2000:]
