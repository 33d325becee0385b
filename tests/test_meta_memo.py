"""The tracer's memo of meta ops (shape_memo.py) changes no table: rows, buffers and memory timeline alike."""
import dataclasses

import pytest
import torch

from neusight_core.question.step import Step
from neusight_core.tracing import table_info, shape_memo, trace

aten = torch.ops.aten


@pytest.mark.parametrize("model,batch,seq,mode,kw", [
    ("gpt2_large", 2, 32, "train", {}),                                            # autograd, dropout, tied head
    ("switchxl4", 1, 64, "inf", {}),                                               # experts: the same shapes 4x
    ("opt_13", 1, 1, "inf", {"past": 32, "dtype": "bf16", "attention": "sdpa"}),   # decode: cache, fused attention
    ("resnet50", 2, 64, "train", {}),                                              # convolutions, batch norm
])
def test_tables_equal_with_and_without_memo(monkeypatch, model, batch, seq, mode, kw):
    monkeypatch.setattr(shape_memo, "ENABLED", False)
    plain = trace.trace_model(Step(model=model, batch=batch, seq=seq, mode=mode, **kw))
    monkeypatch.setattr(shape_memo, "ENABLED", True)
    memo = trace.trace_model(Step(model=model, batch=batch, seq=seq, mode=mode, **kw))
    assert plain.equals(memo)
    assert list(plain["reads"]) == list(memo["reads"]) and list(plain["writes"]) == list(memo["writes"])
    a, b = table_info.info(plain), table_info.info(memo)
    assert dataclasses.replace(a, trace_s=0) == dataclasses.replace(b, trace_s=0)   # memory timeline included


def test_memo_skips_repeated_ops(monkeypatch):
    seen = []
    orig = shape_memo.MetaMemo.run

    def spy(self, func, args, kwargs):
        seen.append(self)
        return orig(self, func, args, kwargs)
    monkeypatch.setattr(shape_memo.MetaMemo, "run", spy)
    table = trace.trace_model(Step(model="gpt2_large", batch=2, seq=32, mode="inf"))
    assert seen[-1].hits >= 0.9 * len(table)      # 36 identical layers: most kernels' ops come from the memo


def test_scalars_are_keyed_with_their_type():
    m = shape_memo.MetaMemo()
    x = torch.empty(4, dtype=torch.int64, device="meta")
    assert m.run(aten.mul.Tensor, (x, 2), {}).dtype == torch.int64
    assert m.run(aten.mul.Tensor, (x, 2.0), {}).dtype == torch.float32     # 2 == 2.0 as dict keys
    assert m.run(aten.mul.Tensor, (x, 2), {}).dtype == torch.int64
    assert m.hits == 1


def test_views_and_in_place_ops_always_run():
    m = shape_memo.MetaMemo()
    x = torch.empty(3, 4, device="meta")
    for _ in range(2):
        v = m.run(aten.t.default, (x,), {})
        assert v.untyped_storage()._cdata == x.untyped_storage()._cdata       # still a view of x
        out = m.run(aten.add_.Tensor, (x, x), {})
        assert out is x
    assert m.hits == 0


def test_fresh_outputs_match_the_op():
    m = shape_memo.MetaMemo()
    x = torch.empty(2, 3, 5, device="meta").transpose(1, 2)          # not contiguous: strides matter
    first = m.run(aten.max.dim, (x, 1), {})
    again = m.run(aten.max.dim, (x, 1), {})
    assert m.hits == 1 and type(again) is type(first)
    for a, b in zip(first, again):
        assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
        assert a.untyped_storage()._cdata != b.untyped_storage()._cdata     # a new buffer, as the op makes
