"""Meta ops run once per shape: the tracer's outputs of an op it has already run on the same inputs.

Tracing is mostly torch computing output shapes on meta tensors, much of it in Python (``torch._refs``,
``torch._prims``), and a model repeats the same ops on the same shapes in every layer (and every expert).
An op that neither mutates its inputs nor returns a view of them has outputs that depend only on the
inputs' metadata, so the second time the tracer sees that op on the same metadata it makes fresh meta
tensors of the recorded shapes and strides instead of running it again. Everything the tracer records
(rows, buffers, the allocation timeline) is the same: the outputs are new storages, as the op's would be.

Kept conservative, because a wrong output shape would silently change every later row:
- only ops whose schema mutates nothing and whose returns carry no alias annotation;
- only when every input is a tensor (shape, stride, offset, dtype, device), or a hashable constant keyed
  with its type (``1``, ``1.0`` and ``True`` promote differently);
- not when an output shares storage with an input or another output, or is not a dense tensor at offset 0
  whose storage is exactly its extent: those ops are run every time.
A memo lives for one trace. ``tests/test_meta_memo.py`` compares tables traced with and without it.
"""
from __future__ import annotations

import torch

from neusight_core.tracing.aten_ops import call_tensors

_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
_NOT = object()            # a key whose op must run every time
ENABLED = True             # False: every op runs (the tests compare both)


_TENSORS = (torch.Tensor, torch.nn.Parameter)     # keyed by their metadata (exact types: a subclass is _NOT)
_EXACT_SCALARS = frozenset(_SCALARS)


def _key_of(v):
    """Hashable description of one argument, or _NOT when it cannot be keyed (``_key_of_any``'s, with the common
    cases -- a plain tensor, a tuple or list of tensors and numbers -- done without a call per element: the memo
    keys every op a trace dispatches)."""
    tv = type(v)
    if tv in _TENSORS:
        return (tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, v.device.type)
    if tv is not tuple and tv is not list:
        return _key_of_any(v)
    parts = []
    for x in v:
        tx = type(x)
        if tx in _TENSORS:
            parts.append((tuple(x.shape), x.stride(), x.storage_offset(), x.dtype, x.device.type))
        elif tx in _EXACT_SCALARS:
            parts.append((tx, x))
        else:
            p = _key_of(x)
            if p is _NOT:
                return _NOT
            parts.append(p)
    return (tv, tuple(parts))


def _key_of_any(v):
    """Hashable description of one argument of any type, or _NOT when it cannot be keyed."""
    if isinstance(v, torch.Tensor):
        if type(v) is not torch.Tensor and not isinstance(v, torch.nn.Parameter):
            return _NOT
        return (tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, v.device.type)
    if isinstance(v, (list, tuple)):
        parts = tuple(_key_of(x) for x in v)
        return _NOT if any(p is _NOT for p in parts) else (type(v), parts)
    if isinstance(v, _SCALARS):
        return (type(v), v)
    return _NOT


def _memoizable(func) -> bool:
    schema = func._schema
    return not schema.is_mutable and all(r.alias_info is None for r in schema.returns)


class MetaMemo:
    """``run(func, args, kwargs)``: the op's outputs, computed once per distinct input metadata."""

    def __init__(self):
        self._specs: dict = {}
        self._ok: dict = {}         # func -> memoizable by its schema
        self.hits = 0

    def run(self, func, args, kwargs):
        ok = self._ok.get(func)
        if ok is None:
            ok = self._ok[func] = ENABLED and _memoizable(func)
        if not ok:
            return func(*args, **kwargs)
        key = _key_of(args)
        kkey = _key_of(tuple(sorted(kwargs.items()))) if kwargs else ()
        if key is _NOT or kkey is _NOT:
            return func(*args, **kwargs)
        key = (func, key, kkey)
        spec = self._specs.get(key)
        if spec is None:
            out = func(*args, **kwargs)
            self._specs[key] = _spec_of(out, args, kwargs)
            return out
        if spec is _NOT:
            return func(*args, **kwargs)
        self.hits += 1
        return _rebuild(spec)


class _Fresh(tuple):
    """(shape, stride, dtype) of an output to make anew."""


def _spec_of(out, args, kwargs):
    """What ``_rebuild`` makes ``out`` again from, with fresh storages; _NOT when that would not be the same."""
    seen = {t.untyped_storage()._cdata for t in call_tensors(args, kwargs)}
    try:
        return _spec(out, seen)
    except _Unlike:
        return _NOT


class _Unlike(Exception):
    pass


class _Seq(tuple):
    """(type, children) of an output tuple, list or torch.return_types structure."""


def _spec(x, seen: set):
    if isinstance(x, torch.Tensor):
        if type(x) is not torch.Tensor or x.device.type != "meta" or x.storage_offset() != 0 or x.requires_grad:
            raise _Unlike
        st = x.untyped_storage()
        extent = 1 + sum((n - 1) * s for n, s in zip(x.shape, x.stride())) if x.numel() else 0
        if st._cdata in seen or st.nbytes() != extent * x.element_size():
            raise _Unlike          # shares a storage, or is a window on a larger one
        seen.add(st._cdata)
        return _Fresh((tuple(x.shape), x.stride(), x.dtype))
    if isinstance(x, (tuple, list)):
        return _Seq((type(x), tuple(_spec(v, seen) for v in x)))
    if isinstance(x, _SCALARS):
        return x
    raise _Unlike


def _rebuild(spec):
    kind = type(spec)
    if kind is _Fresh:
        return torch.empty_strided(spec[0], spec[1], dtype=spec[2], device="meta")
    if kind is _Seq:
        cls, parts = spec
        items = [_rebuild(p) for p in parts]
        return cls(items)
    return spec
