"""The memory footprint of a derived kernel table: the trace's allocation timeline, derived like its kernels.

A traced table's activation peak is the highest running sum of its allocation (+bytes) and free (-bytes)
events in program order (``schema.MemoryTimeline``, ``trace._memory_summary``). ``derive.py`` rebuilds a
model's kernel rows from a reduced model's sample traces; the events ride on those rows, so they are rebuilt
the same way:

1. **Same events in every sample.** Each event belongs to the kernel row it precedes or belongs to. The six
   (or eight) sample traces must have the same events on the same rows with the same signs; only the byte
   counts differ, and each is a polynomial in (batch, seq) found on the samples by ``Family._eval``, exactly as
   a kernel's numeric cell is.
2. **Replicate the middle unit.** The full model's events are the reduced model's, row by row, in the order of
   ``Family._expansion``: a copy of unit 1's events for every middle unit (forward ascending, backward
   descending). Blocks that hand a tensor to the next block free the one before at the same point of every
   copy, so the running sum of a deep model is that of its reduced model with the middle repeated.
3. **Parameters**: the derived table's per-name counts (``Family._attrs``), summed.
4. **Checked.** At the family's check point(s) the 4-unit model is traced anyway (``derive.py`` step 5); its
   activation peak and parameter count must equal what this module derives for 4 units there, to the byte.
   Otherwise the family's memory is not derived and the engine says so (``engine._lower_bound_verdict``).

Not derived: decode steps (``past`` > 0). Their KV cache is counted as allocated before the first kernel, on no
unit's row, so it would not be replicated; their footprint stays the lower bound of weights, one activation and
the cache.
"""
from __future__ import annotations

import numpy as np


class DerivedMemory:
    """A family's allocation timeline as polynomials (built by :func:`fit`)."""

    def __init__(self, rows: np.ndarray, values: np.ndarray):
        self.rows = rows                     # (events,) kernel row of each event in the reduced model
        self.values = values                 # (samples, events, 1) bytes at the family's sample points
        self._order: dict = {}               # layers -> event indices of the full model, in program order
        self._params: dict = {}              # layers -> parameter count of the full model

    def order(self, fam, layers: int) -> np.ndarray:
        """Indices into the reduced model's events, in the full model's program order (step 2)."""
        if layers not in self._order:
            rows, _ = fam._expansion(layers)
            n = len(fam.layer)
            lo = np.searchsorted(self.rows, np.arange(n), "left")
            lens = np.searchsorted(self.rows, np.arange(n), "right") - lo
            take, starts = lens[rows], lo[rows]
            offs = np.repeat(np.cumsum(take) - take, take)
            idx = np.arange(int(take.sum())) - offs + np.repeat(starts, take)
            tail = np.arange(int(np.searchsorted(self.rows, n, "left")), len(self.rows))   # after the last kernel
            self._order[layers] = np.concatenate([idx, tail]).astype(np.int64)
        return self._order[layers]

    def params(self, fam, layers: int) -> float:
        if layers not in self._params:
            self._params[layers] = float(sum(fam._attrs(0, 0, layers, 0.0).get("params", {}).values()))
        return self._params[layers]

    def summary(self, fam, batch: int, seq: int, layers: int | None = None) -> dict:
        """``{"activation_peak_bytes", "kv_cache_bytes", "params"}`` of the full (or ``layers``-deep) model at
        (batch, seq), as ``trace._memory_summary`` and ``memory.param_counts`` give them for a trace."""
        layers = fam.layers if layers is None else layers
        e = self.values.shape[1]
        v = fam._eval([(batch, seq)], self.values, np.zeros((e, 1), bool), np.array([True]))[0, :, 0]
        x = v[self.order(fam, layers)]
        peak = float(np.cumsum(x).max()) if len(x) else 0.0
        return {"activation_peak_bytes": max(peak, 0.0), "kv_cache_bytes": 0.0, "params": self.params(fam, layers)}


def table_memory(fam, batch: int, seq: int, layers: int, rows: int) -> dict | None:
    """``attrs["memory"]`` of a derived table (what ``memory.footprint`` reads of a single-GPU trace), or None."""
    if fam.memory is None:
        return None
    from neusight_core import schema
    m = fam.memory.summary(fam, batch, seq, layers)
    return {"activation_peak_bytes": m["activation_peak_bytes"], "kv_cache_bytes": 0.0, "kv_bufs": (), "rows": rows,
            "events": schema.MemoryTimeline([]), "derived": True}


def fit(fam, samples) -> tuple[DerivedMemory | None, str]:
    """(the derived timeline, "") or (None, why it is not derived) from a family's sample traces (step 1)."""
    if int(fam.trace_kw.get("past", 0) or 0):
        return None, "a decode step's KV cache (past > 0) is not derived"
    tls = [(s.attrs.get("memory") or {}).get("events") for s in samples]
    if any(t is None for t in tls):
        return None, "a sample trace has no memory timeline"
    first = tls[0]
    if len(first) and np.any(np.diff(first.row) < 0):
        return None, "the sample trace's events are not in kernel-row order"
    for t in tls[1:]:
        if len(t) != len(first) or not np.array_equal(t.row, first.row) \
                or not np.array_equal(np.sign(t.bytes), np.sign(first.bytes)):
            return None, "the allocation timeline differs between sample traces"
    return DerivedMemory(first.row.copy(), np.stack([t.bytes for t in tls])[:, :, None].astype(np.longdouble)), ""


def check(fam, real, point, layers: int) -> str:
    """"" if the derived memory at ``point`` for ``layers`` equals the traced ``real`` table's, else the difference
    (step 4)."""
    mem = real.attrs.get("memory") or {}
    got = fam.memory.summary(fam, *point, layers=layers)
    want_peak = float(mem.get("activation_peak_bytes", np.nan))
    want_params = float(sum((real.attrs.get("params") or {}).values()))
    if got["activation_peak_bytes"] != want_peak:
        return f"activation peak at {point}: derived {got['activation_peak_bytes']:.0f} B, traced {want_peak:.0f} B"
    if got["params"] != want_params:
        return f"parameters: derived {got['params']:.0f}, traced {want_params:.0f}"
    return ""
