"""A derived table's memory (family_memory.py) is the real trace's, to the byte, or it is not given."""
import pandas as pd
import pytest

from neusight_core.question.step import Step
from neusight_core.tracing import table_families, family_memory, table_info, trace_cache
from neusight_core.cost import engine, memory
from neusight_core.cost import request


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NEUSIGHT_TRACE_CACHE", str(tmp_path / "tc"))
    saved = dict(table_families.FAMILIES)          # families are memoised per process: each test builds its own
    table_families.FAMILIES.clear()
    yield
    table_families.FAMILIES.clear()
    table_families.FAMILIES.update(saved)


@pytest.mark.parametrize("model, mode, b, s, past, dtype, template", [
    ("gpt2_large", "train", 4, 300, 0, "fp32", "unit 1"), ("gpt2_large", "inf", 1, 900, 0, "fp32", "unit 1"),
    ("switchxl4", "inf", 4, 512, 0, "fp32", "unit 1"), ("bert_large", "inf", 4, 256, 0, "fp32", "steady"),
    ("llama3_2_1b", "inf", 5, 1, 1000, "bf16", "steady")])      # a decode step: its KV cache too
def test_derived_footprint_equals_the_traced_one(cache, model, mode, b, s, past, dtype, template):
    att = "eager" if model == "switchxl4" else "sdpa"
    fam = table_families.family_for(model, b, s, mode, past=past, dtype=dtype, attention=att, allow_fixed=True)
    assert fam is not None and fam.memory is not None, fam and fam.memory_reason
    assert fam.memory.templates[0] == template
    real = trace_cache.trace(Step(model=model, batch=b, seq=s, mode=mode, past=past, dtype=dtype, attention=att))
    got = fam.memory.summary(fam, b, s)
    assert got["activation_peak_bytes"] == table_info.info(real).memory["activation_peak_bytes"] > 0
    assert got["kv_cache_bytes"] == table_info.info(real).memory["kv_cache_bytes"] == (0 if not past else got["kv_cache_bytes"])
    assert (got["kv_cache_bytes"] > 0) == (past > 0)
    assert got["params"] == sum(table_info.info(real).params.values())
    # the derived table carries it as a trace does: same footprint on a GPU where it does not fit
    want = memory.footprint(real, "T4")
    assert memory.footprint(fam.table(b, s), "T4") == {**want, "notes": []}


def test_engine_rows_of_derived_tables_have_the_traced_memory_columns(cache):
    rows = [dict(model="gpt2_large", device=d, batch=b, seq=s, mode="train")
            for d in ("H100", "T4") for b in (2, 8) for s in (128, 640)]
    derived = engine.predict(request.parse(rows), ["roofline"])
    traced = engine.predict(request.parse(rows), ["roofline"], use_derivation=False)
    assert derived["derived"].all() and not traced["derived"].any()
    cols = [c for c in engine.RESULT_COLUMNS if c.startswith("memory")]
    pd.testing.assert_frame_equal(derived[cols], traced[cols])
    assert set(derived["memory_verdict"].str[:12]) == {"fits", "does not fit"}


def test_a_family_whose_memory_misses_its_check_gives_the_lower_bound(cache, monkeypatch):
    # neither template of the middle units' events matches the 4-unit trace at the check point
    true_difference = family_memory._difference
    monkeypatch.setattr(family_memory, "_difference", lambda fam, real, point, layers, t:
                        true_difference(fam, real, point, layers, t) or f"{t}: activation peak differs")
    fam = table_families.family_for("bert_large", 4, 256, "inf", past=0, dtype="fp32", attention="sdpa")
    assert fam.ok and fam.memory is None and fam.memory_reason.startswith("check failed: activation peak at (3, 317)")
    assert table_info.info(fam.table(4, 256)).memory is None
    rows = [dict(model="bert_large", device="H100", batch=b, seq=256, mode="inf") for b in (2, 4)]
    out = engine.predict(request.parse(rows), ["roofline"])
    assert out["derived"].all()
    assert out["memory_verdict"].str.startswith("not computed").all() and out["memory_total_gib"].isna().all()
