"""Shape reuse: kernel tables of other batch sizes and sequence lengths without re-running the model.

A model's kernels differ between (batch, seq) points only in their shapes, and between depths only
by how often the transformer block repeats. So, per *family* (model config, mode and every other
trace argument except batch and seq):

1. **Fewer layers.** The model is rebuilt with 3 units of blocks (first, one middle, last; only the
   config's depth keys change) -- tracing it costs a fraction of the full model. A unit is one block,
   or ``period`` blocks when blocks alternate (Switch Transformers: dense + sparse expert block;
   encoder and decoder stacks of equal depth are reduced together). A model with at most 4 units is
   used as it is. Configs whose depth is spread over other keys or per-layer lists are not reduced
   and not derived: they are traced for real.
2. **Six sample traces** of the reduced model at batch in {2, 4} x seq in {64, 128, 192} (batch 1
   is its own family with samples at batch 1: some ops become views there), through the trace
   cache. Their kernel sequences must be identical in every non-numeric column and in which numeric
   cells are NaN; otherwise the family is not derivable.
3. **Every numeric cell is a polynomial** ``c0 + c1 b + c2 s + c3 b s + c4 s^2 + c5 b s^2`` (linear in
   batch, at most quadratic in seq: attention scores are b x heads x s x s), found exactly by
   Lagrange interpolation on the six samples and evaluated in extended precision; columns whose
   samples are all integers are rounded to integers. No column list is hard-coded: every numeric
   column of the traced table is derived the same way (``layer`` and ``count`` are constants).
4. **Replicate the middle block**: rows of block 1 stand for blocks 1 .. L-2 (in ascending order in
   forward, descending in backward), block 2 becomes block L-1, module names are renumbered.
5. **Check before use**: the reduced model with 4 units is traced at batch 3 (1), seq 317 (an odd
   point outside the samples) and compared, row by row and column by column, with the table derived
   for 4 units at that point. Any difference makes the family not derivable, and callers fall back
   to a real trace (``Family.ok`` is False, ``Family.reason`` says why).
6. **Tokens per expert**: Switch Transformers' experts run t(seq) = min(ceil(seq / experts), capacity)
   tokens of each sequence (the tracer's routing stand-in, ``configs.switch_tokens_per_expert``),
   which is not a polynomial in seq. For such configs the seq part of the basis is {1, s, s^2, t(s)}
   (times {1, b}), with a fourth seq sample past the capacity (320 for 4 experts x 64) and a second
   check point below it (seq 101: t = 26, where ceil matters); the weights are solved exactly.
7. **Buckets**: where one polynomial does not hold over all seq (e.g. Switch's expert capacity
   without step 6, as the tests run it), a family per power-of-two bucket [lo, 2 lo) of seq with
   samples lo, 5/4 lo, 3/2 lo and an odd check point 7/4 lo + 1 (``family_for(..., allow_bucket=True)``).
8. **One seq**: where even the bucket's check fails (e.g. Switch below capacity without step 6:
   ceil(seq / experts) tokens per expert), a family of that seq alone, linear in batch: samples batch 2 and 4, check at
   batch 3 with 4 units (``family_for(..., allow_fixed=True)``, batch >= 2; the sweep asks for it
   when at least two of its tables share that seq). Batch-1 tables of a model whose batch >= 2
   family failed its check, and that have no bucket to try, are traced for real without building a
   batch-1 family (it would fail the same way).

Steps 7 and 8 remain as fallbacks for configs whose non-polynomial shape is not known to this module.

Derived tables have the columns of a real trace except ``reads`` / ``writes`` (buffer
dependencies, needed by ``fusion.fuse`` only): fused and parallel tables are built from real
(cached) traces. ``TableInfo.derived`` is True on them.
"""
from __future__ import annotations

import copy
import re
import time

import numpy as np
import pandas as pd

from neusight_core.data import configs
from neusight_core.tracing import family_memory, table_info, trace_cache
from neusight_core.question import schema
from neusight_core.question.schema import Mode
from neusight_core.tracing.interpolation import aux_weights, exact_inverse, lagrange_weights, seq_basis
from neusight_core.question.step import Step

SAMPLE_B = (2, 4)          # batch 1 is its own family (some ops become views at batch 1): SAMPLE_B1
SAMPLE_B1 = (1,)
SAMPLE_S = (64, 128, 192)
CHECK_S = 317              # check point (odd, between samples' regime): (3, 317) for batch >= 2, (1, 317) for batch 1
CHECK_S_EXPERT = 101       # second check point of families with tokens per expert (ceil(101 / 4) = 26 != 101 / 4)
MIN_SEQ = 32               # shorter sequences are traced for real (not covered by the samples' regime)
REDUCED_LAYERS = 3
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
# keys that also count layers: a config with one of them set is not reduced
OTHER_DEPTH_KEYS = ("num_decoder_layers", "num_sparse_encoder_layers", "num_sparse_decoder_layers",
                    "decoder_layers", "encoder_layers", "first_k_dense_replace", "moe_layer_freq")
DROP = ("reads", "writes")         # not derived (see module doc)
_LAYER_NUMBER_RE = re.compile(r"((?:^|\.)(?:h|layers|layer|block|blocks)\.)(\d+)(?=\.|$)")


class DeriveError(ValueError):
    pass


def _depth(content: dict) -> tuple[dict, int | None, int, str]:
    """(depth keys -> their value per layer, layer count, period, reason it cannot be reduced or '').

    The period is the number of consecutive blocks that repeat as a unit (2 for Switch Transformers,
    whose every second block is a sparse expert block); encoder and decoder stacks of equal depth are
    reduced together.
    """
    keys = [k for k in LAYER_KEYS if isinstance(content.get(k), int)]
    if len(keys) != 1:
        return {}, None, 1, f"layer count not in exactly one of {LAYER_KEYS}"
    key, L = keys[0], int(content[keys[0]])
    depth = {key: 1}
    period = 1
    dec = content.get("num_decoder_layers")
    if dec not in (None, 0):
        if dec != L:
            return depth, L, 1, f"decoder depth {dec} differs from encoder depth {L}"
        depth["num_decoder_layers"] = 1
    sparse = {k: content.get(k) for k in ("num_sparse_encoder_layers", "num_sparse_decoder_layers")
              if content.get(k) not in (None, 0)}
    if sparse:
        steps = {L // v if v and L % v == 0 else None for v in sparse.values()}
        if len(steps) != 1 or None in steps:
            return depth, L, 1, "sparse layers not evenly spread"
        period = steps.pop()
        for k in sparse:
            depth[k] = 0                 # a count of units, not of blocks
        for k in ("encoder_sparse_step", "decoder_sparse_step"):
            if k in content and content[k] != period:
                return depth, L, 1, f"{k} {content[k]} differs from the sparse period {period}"
    others = [k for k in OTHER_DEPTH_KEYS if k not in depth and content.get(k) not in (None, 0, [], "")]
    if others:
        return depth, L, period, f"depth also set by {', '.join(others)}"
    lists = [k for k, v in content.items() if isinstance(v, list) and len(v) == L and L > 1]
    if lists:
        return depth, L, period, f"per-layer list(s) {', '.join(lists)}"
    if L % period:
        return depth, L, period, f"{L} layers are not a multiple of the period {period}"
    return depth, L, period, ""


def _renumber(name: str, mapping) -> str:
    """Replace the block index in a module/parameter path by ``mapping(old)``."""
    m = _LAYER_NUMBER_RE.search(name)
    if not m:
        return name
    new = mapping(int(m.group(2)))
    return name[:m.start(2)] + str(new) + name[m.end(2):]


def _is_num(s: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s)


class Family:
    """Derivation of one model / mode / trace-options family (see module doc)."""

    def __init__(self, model, mode: str = Mode.INF, batch_one: bool = False, seq_bucket: int | None = None,
                 seq_fixed: int | None = None, **trace_kw):
        t0 = time.perf_counter()
        self.model, self.mode, self.trace_kw = model, mode, dict(trace_kw)
        self.max_positions = None
        self.sample_b = SAMPLE_B1 if batch_one else SAMPLE_B
        self.seq_bucket, self.seq_fixed = seq_bucket, seq_fixed
        if seq_fixed is not None:        # one sequence length: linear in batch only (samples b = 2, 4)
            if batch_one:
                raise DeriveError("a fixed-seq family needs two batch samples (batch >= 2)")
            self.sample_s, check_s = (int(seq_fixed),), int(seq_fixed)
        elif seq_bucket is None:
            self.sample_s, check_s = SAMPLE_S, CHECK_S
        else:                            # samples and an odd check point inside [lo, 2 lo)
            lo = int(seq_bucket)
            self.sample_s, check_s = (lo, lo + lo // 4, lo + lo // 2), lo + 3 * lo // 4 + 1
        self.check_point = (1 if batch_one else 3, check_s)
        self.content = configs.config_content(model)
        self.check_points = [self.check_point]
        # tokens per expert (Switch): an extra basis function of seq, for the family over all seq
        self.aux, self._aux_inv = None, None
        aux = configs.expert_tokens_fn(self.content) if seq_fixed is None and seq_bucket is None else None
        if aux is not None:
            e, cap = int(self.content["num_experts"]), int(self.content["expert_capacity"])
            ss = SAMPLE_S + (64 * (e * cap // 64 + 1),)        # the fourth sample past the capacity
            inv = exact_inverse([seq_basis(v, aux) for v in ss])
            if inv is not None:
                self.aux, self._aux_inv, self.sample_s = aux, inv, ss
                self.check_points.append((self.check_point[0], CHECK_S_EXPERT))
        self.ok, self.reason = False, ""
        self.memory, self.memory_reason = None, "the kernels are not derived"    # family_memory.py
        depth, L, period, why = _depth(self.content)
        self.layers, self.period, self._depth_keys = L, period, depth
        self.build_s = 0.0
        self._check_num_layers = 0
        if why:
            self.reason = f"not derived: {why}"
            return
        self.units = L // period
        self.reduced = self.units > REDUCED_LAYERS + 1
        maxpos = next((self.content[k] for k in ("n_positions", "max_position_embeddings")
                       if isinstance(self.content.get(k), int)), None)
        self.max_positions = maxpos
        if maxpos is not None and maxpos < check_s:
            self.reason = f"not derived: the model has only {maxpos} positions"
            return
        small = self._config(REDUCED_LAYERS) if self.reduced else self.content
        try:
            points = [(b, s) for b in self.sample_b for s in self.sample_s]
            with trace_cache.reusing_models():       # one reduced model for all samples; the check builds its own
                samples = [self._trace(small, *points[0])]
                if samples[0]["sub_op"].eq(schema.GROUPED_GEMM).any():
                    # the experts reached, min(experts, tokens x top-k), and a weight gradient's rows per expert are
                    # no polynomials: a check at one point can pass where they happen to agree and miss others
                    self.reason = "not derived: grouped GEMMs (mixture-of-experts layers)"
                    return
                samples += [self._trace(small, b, s) for b, s in points[1:]]
            self._fit(samples)
            check_cfg = self._config(REDUCED_LAYERS + 1) if self.reduced else self.content
            for point in self.check_points:
                if not self.ok:
                    break
                real = self._trace(check_cfg, *point)
                self._check_num_layers = table_info.info(real).num_layers
                got = self.table(*point, layers=(REDUCED_LAYERS + 1) * period if self.reduced else L)
                diff = compare(got, real)
                if diff:
                    self.ok, self.reason = False, f"not derived: check at (batch, seq) = {point} failed: {diff}"
                elif self.memory is not None:
                    why = family_memory.check(self, real, point, (REDUCED_LAYERS + 1) * period if self.reduced else L)
                    if why:
                        self.memory, self.memory_reason = None, f"check failed: {why}"
        except trace_cache.NotCached:
            raise                        # asked for cached traces only (family_pool): not a failure of the family
        except Exception as e:  # noqa: BLE001 - any failure: this family falls back to real traces
            self.ok = False
            self.reason = f"not derived: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        self.build_s = time.perf_counter() - t0

    # -------------------------------------------------------------- building
    def _config(self, units: int) -> dict:
        """The config with ``units`` repeating units (units x period blocks per stack)."""
        c = copy.deepcopy(self.content)
        for k, per_layer in self._depth_keys.items():
            c[k] = units * self.period if per_layer else units
        return c

    def _trace(self, content, b, s):
        return trace_cache.trace(Step(model=content, batch=b, seq=s, mode=self.mode, **self.trace_kw))

    def _fit(self, samples: list[pd.DataFrame]) -> None:
        first = samples[0]
        cols = [c for c in first.columns if c not in DROP]
        self.num_cols = [c for c in cols if _is_num(first[c])]
        self.struct_cols = [c for c in cols if c not in self.num_cols]
        n = len(first)
        for i, s in enumerate(samples[1:], 1):
            if len(s) != n:
                self.reason = f"not derived: {len(s)} kernels at sample {i} vs {n} at sample 0"
                return
            for c in self.struct_cols:
                if not np.array_equal(s[c].to_numpy(), first[c].to_numpy()):
                    self.reason = f"not derived: column {c!r} differs between sample traces"
                    return
        vals = np.stack([s[self.num_cols].to_numpy(float) for s in samples])      # (6, n, c)
        nan = np.isnan(vals)
        if not (nan == nan[:1]).all():
            self.reason = "not derived: NaN pattern differs between sample traces"
            return
        self.nan = nan[0]
        self.values = np.where(nan, 0.0, vals).astype(np.longdouble)
        self.integral = np.array([np.all(np.mod(vals[:, :, j][~nan[:, :, j]], 1) == 0)
                                  for j in range(len(self.num_cols))])
        self.struct = first[self.struct_cols].reset_index(drop=True)
        self.dtypes = {c: first[c].dtype for c in self.num_cols}
        self.info = table_info.info(first)
        self.layer = first["layer"].to_numpy(int) if "layer" in first else np.full(n, -1)
        self.ok = True
        self.memory, self.memory_reason = family_memory.fit(self, samples, REDUCED_LAYERS * self.period
                                                            if self.reduced else self.layers)

    # -------------------------------------------------------------- evaluating
    def _eval(self, points, values=None, nan=None, integral=None) -> np.ndarray:
        """(P, n, c) derived numeric cells at the points."""
        values = self.values if values is None else values
        nan = self.nan if nan is None else nan
        integral = self.integral if integral is None else integral
        if self.aux is not None:
            W = aux_weights(points, self.sample_b, self.sample_s, self.aux, self._aux_inv)   # (P, 8)
        else:
            W = lagrange_weights(points, self.sample_b, self.sample_s)               # (P, 6)
        v = np.tensordot(W, values, axes=(1, 0))                         # (P, n, c)
        v = np.where(integral, np.rint(v), v).astype(float)
        v[:, nan] = np.nan
        return v

    def _expansion(self, layers: int) -> tuple[np.ndarray, np.ndarray]:
        """(row of the reduced table, block index in the full model) for every row of the full table.

        Blocks come in units of ``period``; the reduced model has units 0, 1, 2: unit 1 stands for
        units 1 .. U-2 (ascending in forward, descending in backward), unit 2 becomes unit U-1.
        """
        if not self.reduced:
            return np.arange(len(self.layer)), self.layer.copy()
        p = self.period
        units = layers // p
        last = REDUCED_LAYERS - 1
        unit = np.where(self.layer >= 0, self.layer // p, -1)
        phase = self.struct["phase"].to_numpy() if "phase" in self.struct else np.full(len(self.layer), "fw")
        rows, blocks = [], []
        i, n = 0, len(self.layer)
        while i < n:
            if unit[i] == 1:
                j = i
                while j < n and unit[j] == 1:
                    j += 1
                order = range(1, units - 1) if phase[i] == "fw" else range(units - 2, 0, -1)
                for u in order:
                    rows.extend(range(i, j))
                    blocks.extend((u * p + self.layer[i:j] % p).tolist())
                i = j
                continue
            rows.append(i)
            blocks.append((units - 1) * p + self.layer[i] % p if unit[i] == last else self.layer[i])
            i += 1
        return np.asarray(rows), np.asarray(blocks)

    def table(self, batch: int, seq: int, layers: int | None = None) -> pd.DataFrame:
        """The derived kernel table at (batch, seq): same columns and TableInfo as a real trace minus reads/writes."""
        if not self.ok:
            raise DeriveError(self.reason)
        t0 = time.perf_counter()
        layers = self.layers if layers is None else layers
        rows, blocks = self._expansion(layers)
        v = self._eval([(batch, seq)])[0][rows]
        old = self.layer[rows]
        out = self.struct.iloc[rows].reset_index(drop=True)
        for j, c in enumerate(self.num_cols):
            out[c] = v[:, j]
        if "layer" in out:
            out["layer"] = blocks
        if "module" in out:
            mods = out["module"].to_numpy()
            cache: dict = {}
            new = []
            for m, o, blk in zip(mods, old, blocks):
                if o == blk or o < 0:
                    new.append(m)
                    continue
                k = (m, blk)
                if k not in cache:
                    cache[k] = _renumber(m, lambda x, blk=blk, o=o: blk if x == o else x)
                new.append(cache[k])
            out["module"] = new
        for c, dt in self.dtypes.items():
            if pd.api.types.is_integer_dtype(dt):
                out[c] = out[c].astype(dt)
        out = out[[c for c in self.struct_cols + self.num_cols if c in out.columns]]
        order = [c for c in self._column_order() if c in out.columns]
        out = out[order]
        memory = family_memory.table_memory(self, batch, seq, layers, len(out))     # None: not derived
        table_info.attach(out, self._info(batch, seq, layers, time.perf_counter() - t0).replace(memory=memory))
        return out

    def _column_order(self):
        rest = [c for c in self.struct_cols + self.num_cols if c not in schema.KERNEL_COLUMNS]
        return list(schema.KERNEL_COLUMNS) + rest

    def _info(self, batch, seq, layers, seconds) -> table_info.TableInfo:
        """The derived table's record, its memory left as the sample's (``table`` sets the derived one)."""
        a = self.info
        cfg, params, num_layers = dict(a.config), a.params, a.num_layers
        if self.reduced:
            p, units = self.period, layers // self.period
            for k, per_layer in self._depth_keys.items():
                if k in cfg:
                    cfg[k] = units * p if per_layer else units
            params = {}
            for name, numel in a.params.items():
                m = _LAYER_NUMBER_RE.search(name)
                blk = int(m.group(2)) if m else -1
                if blk < 0:
                    params[name] = numel
                elif blk // p == 1:
                    for u in range(1, units - 1):
                        params[_renumber(name, lambda x, u=u: u * p + x % p)] = numel
                elif blk // p == REDUCED_LAYERS - 1:
                    params[_renumber(name, lambda x: (units - 1) * p + x % p)] = numel
                else:
                    params[name] = numel
            step = self._check_num_layers - a.num_layers     # per unit, as the tracer counts
            num_layers = a.num_layers + step * (units - REDUCED_LAYERS)
        cfg["name"] = self.content.get("name", cfg.get("name"))
        return a.replace(config=cfg, params=params, num_layers=num_layers, batch=int(batch), seq=int(seq),
                         trace_s=seconds, derived=True, model=self.content.get("name") or a.model, skipped={})

    def compact(self, points) -> pd.DataFrame:
        """Unique kernels with their launch counts at many (batch, seq) points at once.

        Columns: ``_point`` (index into ``points``), the non-numeric columns except ``module``, the
        numeric columns except ``layer``, and ``count`` (launches: count x block copies). Rows that
        are the same kernel at every point (same structure and polynomial) are merged before
        evaluation, so the cost does not grow with the number of layers.
        """
        if not self.ok:
            raise DeriveError(self.reason)
        rows, _ = self._expansion(self.layers)
        mult = np.bincount(rows, minlength=len(self.layer)).astype(float)
        keep_s = [c for c in self.struct_cols if c != "module"]
        num_j = [j for j, c in enumerate(self.num_cols) if c not in ("layer", "count")]
        cnt_j = self.num_cols.index("count") if "count" in self.num_cols else None
        n = len(self.layer)
        # merge rows with identical structure and identical sample values
        sig = pd.DataFrame({f"s{k}": self.struct[c].to_numpy() for k, c in enumerate(keep_s)})
        # a column NaN on every row (e.g. the conv columns of a text model) tells no rows apart
        sig_j = [j for j in num_j if not self.nan[:, j].all()]
        flat = self.values[:, :, sig_j].transpose(1, 0, 2).reshape(n, -1).astype(float)
        nanflat = np.repeat(self.nan[:, sig_j], 1, axis=1)
        # the value and NaN columns at once (one column at a time fragments the frame: pandas warns per sweep)
        sig = pd.concat([sig, pd.DataFrame(flat, columns=[f"v{k}" for k in range(flat.shape[1])]),
                         pd.DataFrame(nanflat, columns=[f"n{k}" for k in range(nanflat.shape[1])])], axis=1)
        gid = sig.groupby(list(sig.columns), sort=False, dropna=False).ngroup().to_numpy()
        first = pd.Series(np.arange(n)).groupby(gid).first().to_numpy()
        base_count = self.values[0, :, cnt_j].astype(float) if cnt_j is not None else np.ones(n)
        launches = np.bincount(gid, weights=mult * base_count)
        v = self._eval(points, self.values[:, first][:, :, num_j], self.nan[first][:, num_j],
                       self.integral[num_j])                          # (P, u, c')
        P, u = v.shape[0], v.shape[1]
        out = pd.DataFrame({c: np.tile(self.struct[c].to_numpy()[first], P) for c in keep_s})
        for k, j in enumerate(num_j):
            out[self.num_cols[j]] = v[:, :, k].reshape(-1)
        out["count"] = np.tile(launches, P)
        out.insert(0, "_point", np.repeat(np.arange(P), u))
        return out


def compare(derived: pd.DataFrame, real: pd.DataFrame, rtol: float = 1e-12) -> str:
    """'' if the tables are equal kernel by kernel in every column (but reads/writes), else the first difference.

    Numbers are compared exactly, or within ``rtol`` relative where they exceed 2**53 (the tracer's
    float products round there).
    """
    cols = [c for c in real.columns if c not in DROP]
    if len(derived) != len(real):
        return f"{len(derived)} kernels derived vs {len(real)} traced"
    missing = [c for c in cols if c not in derived.columns]
    if missing:
        return f"derived table lacks column(s) {missing}"
    for c in cols:
        a, b = derived[c].to_numpy(), real[c].to_numpy()
        if _is_num(real[c]):
            a, b = a.astype(float), b.astype(float)
            same = (a == b) | (np.isnan(a) & np.isnan(b)) | (np.abs(a - b) <= rtol * np.abs(b)) & (np.abs(b) > 2**53)
        else:
            same = np.array([x == y for x, y in zip(a, b)], dtype=bool)
        if not same.all():
            i = int(np.flatnonzero(~same)[0])
            return f"row {i} ({real['aten_op'].iloc[i] if 'aten_op' in real else ''}) column {c!r}: derived {a[i]!r}, traced {b[i]!r}"
    return ""


FAMILIES: dict = {}


def family_key(model, mode, batch_one, seq_bucket=None, seq_fixed=None, **trace_kw) -> str:
    return trace_cache.key_hash({"config": configs.config_content(model), "mode": mode,
                                 "batch_one": bool(batch_one), "seq_bucket": seq_bucket, "seq_fixed": seq_fixed,
                                 **trace_kw})


def family(model, mode: str = Mode.INF, batch_one: bool = False, seq_bucket: int | None = None,
           seq_fixed: int | None = None, **trace_kw) -> Family:
    """The (per-process memoised) family of a model config and trace options (batch 1 or batch >= 2;
    all sequence lengths, one bucket [lo, 2 lo) of them, or one sequence length)."""
    key = family_key(model, mode, batch_one, seq_bucket, seq_fixed, **trace_kw)
    if key not in FAMILIES:
        FAMILIES[key] = Family(model, mode, batch_one=batch_one, seq_bucket=seq_bucket, seq_fixed=seq_fixed,
                                **trace_kw)
    return FAMILIES[key]


def family_for(model, batch: int, seq: int, mode: str = Mode.INF, allow_bucket: bool = True,
               allow_fixed: bool = False, **trace_kw) -> Family | None:
    """The derivable family that covers (batch, seq), or None (trace for real).

    First the family over all sequence lengths; if its check fails (a shape that is not one
    polynomial in seq that step 6 of the module doc does not cover), the family
    of seq's power-of-two bucket [lo, 2 lo), lo >= MIN_SEQ, with its own samples and odd check point.
    """
    if configs.is_image_model(model):
        return None                    # conv output sides are floors in the image size, not polynomials
    if seq < MIN_SEQ:
        # below the samples' regime one polynomial in seq does not hold; the family of this seq alone
        # (linear in batch, checked at batch 3) does, and spares a full trace per batch size
        if allow_fixed and int(batch) >= 2:
            fam = family(model, mode, seq_fixed=int(seq), **trace_kw)
            return fam if fam.ok else None
        return None
    if int(batch) == 1:
        # the batch >= 2 family of the same model already failed its check on a shape in seq: the
        # batch-1 family (same shapes in seq) would fail the same way; without a bucket to try after
        # it, do not pay for it
        other = FAMILIES.get(family_key(model, mode, False, **trace_kw))
        if other is not None and not other.ok and "check at" in other.reason and not allow_bucket:
            return None
    fam = family(model, mode, batch_one=int(batch) == 1, **trace_kw)
    if fam.max_positions is not None and seq + int(trace_kw.get("past", 0) or 0) > fam.max_positions:
        return None                    # the real tracer says why it cannot run
    if fam.ok:
        return fam
    if "check at" not in fam.reason and "differs between sample" not in fam.reason \
            and "kernels at sample" not in fam.reason:
        return None                    # not reducible at all: no bucket will do better
    if allow_bucket:
        lo = 1 << (int(seq).bit_length() - 1)
        fam = family(model, mode, batch_one=int(batch) == 1, seq_bucket=lo, **trace_kw)
        if fam.ok:
            return fam
    if allow_fixed and int(batch) >= 2:
        # a shape that is not a polynomial in seq even within a bucket (Switch's ceil(seq / experts)):
        # this seq alone, linear in batch
        fam = family(model, mode, seq_fixed=int(seq), **trace_kw)
        return fam if fam.ok else None
    return None
