"""The kernel table's record (table_info.TableInfo): typed, immutable, shared by copies, carried by transforms."""
import dataclasses

import pandas as pd
import pytest

from neusight_core.question.step import Step
from neusight_core.plans import fusion, parallel
from neusight_core.tracing import table_info, trace_cache
from neusight_core.cost import memory

MODEL, BATCH, SEQ = "gpt2_large", 2, 64


@pytest.fixture(scope="module")
def table():
    return trace_cache.trace(Step(model=MODEL, batch=BATCH, seq=SEQ, mode="train"))


def test_a_traced_table_says_what_step_it_describes(table):
    info = table_info.info(table)
    assert (info.batch, info.seq, info.mode, info.past, info.attention) == (BATCH, SEQ, "train", 0, "eager")
    assert info.num_layers == 36 and info.hidden == 1280 and sum(info.params.values()) > 7e8
    assert info.memory["activation_peak_bytes"] > 0 and not (info.fused or info.derived or info.plan)


def test_the_record_cannot_be_changed_in_place_only_replaced(table):
    info = table_info.info(table)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.batch = 8
    with pytest.raises(AttributeError):
        info.bacth              # a misspelt field is an error, not a silent default
    assert info.replace(batch=8).batch == 8 and info.batch == BATCH


def test_transforms_carry_the_record_and_say_what_they_did(table):
    fused = fusion.fuse(table)
    assert table_info.info(fused).fused and table_info.info(fused).batch == BATCH
    pp = parallel.apply_plan(table, "pp", 2, micro_batches=2)
    got = table_info.info(pp)
    assert (got.plan, got.gpus, got.micro_batches, got.batch) == ("pp", 2, 2, BATCH // 2)
    assert table_info.info(table).plan is None          # the source keeps its own


def test_a_frame_built_by_hand_gets_one_line_errors():
    frame = pd.DataFrame({"op_class": ["LINEAR"], "phase": ["fw"]})
    assert table_info.info_or_none(frame) is None
    with pytest.raises(table_info.KernelTableError, match="not a traced kernel table"):
        table_info.info(frame)
    with pytest.raises(memory.MemoryInputError, match="TableInfo"):
        memory.footprint(frame)
    with pytest.raises(parallel.PlanError, match="TableInfo"):
        parallel.apply_plan(frame, "tp", 2)
    assert table_info.info_or_none(table_info.carry(frame.copy(), frame, fused=True)) is None
