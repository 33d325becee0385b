"""The memory footprint of a derived kernel table: the trace's allocation timeline, derived like its kernels.

A traced table's activation peak is the highest running sum of its allocation (+bytes) and free (-bytes)
events in program order (``schema.MemoryTimeline``, ``trace._memory_summary``). ``table_families.py`` rebuilds a
model's kernel rows from a reduced model's sample traces; the events ride on those rows, so they are rebuilt
the same way:

1. **Same events in every sample.** Each event belongs to the kernel row it precedes or belongs to. The six
   (or eight) sample traces must have the same events on the same rows with the same signs; only the byte
   counts differ, and each is a polynomial in (batch, seq) found on the samples by ``Family._eval``, exactly as
   a kernel's numeric cell is.
2. **Replicate the middle unit.** The full model's events are the reduced model's, row by row, in the order of
   ``Family._expansion``: a copy of unit 1's events for every middle unit (forward ascending, backward
   descending). Blocks that hand a tensor to the next block free the one before at the same point of every
   copy, so the running sum of a deep model is that of its reduced model with the middle repeated. Where a block
   frees a tensor two blocks old (Llama, Qwen, BERT keep the residual one block longer), the reduced model's unit 1
   has nothing that old to free yet: the later forward copies then repeat unit 2's events (``TEMPLATES``).
3. **Parameters**: the derived table's per-name counts (``Family._info``), summed.
4. **Checked.** At the family's check point(s) the 4-unit model is traced anyway (``table_families.py`` step 5); its
   activation peak, KV cache and parameter count must equal what this module derives for 4 units there, to the
   byte, with the first template that does (``check``). Otherwise the family's memory is not derived and the engine
   says so (``scenario.lower_bound_verdict``).

Decode steps (``past`` > 0): the KV cache the step starts from is allocated before the first kernel, on no unit's
row. Those events are taken out of the timeline; the cache's bytes are polynomial in batch like any cell, and
proportional to the depth (every layer keeps its own keys and values: checked at the 4-unit trace too). The
activation peak is the running sum's peak above the cache (``trace._memory_summary``), the frees of the old
cache tensors (``torch.cat`` in a DynamicCache) staying with their layers' rows.
"""
from __future__ import annotations

import numpy as np

from neusight_core.tracing import table_info


class DerivedMemory:
    """A family's allocation timeline as polynomials (built by :func:`fit`)."""

    def __init__(self, rows: np.ndarray, values: np.ndarray, kv: np.ndarray, sample_layers: int):
        self.rows = rows                     # (events,) kernel row of each event in the reduced model
        self.values = values                 # (samples, events, 1) bytes at the family's sample points
        self.kv = kv                         # (samples, 1, 1) bytes of the KV cache the step starts from
        self.sample_layers = sample_layers   # the sample traces' depth (blocks)
        self.templates = list(TEMPLATES)     # those that passed every check so far; the first one is used
        self._order: dict = {}               # (layers, template) -> event indices of the full model, in program order
        self._params: dict = {}              # layers -> parameter count of the full model

    def order(self, fam, layers: int, template: str | None = None) -> np.ndarray | None:
        """Indices into the reduced model's events, in the full model's program order (step 2); None where the
        template does not apply (unit 2's forward rows are not unit 1's)."""
        template = self.templates[0] if template is None else template
        if (layers, template) not in self._order:
            rows, blocks = fam._expansion(layers)
            n = len(fam.layer)
            if template == "steady" and fam.reduced:
                rows = _steady_rows(fam, rows, blocks)
                if rows is None:
                    self._order[(layers, template)] = None
                    return None
            lo = np.searchsorted(self.rows, np.arange(n), "left")
            lens = np.searchsorted(self.rows, np.arange(n), "right") - lo
            take, starts = lens[rows], lo[rows]
            offs = np.repeat(np.cumsum(take) - take, take)
            idx = np.arange(int(take.sum())) - offs + np.repeat(starts, take)
            tail = np.arange(int(np.searchsorted(self.rows, n, "left")), len(self.rows))   # after the last kernel
            self._order[(layers, template)] = np.concatenate([idx, tail]).astype(np.int64)
        return self._order[(layers, template)]

    def params(self, fam, layers: int) -> float:
        if layers not in self._params:
            self._params[layers] = float(sum(fam._info(0, 0, layers, 0.0).params.values()))
        return self._params[layers]

    def summary(self, fam, batch: int, seq: int, layers: int | None = None, template: str | None = None) -> dict | None:
        """``{"activation_peak_bytes", "kv_cache_bytes", "params"}`` of the full (or ``layers``-deep) model at
        (batch, seq), as ``trace._memory_summary`` and ``memory.param_counts`` give them for a trace."""
        layers = fam.layers if layers is None else layers
        order = self.order(fam, layers, template)
        if order is None:
            return None
        e = self.values.shape[1]
        v = fam._eval([(batch, seq)], self.values, np.zeros((e, 1), bool), np.array([True]))[0, :, 0]
        x = v[order]
        peak = float(np.cumsum(x).max()) if len(x) else 0.0
        kv = float(fam._eval([(batch, seq)], self.kv, np.zeros((1, 1), bool), np.array([True]))[0, 0, 0])
        return {"activation_peak_bytes": max(peak, 0.0), "kv_cache_bytes": kv * layers / self.sample_layers,
                "params": self.params(fam, layers)}


#: how the middle units' events repeat: "unit 1" -- every copy as the reduced model's unit 1; "steady" -- the first
#: copy as unit 1, later forward copies as unit 2, for blocks that free a tensor two blocks later (Llama, Qwen, BERT:
#: the residual kept one block longer), which the reduced model's unit 1 has no tensor of yet to free
TEMPLATES = ("unit 1", "steady")


def _steady_rows(fam, rows: np.ndarray, blocks: np.ndarray) -> np.ndarray | None:
    """``rows`` with the forward rows of middle copies 2 .. U-2 taken from unit 2's forward rows, or None."""
    unit = np.where(fam.layer >= 0, fam.layer // fam.period, -1)
    fw = (fam.struct["phase"].to_numpy() == "fw") if "phase" in fam.struct else np.ones(len(unit), bool)
    one, two = np.flatnonzero((unit == 1) & fw), np.flatnonzero((unit == 2) & fw)
    if len(one) == 0 or len(one) != len(two) or np.any(np.diff(one) != 1) or np.any(np.diff(two) != 1) \
            or not np.array_equal(fam.struct.iloc[one]["aten_op"].to_numpy(), fam.struct.iloc[two]["aten_op"].to_numpy()):
        return None
    later = (unit[rows] == 1) & fw[rows] & (blocks // fam.period >= 2)
    out = rows.copy()
    out[later] = rows[later] - one[0] + two[0]
    return out


def table_memory(fam, batch: int, seq: int, layers: int, rows: int) -> dict | None:
    """``TableInfo.memory`` of a derived table (what ``memory.footprint`` reads of a single-GPU trace), or None."""
    if fam.memory is None:
        return None
    from neusight_core.question import schema
    m = fam.memory.summary(fam, batch, seq, layers)
    return {"activation_peak_bytes": m["activation_peak_bytes"], "kv_cache_bytes": m["kv_cache_bytes"], "kv_bufs": (), "rows": rows,
            "events": schema.MemoryTimeline([]), "derived": True}


def fit(fam, samples, sample_layers: int) -> tuple[DerivedMemory | None, str]:
    """(the derived timeline, "") or (None, why it is not derived) from a family's sample traces, ``sample_layers``
    blocks deep (step 1)."""
    mems = [table_info.info(s).memory or {} for s in samples]
    if any(m.get("events") is None for m in mems):
        return None, "a sample trace has no memory timeline"
    rows, byts = [], []
    for m in mems:               # the cache the step starts from: allocated at row 0, before any kernel
        tl = m["events"]
        start = (tl.row == 0) & np.isin(tl.buf, np.asarray(m.get("kv_bufs") or (), dtype=np.int64)) & (tl.bytes > 0)
        rows.append(tl.row[~start])
        byts.append(tl.bytes[~start])
    if len(rows[0]) and np.any(np.diff(rows[0]) < 0):
        return None, "the sample trace's events are not in kernel-row order"
    for r, b in zip(rows[1:], byts[1:]):
        if len(r) != len(rows[0]) or not np.array_equal(r, rows[0]) or not np.array_equal(np.sign(b), np.sign(byts[0])):
            return None, "the allocation timeline differs between sample traces"
    kv = np.array([float(m.get("kv_cache_bytes", 0.0)) for m in mems])[:, None, None]
    return DerivedMemory(rows[0].copy(), np.stack(byts)[:, :, None].astype(np.longdouble), kv.astype(np.longdouble),
                         sample_layers), ""


def check(fam, real, point, layers: int) -> str:
    """"" if the derived memory at ``point`` for ``layers`` equals the traced ``real`` table's with some template,
    else the difference with the first (step 4); the templates that differ are dropped."""
    why = {t: _difference(fam, real, point, layers, t) for t in fam.memory.templates}
    fam.memory.templates = [t for t in fam.memory.templates if not why[t]]
    return "" if fam.memory.templates else next(iter(why.values()))


def _difference(fam, real, point, layers: int, template: str) -> str:
    info = table_info.info(real)
    mem = info.memory or {}
    got = fam.memory.summary(fam, *point, layers=layers, template=template)
    if got is None:
        return f"the {template!r} template does not apply"
    want_peak = float(mem.get("activation_peak_bytes", np.nan))
    want_params = float(sum(info.params.values()))
    want_kv = float(mem.get("kv_cache_bytes", 0.0))
    if got["kv_cache_bytes"] != want_kv:
        return f"KV cache at {point}: derived {got['kv_cache_bytes']:.0f} B, traced {want_kv:.0f} B"
    if got["activation_peak_bytes"] != want_peak:
        return f"activation peak at {point}: derived {got['activation_peak_bytes']:.0f} B, traced {want_peak:.0f} B"
    if got["params"] != want_params:
        return f"parameters: derived {got['params']:.0f}, traced {want_params:.0f}"
    return ""
