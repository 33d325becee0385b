"""What a kernel table describes: :class:`TableInfo`, one typed, immutable record per table.

A kernel table is a DataFrame of kernels (``schema.KERNEL_COLUMNS``). What the rows alone do not say -- the model
and its config, the step (batch, seq, past, mode, precision, attention), the parameters, the memory timeline, and
what was done to the table after tracing (fusion, a parallel plan) -- is one :class:`TableInfo`, attached to the
frame under ``frame.attrs["table"]`` and read with :func:`info`.

Why one frozen value and not loose ``attrs`` keys: pandas copies ``attrs`` into every frame an operation returns,
deep-copying each value. A traced table's config, parameter list and memory timeline made that 0.35 s of a new
process's answer, and three work-arounds grew around it (a dict that refused to be copied, an ``attrs`` save and
restore around a ``drop``, predictors stripping ``attrs`` before their own operations). A frozen record is shared
by every copy instead (``__deepcopy__`` returns it), a change is a new record (:meth:`TableInfo.replace`), and a
misspelt key is an ``AttributeError`` instead of a silent default.

The record is stored in the trace cache as data (``datafile.DECODABLE_CLASSES``), never pickled.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pandas as pd

from neusight_core.question.schema import Attention, Mode, Precision

#: the ``attrs`` key the record rides under (the one place a kernel table's metadata lives)
ATTRS_KEY = "table"


class KernelTableError(ValueError):
    """A frame used as a traced kernel table that carries no :class:`TableInfo`."""


@dataclass(frozen=True)
class TableInfo:
    """The step a kernel table describes. Dicts inside are read-only by convention (shared by every copy)."""
    config: dict                        # the model config's content, with its "name"
    model: str                          # the config's name (or model type)
    batch: int
    seq: int                            # tokens per sample; the image side in pixels for vision models
    mode: str = Mode.INF                # "inf" or "train"
    past: int = 0                       # cached tokens of a decode step
    dtype: str = Precision.FP32         # the precision the step runs in
    attention: str = Attention.EAGER    # "eager" or "sdpa"
    image_size: int = 0                 # the image side of a vision model (0: a text model)
    model_class: str = ""               # the transformers class traced
    hidden: int = 0
    vocab: int = 0
    num_layers: int = 0                 # transformer blocks as the tracer counts them
    params: dict = field(default_factory=dict)          # parameter name -> elements
    memory: dict | None = None          # the allocation timeline (trace.py's ``_memory_summary``); None: not known
    unclassified: dict = field(default_factory=dict)    # aten op -> calls the tracer could not classify
    skipped: dict = field(default_factory=dict)
    scalar_queries: dict = field(default_factory=dict)
    trace_s: float = 0.0                # seconds the trace (or derivation) took
    derived: bool = False               # evaluated from polynomials of sample traces (table_families.py), not traced
    fused: bool = False                 # fusion.fuse applied
    plan: str | None = None             # parallel plan applied: "dp", "tp", "pp" (None: one GPU)
    gpus: int = 1
    micro_batches: int = 1

    @property
    def step(self):
        """The ``question.step.Step`` this table was built for, read from the record (its model by the config's
        name). The traced step's gradients accumulate: a step with fresh gradients is this table without its ``acc``
        rows (``cost.engine``)."""
        from neusight_core.question.step import Step
        image = self.image_size > 0
        return Step(model=self.model, batch=self.batch, seq=None if image else self.seq,
                    image_size=self.image_size if image else None, mode=self.mode, fusion=self.fused,
                    parallel=self.plan, gpus=self.gpus, micro_batches=self.micro_batches, past=self.past,
                    dtype=self.dtype, attention=self.attention)

    def replace(self, **changes) -> "TableInfo":
        """A new record with ``changes`` (the record itself never changes)."""
        return dataclasses.replace(self, **changes)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


def info(frame: pd.DataFrame) -> TableInfo:
    """The record of a kernel table; :class:`KernelTableError` (one line) if ``frame`` has none."""
    got = frame.attrs.get(ATTRS_KEY)
    if not isinstance(got, TableInfo):
        raise KernelTableError("not a traced kernel table (no TableInfo): build it with trace.trace_model")
    return got


def info_or_none(frame: pd.DataFrame) -> TableInfo | None:
    """The record of a kernel table, or None for a frame built by hand."""
    got = frame.attrs.get(ATTRS_KEY)
    return got if isinstance(got, TableInfo) else None


def attach(frame: pd.DataFrame, record: TableInfo | None) -> pd.DataFrame:
    """``frame`` (in place, returned for chaining) described by ``record``; None leaves it without one."""
    if record is None:
        frame.attrs.pop(ATTRS_KEY, None)
    else:
        frame.attrs[ATTRS_KEY] = record
    return frame


def carry(frame: pd.DataFrame, source: pd.DataFrame, **changes) -> pd.DataFrame:
    """``frame`` described by ``source``'s record with ``changes`` (nothing if ``source`` has none)."""
    record = info_or_none(source)
    return attach(frame, record.replace(**changes) if record is not None and changes else record)
