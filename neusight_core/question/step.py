"""The question, declared once. Every option of a prediction request is one field of :class:`Scenario`, declared with
:func:`option`: its kind of value and that kind's check, its help text, the user's default, the paper's default and
whether a kernel table depends on it. Everything else that names the options is generated from these fields:

- :class:`Step`, what one kernel table is built for: the fields declared ``table=True`` (the engine groups requests
  by it, the trace cache keys on it);
- ``INPUTS``, the sweep's and the engine's input columns, in the order the fields are declared;
- ``PAPER``, the paper's setting (the fields that declare a ``paper`` default);
- the ``predict`` and ``sweep`` options of the CLI (``__main__``), ``sweep.grid``'s keywords, ``request.scenario_of``
  (a configuration row -> its fields) and ``latency.predict_model``'s keywords.

A new option is one field here (its enum, if it has one, in ``schema``) and the code that uses it
(docs/architecture.md, "Add an option"). Checks across fields (a plan needs GPUs, tensor parallelism needs the heads
to divide, ...) and the defaults that depend on other fields are in ``scenario.py``, which builds a Scenario.

No torch, no pandas (numpy only): the CLI's parser reads this module.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field

import numpy as np

from neusight_core.question import schema
from neusight_core.question.schema import Attention, Comm, Execution, Grads, KVCache, Mode, Plan, Precision


class LatencyInputError(ValueError):
    """A request no GPU run could be (zero batch, unknown mode or plan, missing link bandwidth, ...): one line."""


class SweepInputError(ValueError):
    """A cell of a configuration frame that is not a value of its field (a non-integer batch, ...)."""


def one_line(text: str, limit: int = 300) -> str:
    """A message as one line: a first line that ends in a colon (a library's "Validation error for field 'x':" with
    the reason below it) is joined with the lines that follow, up to ``limit`` characters."""
    lines = [x.strip() for x in str(text).strip().splitlines() if x.strip()]
    if not lines:
        return ""
    out = lines[0]
    for more in lines[1:]:
        if not out.endswith(":") or len(out) >= limit:
            break
        out = f"{out} {more}"
    return out[:limit]


#: No size of a request is larger (2^40 tokens, sequences or GPUs): beyond it a number is a typo, and numpy's
#: 64-bit integers would overflow on the products of sizes the tracer and the memory model take
MAX_SIZE = 2 ** 40

#: Physical plausibility of a link (generous: 10x beyond any GPU of 2026): outside, a typo or a unit mistake
LINK_LIMITS_GBS = (0.001, 100_000.0)


def not_given(v) -> bool:
    """A missing value: None, NaN (a configuration frame's empty cell) or pandas' NA."""
    if v is None:
        return True
    if isinstance(v, (str, int)):          # the common case, asked thousands of times in a sweep: answered first
        return False
    return (isinstance(v, float) and math.isnan(v)) or type(v).__name__ == "NAType"


# ------------------------------------------------------------------------------ kinds of value
class Kind:
    """How an option's values are read and checked: ``check`` a value given to the API (one-line
    ``LatencyInputError``), ``text`` one value typed on the command line, ``cell`` a configuration frame's cell
    (None when not given; a one-line ``SweepInputError``)."""
    choices: tuple | None = None        # the CLI's choices, where there is a fixed list

    def check(self, what: str, v):
        if v is None:               # only a field without a default is checked when missing
            raise LatencyInputError(f"{what} must be given")
        return v

    def text(self, s: str):
        """One value typed on the command line (a ValueError's text is the CLI's error)."""
        return s

    def cell(self, name: str, v):
        return None if not_given(v) else v


class Count(Kind):
    """An integer of at least ``minimum`` (a batch, a GPU count; ``minimum`` 0: a KV-cache length)."""

    def __init__(self, minimum: int = 1):
        self.minimum = minimum

    def check(self, what, v):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < self.minimum:
            kind = {1: "a positive integer", 0: "a non-negative integer"}.get(self.minimum,
                                                                              f"an integer of at least {self.minimum}")
            raise LatencyInputError(f"{what} must be {kind}, got {v!r}")
        return int(v)

    text = staticmethod(int)           # argparse names it: "invalid int value: '4.5'"

    def cell(self, name, v):
        # a frame's integer column holds floats where it has a NaN: 2.0 is 2, 2.5 is not an integer
        if not_given(v):
            return None
        bad = SweepInputError(f"{name} must be an integer from {self.minimum} to {MAX_SIZE:,}, got {v!r}")
        if isinstance(v, bool) or (isinstance(v, float) and (not math.isfinite(v) or v != int(v))):
            raise bad
        try:
            iv = int(v)
        except (TypeError, ValueError, OverflowError):
            raise bad from None
        if not self.minimum <= iv <= MAX_SIZE:
            raise bad
        return iv


class Choice(Kind):
    """One member of a ``schema`` enum (its text is accepted: members are strings)."""

    def __init__(self, enum):
        self.enum = enum
        self.choices = schema.words(enum)
        self.members = {m.value: m for m in enum}      # a look-up, not enum(v): a sweep checks thousands of values

    def check(self, what, v):
        m = self.members.get(v) if isinstance(v, str) else None
        if m is None:
            raise LatencyInputError(f"{what} must be one of {', '.join(self.choices)}, got {v!r}")
        return m

    def cell(self, name, v):
        # an empty cell, or "none" for an option whose default is none (a sweep's single-GPU rows), is not given
        return None if not_given(v) or v in ("", "none") else v


class Flag(Kind):
    """True or False (a frame's cell may say it as text, or as 0 / 1)."""

    def check(self, what, v):
        if isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, np.integer)) and v in (0, 1)):
            return bool(v)
        raise LatencyInputError(f"{what} must be True or False, got {v!r}")

    def cell(self, name, v):
        if not_given(v):
            return None
        if isinstance(v, str):
            word = v.strip().lower()
            if word not in ("true", "false", "1", "0", ""):
                raise SweepInputError(f"{name} must be true or false, got {v!r}")
            return word in ("true", "1")
        if isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, float, np.integer, np.floating)) and v in (0, 1)):
            return bool(v)
        raise SweepInputError(f"{name} must be true or false, got {v!r}")


class Bandwidth(Kind):
    """A link's bandwidth in GB/s, within ``LINK_LIMITS_GBS``."""

    def check(self, what, v):
        try:
            x = float(v)
        except (TypeError, ValueError):
            x = float("nan")
        if isinstance(v, bool) or not (math.isfinite(x) and LINK_LIMITS_GBS[0] <= x <= LINK_LIMITS_GBS[1]):
            raise LatencyInputError(f"{what} must be a positive number of GB/s up to {LINK_LIMITS_GBS[1]:g}, "
                                    f"got {v!r}")
        return x

    def text(self, s):
        try:
            x = float(s)
        except ValueError:
            x = float("nan")
        if not (math.isfinite(x) and x > 0):
            raise ValueError(f"link bandwidth must be a positive number of GB/s, got {s!r}")
        return x

    def cell(self, name, v):
        if not_given(v):
            return None
        try:
            return float(v)
        except (TypeError, ValueError):
            raise SweepInputError(f"{name} must be a number of GB/s, got {v!r}") from None


class Share(Kind):
    """A fraction within ``limits`` (both included)."""

    def __init__(self, limits: tuple[float, float]):
        self.limits = limits

    def _value(self, v, error, who: str) -> float:
        """``v`` as a number within the limits, else ``error`` in one line (``who`` opens it where it names the option;
        a bool is no number here)."""
        try:
            x = float("nan") if isinstance(v, bool) else float(v)
        except (TypeError, ValueError):
            x = float("nan")
        if not (math.isfinite(x) and self.limits[0] <= x <= self.limits[1]):
            raise error(f"{who}must be a number from {self.limits[0]:g} to {self.limits[1]:g}, got {v!r}")
        return x

    def check(self, what, v):
        return self._value(v, LatencyInputError, f"{what} ")

    def text(self, s):
        return self._value(s, ValueError, "")

    def cell(self, name, v):
        return None if not_given(v) else self._value(v, SweepInputError, f"{name} ")


#: the coverage an interval may be asked at: below a half it says little, at 1 it would be unbounded
COVERAGE_LIMITS = (0.5, 0.99)


# ------------------------------------------------------------------------------ an option's declaration
REQUIRED = dataclasses.MISSING      # no default: the question must say it


@dataclass(frozen=True)
class Rule:
    """A user's default that depends on the other fields or the model; ``says`` is the rule in words (the help text
    quotes it), ``scenario.py`` applies it."""
    says: str


@dataclass(frozen=True)
class Option:
    """What an option is, beside its name (``Scenario``'s field metadata, ``OPTION_KEY``)."""
    kind: Kind
    help: str                    # ``predict --help``: one value
    many: str | None             # ``sweep --help``: a comma-separated list; None: one value in a sweep too
    user: object                 # the user's default: a value, a Rule, or REQUIRED
    paper: object                # the paper's setting, where it differs from the user's (else REQUIRED: none)
    what: str                    # the option in messages ("GPU count must be ...")
    table: bool                  # a kernel table depends on it (a field of the Step)


OPTION_KEY = "option"


def option(kind: Kind, *, help: str, many: str | None = "", user=REQUIRED, paper=REQUIRED, what: str = "",
           table: bool = False):
    """A field of :class:`Scenario` declared with its metadata. ``many`` "": the sweep's help is ``help``;
    ``user``: the dataclass default when it is a plain value (a Rule or REQUIRED: the field has none, ``scenario``
    resolves it)."""
    meta = {OPTION_KEY: Option(kind, help, help if many == "" else many, user, paper, what, table)}
    plain = user is not REQUIRED and not isinstance(user, Rule)
    return field(default=user, metadata=meta) if plain else field(metadata=meta)


# ------------------------------------------------------------------------------ the declaration
class Sized:
    """The size of a request or a step: ``seq`` for a text model, ``image_size`` for an image model."""

    @property
    def image(self) -> bool:
        return self.image_size is not None

    @property
    def size(self) -> int:
        """The tracer's size argument: the sequence length, or the image side."""
        return self.seq if self.image_size is None else self.image_size


@dataclass(frozen=True, kw_only=True)
class Scenario(Sized):
    """A validated request (built by ``scenario.scenario``): the Step its kernel table is built for, plus the device
    and how the step runs. Its size is ``seq``, the sequence length of a text model, or ``image_size``, the image side
    of an image model: exactly one of the two is set (``size`` is the tracer's argument, either). ``link_gbs`` is
    resolved (given, or the catalogue's link of the device when a plan needs one; None without a plan). The fields'
    order is the order of the sweep's columns."""
    model: object = option(Kind(), table=True, help="config name (see `models`) or path to a HF config JSON",
                           many="model name(s) or config path(s), comma-separated")
    device: str = option(Kind(), help="GPU name, file stem or alias (see `devices`)",
                         many="GPU name(s), comma-separated")
    batch: int = option(Count(), table=True, help="global batch size", many="batch size(s), e.g. 1,2,4,8")
    seq: int | None = option(Count(), table=True, user=None, what="sequence length",
                             help="sequence length (text models)",
                             many="sequence length(s) of the text models, e.g. 512,1024")
    image_size: int | None = option(Count(), table=True, user=None, what="image size",
                                    help="image side in pixels (image models: resnet50, vit_b16; default 224)",
                                    many="image side(s) of the image models, e.g. 224,384 (default 224)")
    mode: Mode = option(Choice(Mode), table=True, user=Mode.INF,
                        help="inf (a forward pass: prefill, or one decode step with --seq 1 --past N) or train "
                             "(forward, backward, optimizer step)",
                        many="inf, train or inf,train (a decode step: --seq 1 --past N)")
    fusion: bool = option(Flag(), table=True, user=False, many=None,
                          help="operator fusion as torch.compile would do")
    parallel: Plan | None = option(Choice(Plan), table=True, user=None, what="parallel plan",
                                   help="dp, tp, pp or ep (tensor parallelism whose mixture-of-experts layers spread "
                                        "their experts over the GPUs)",
                                   many="dp, tp, pp, ep or none (comma-separated for several)")
    gpus: int = option(Count(), table=True, user=Rule("4 with --parallel (the paper's setting), else 1"),
                       what="GPU count", help="GPUs for --parallel", many="GPU count(s) for --parallel")
    micro_batches: int = option(Count(), table=True, user=1, what="micro-batch count", many=None,
                                help="PP micro-batches")
    link_gbs: float | None = option(Bandwidth(), user=Rule("the catalogue's link of the GPU"), what="link bandwidth",
                                    many=None, help="link peak GB/s of --parallel")
    past: int = option(Count(0), table=True, user=0, what="past (KV cache length)",
                       help="inference on a KV cache of this many tokens (extension; --seq 1 = one decode step)",
                       many="KV cache length(s) of inference, e.g. 1024,4096 (a decode step: --seq 1 --past N)")
    kv_cache: KVCache = option(Choice(KVCache), table=True, user=KVCache.APPEND, what="KV cache",
                               help="with --past: append (Hugging Face's cache: each step copies the cache with its new "
                                    "keys and values into a new tensor) or paged (a serving engine's: the step writes "
                                    "only its new tokens')",
                               many="append, paged or both, comma-separated (with --past)")
    dtype: Precision = option(Choice(Precision), table=True, user=Precision.FP32,
                              help="precision (fp32 = the paper, TF32 off). bf16 / fp16 with neusight: GEMMs and "
                                   "fused attention from networks trained on measured kernels, memory-bound kernels "
                                   "by a memory law; else extrapolations: GEMMs at the dense tensor-core peak, "
                                   "2-byte elements. fp8 (inference, GPUs with FP8 tensor cores): the transformer "
                                   "layers' linear GEMMs in FP8 (W8A8, one byte per weight) from a network trained on "
                                   "NVIDIA's measured FP8 GEMMs; attention, the head and memory-bound kernels in bf16, "
                                   "as vLLM's FP8 checkpoints run",
                              many="precision(s), comma-separated, of fp32 (the paper), tf32, fp16, bf16, fp8")
    attention: Attention = option(Choice(Attention), table=True, paper=Attention.EAGER,
                                  user=Rule("what Hugging Face picks for the model (sdpa where it supports it)"),
                                  help="eager (the paper's: Q K^T, softmax, P V as separate kernels) or sdpa (one "
                                       "fused kernel per layer)",
                                  many="eager or sdpa, comma-separated for both")
    execution: Execution = option(Choice(Execution), user=Execution.EAGER, paper=Execution.GRAPH,
                                  help="eager (eager PyTorch, the host launching each kernel: the step takes at least "
                                       "the host's launch time, NEUSIGHT_HOST_LAUNCH_US) or graph (CUDA graphs, "
                                       "torch.compile with cudagraphs, serving engines: the kernel sum)",
                                  many="eager or graph, comma-separated for both")
    grads: Grads = option(Choice(Grads), table=True, paper=Grads.ACCUMULATE,
                          user=Rule("fresh (PyTorch's zero_grad default), accumulate with --parallel pp"),
                          help="training: fresh (gradients start from none) or accumulate (added into the step "
                               "before's, the paper's loop: one more kernel per parameter; pipeline parallelism "
                               "always accumulates)",
                          many="fresh or accumulate, comma-separated for both")
    comm: Comm = option(Choice(Comm), user=Comm.NCCL, paper=Comm.BANDWIDTH,
                        help="collectives of --parallel: nccl (the link's bandwidth plus NCCL's measured fixed cost "
                             "per all-reduce, 8-19 us on 2-8 GPUs) or bandwidth (the link alone, the paper's model)",
                        many="nccl or bandwidth, comma-separated for both")

    coverage: float = option(Share(COVERAGE_LIMITS), user=0.8, what="coverage",
                             help="the interval's coverage, 0.5-0.99: the share of such answers whose measured time "
                                  "it holds (its error model: docs/error_bars.md)",
                             many="coverage(s) of the interval, 0.5-0.99, comma-separated")

    def __post_init__(self):
        if (self.seq is None) == (self.image_size is None):
            raise LatencyInputError("a scenario has a sequence length (text model) or an image size (image "
                                    f"model), exactly one: got seq={self.seq}, image_size={self.image_size}")

    @property
    def step(self) -> "Step":
        """The kernel table this request needs (:meth:`Step.of`)."""
        return Step.of(self)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@functools.lru_cache(maxsize=None)
def _options(cls) -> tuple:
    return tuple((f.name, f.metadata[OPTION_KEY]) for f in dataclasses.fields(cls) if OPTION_KEY in f.metadata)


def options(cls=Scenario) -> dict:
    """{field name: :class:`Option`} of the declared fields, in their order (read once per class: a sweep builds
    thousands of requests)."""
    return dict(_options(cls))


def plain_defaults(cls=Scenario) -> dict:
    """{field name: the user's default} of the fields whose default is a plain value (None included)."""
    return {name: o.user for name, o in _options(cls)
            if o.user is not REQUIRED and not isinstance(o.user, Rule)}


#: the request's fields in declaration order: the sweep's and the engine's input columns
INPUTS = list(options())

#: the paper's setting: eager attention, the step as its kernel sum, gradients accumulated into (the authors' loop),
#: collectives timed by the link's bandwidth alone (the authors' network model). The reproduction (Tier 0/1) asks for
#: it explicitly; a question that does not say gets what people run (the fields' user defaults).
PAPER = {name: o.paper for name, o in options().items() if o.paper is not REQUIRED}


# ------------------------------------------------------------------------------ the step
class _StepMethods(Sized):
    """What a :class:`Step` can say beyond its fields."""

    @property
    def accumulate_grads(self) -> bool:
        """The traced step's gradients are added into existing ones (acc rows); a fresh training step drops them."""
        return self.grads is Grads.ACCUMULATE

    @classmethod
    def of(cls, r) -> "Step":
        """The kernel table a request needs (a Scenario, or a dict of its fields), with the fields that do not
        change the table at their neutral value, so that requests share tables: GPUs and micro-batches only with the
        plan that uses them, attention unset = eager, gradients ``fresh`` only in training (elsewhere nothing
        accumulates, and the accumulate table serves), the KV cache's kind only with a cache (``past``)."""
        get = r.get if isinstance(r, dict) else lambda k, d=None: getattr(r, k, d)
        plan = get("parallel")
        fresh = get("mode") == Mode.TRAIN and get("grads") == Grads.FRESH
        fields = {name: get(name) for name in _field_names(cls)}        # any field as the request has it
        fields.update(model=str(get("model")), batch=int(get("batch")), mode=Mode(get("mode")),
                      fusion=bool(get("fusion")), parallel=None if plan is None else Plan(plan),
                      gpus=int(get("gpus")) if plan else NEUTRAL["gpus"],
                      micro_batches=int(get("micro_batches")) if plan == Plan.PP else 1, past=int(get("past") or 0),
                      kv_cache=KVCache(get("kv_cache") or KVCache.APPEND) if get("past") else KVCache.APPEND,
                      dtype=Precision(get("dtype")), attention=Attention(get("attention") or NEUTRAL["attention"]),
                      grads=Grads.FRESH if fresh else NEUTRAL["grads"])
        return cls(**fields)

    def replace(self, **changes) -> "Step":
        return dataclasses.replace(self, **changes)


#: The table's value of a field whose user default is a rule, where the request does not change the table: one GPU
#: without a plan, the tracer's eager attention, gradients accumulated into (the traced step; a fresh one drops rows)
NEUTRAL = {"gpus": 1, "attention": Attention.EAGER, "grads": Grads.ACCUMULATE}


@functools.lru_cache(maxsize=None)
def _field_names(cls) -> tuple:
    return tuple(f.name for f in dataclasses.fields(cls))


def _step_field(f: dataclasses.Field):
    # the field as Scenario declares it, with its default where the user's is a plain value, else the neutral one
    return (f.name, f.type, field(default=NEUTRAL.get(f.name, f.default), metadata=f.metadata))


#: What one kernel table is built for: the fields of :class:`Scenario` declared ``table=True``, frozen and hashable
#: (the engine groups requests by it; the trace cache keys on it). ``Step.of(scenario)`` is a request's.
Step = dataclasses.make_dataclass(
    "Step", [_step_field(f) for f in dataclasses.fields(Scenario) if f.metadata[OPTION_KEY].table],
    bases=(_StepMethods,), frozen=True, kw_only=True)
Step.__module__ = __name__
Step.__doc__ = ("What one kernel table is built for: the fields of Scenario declared table=True (model, batch, seq or "
                "image_size, mode, fusion, plan, GPUs, micro-batches, past, dtype, attention, grads).")
