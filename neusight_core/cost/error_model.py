"""How far an answer may be off: the interval beside each estimate, at a stated coverage (docs/error_bars.md).

An answer is a sum of kernel times, plus, in eager execution, the host's launches (``host.py``). Its error, as the
log of measured over predicted, is modelled from what answered each kernel (``KernelPredictor.answered_by``: a
network of one op class, a BF16 tensor-core network, the memory law, the roofline, the network model):

    kernels:  e_K = sum_c w_c b_c  +  sum_k (t_k / K) u_k
              b_c: a bias shared by every kernel part c answers on one GPU (the networks err the same way on all of
                   a GPU's GEMMs), weighted by the part's share w_c of the kernel time K: it does not shrink with
                   more kernels;
              u_k: a kernel's own error, independent between distinct kernels (a kernel launched n times errs n
                   times the same: its weight is its count times its time);
    host:     e_H, the spread of the per-launch cost between machines (eager only);
    seeds:    e_S, how far two seeds of the recipe answer apart.

Parts that are correlated add linearly (the shared biases of the parts), independent ones in quadrature:

    s_K = sqrt( (sum_c w_c s_c)^2 + sum_k (t_k / K)^2 u_c(k)^2 + s_seed^2 )
    s   = sqrt( ((1 - h) s_K)^2 + (h s_host)^2 ),   h = H / (H + K), the host's share (0 with graph execution)

with s_c, u_c the root mean square of the held-out GPUs' mean log residual of part c and the spread around it
(leave one training GPU out: ``studies/calibration.py`` measures them), s_host from the recorded machines. A part
the data never measured (the FP32 networks on half-precision rows, the roofline's rows, the networks outside their
data) gets the largest measured part's numbers: an extrapolation is given width, not a guess.

The interval at coverage p is ``estimate * exp(+-k z_p s)``, z_p the normal's (1 + p) / 2 quantile and k one scale
calibrated on held-out end-to-end answers: the 80 % quantile of |log(measured / predicted) / s| over z_0.8 (split by
GPU: the training GPUs' labelled steps, each predicted by networks trained without that GPU). One scale and the
normal's shape, not the scores' own quantiles: the steps of one GPU share its bias, so 44 steps are five draws of
it, too few for a quantile function of their own; symmetric in log, because the side on which the calibration GPUs
err (the folds over-predict them) is not one a new GPU shares.
A GPU whose figures lie outside the training GPUs' (``latency.range_note``) takes each tensor-core part's largest
held-out GPU bias instead of their root mean square.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from neusight_core import paths
from neusight_core.predictors.base import ANSWER_HALF, ANSWER_LAW, ANSWER_NETWORK, ANSWER_ROOFLINE, ANSWER_TENSOR_CORE
from neusight_core.predictors.tensor_core import NETWORKS
from neusight_core.question.schema import OpClass

#: The host's spread between machines (log): the same eager decode step took 20.7 and 34.8 ms on two H100 machines
#: (2026-11-26, docs/tier2.md; ``host.DEFAULT_LAUNCH_US``'s sources): |ln(34.8 / 20.7)| / sqrt(2) per machine.
HOST_SIGMA = abs(math.log(34.8 / 20.7)) / math.sqrt(2)

#: the coverage the calibration's scale is set at (the default coverage)
CALIBRATED_AT = 0.8


def normal_quantile(p: float) -> float:
    # the standard library's, not scipy.stats': importing that costs a question half a second
    return statistics.NormalDist().inv_cdf(p)


#: what ``ErrorModel.parts`` names the spread of the seeds and the host by
SEEDS, HOST = "seeds", "host"


@dataclass(frozen=True)
class ErrorModel:
    """One recipe and seed's error model: the parts' sizes (log), the calibration's scores, what each rests on."""
    predictor: str
    seed: int
    quick: bool                       # the weights it is for: quick or full
    shared: dict                      # part -> s_c, the RMS of the held-out GPUs' mean log residual
    independent: dict                 # part -> u_c, the spread of a kernel's log residual around its GPU's mean
    shared_outside: dict = field(default_factory=dict)   # part -> the largest held-out GPU bias (GPUs outside range)
    # the same on the GPUs each part was trained on (its own training GPUs, predicted by the answering weights)
    seen_shared: dict = field(default_factory=dict)
    seen_independent: dict = field(default_factory=dict)
    seen_gpus: dict = field(default_factory=dict)       # part -> the GPUs it was trained on
    seed_sigma: float = 0.0           # s_seed
    host_sigma: float = HOST_SIGMA
    scores: tuple = ()                # sorted z of the calibration set; () = uncalibrated (q = -1, 1)
    rows: dict = field(default_factory=dict)             # what each number rests on (counts, GPUs, data)
    notes: str = ""

    # -------------------------------------------------------------- the parts
    def part(self, name: str, gpu: str = "", outside: bool = False) -> tuple[float, float]:
        """(s_c, u_c) of a part on ``gpu``: its own training GPUs' numbers on one of them; else the held-out GPUs', a
        measured-kernel part (tensor-core networks, memory law) at its largest held-out GPU's bias on a GPU
        ``outside`` their training range. A part the data never measured takes the numbers of the measured parts
        nearest to it (``nearest``) at their largest held-out GPU's bias: an extrapolation gets width, not a guess."""
        if gpu and gpu in self.seen_gpus.get(name, ()):
            return self.seen_shared[name], self.seen_independent.get(name, 0.0)
        if name in self.shared:
            s = self.shared[name]
            if outside and (name.startswith(ANSWER_TENSOR_CORE) or name == ANSWER_LAW):
                s = self.shared_outside.get(name, s)
            return s, self.independent.get(name, 0.0)
        near = [p for p in nearest(name) if p in self.shared] or list(self.shared)
        if not near:
            return 0.0, 0.0
        return (max(self.shared_outside.get(p, self.shared[p]) for p in near),
                max(self.independent.get(p, 0.0) for p in near))

    @property
    def scale(self) -> float:
        """k, the kernel part's calibration: the calibration's 80 % quantile of |z| over the normal's (1.2816);
        1 uncalibrated."""
        if not self.scores:
            return 1.0
        q = float(np.quantile(np.abs(np.asarray(self.scores, float)), CALIBRATED_AT, method="linear"))
        return q / normal_quantile((1 + CALIBRATED_AT) / 2)

    @staticmethod
    def quantiles(coverage: float) -> tuple[float, float]:
        """(-q, q), q the normal's (1 + coverage) / 2 quantile: the interval is symmetric in log."""
        q = normal_quantile((1 + coverage) / 2)
        return -q, q

    # -------------------------------------------------------------- storage
    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["scores"] = list(self.scores)
        return json.dumps(d, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ErrorModel":
        d = json.loads(text)
        d["scores"] = tuple(d.get("scores", ()))
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def nearest(name: str) -> list[str]:
    """The measured parts nearest to a part without data: the FP32 network of the same class for its half-precision
    rows, the vector classes' networks for the roofline's rows (memory-bound operators no network covers), the
    tensor-core networks for the rows they answer outside their data (attention backwards, grouped GEMMs)."""
    if name.endswith(ANSWER_HALF):
        return [name[: -len(ANSWER_HALF)]]
    if name == ANSWER_ROOFLINE:
        return [f"{ANSWER_NETWORK} {c}" for c in (OpClass.VEC, OpClass.SOFTMAX, OpClass.LAYERNORM)]
    if name.startswith(ANSWER_TENSOR_CORE):
        return [f"{ANSWER_TENSOR_CORE} {n}" for n in NETWORKS]
    return []


def folder() -> Path:
    return paths.trained_dir() / "error_models"


def path_of(predictor: str, seed: int, quick: bool) -> Path:
    return folder() / f"{predictor}{'-quick' if quick else ''}-seed{int(seed)}.json"


def missing_note(predictor: str, seed: int, quick: bool, calibrated_kind: bool = True) -> str:
    """Why an answer has no interval, and how to get one (``calibrated_kind``: the predictor is a NeuSight recipe,
    the only kind ``studies/calibration.py`` calibrates: a baseline's answers carry no interval)."""
    if not calibrated_kind:
        return f"no interval: the error model is made for the NeuSight recipes, not the baseline {predictor}"
    return (f"no interval: {predictor} seed {seed}'s {'quick' if quick else 'full'} weights have no error model yet "
            f"(make it: .venv/bin/python -m neusight_core.studies.calibration --predictor {predictor} --seed {seed}"
            f"{'' if quick else ' --full'}, about a minute; ./run_all.sh makes it for the run's weights)")


def save(model: ErrorModel) -> Path:
    """Write ``model`` whole or not at all (a temporary file renamed over the old one)."""
    f = path_of(model.predictor, model.seed, model.quick)
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f".{f.name}.tmp")
    tmp.write_text(model.to_json())
    tmp.replace(f)
    _load.cache_clear()
    return f


def load(predictor: str, seed: int, quick: bool) -> ErrorModel | None:
    """The saved error model of a recipe, seed and kind of weights, or None (not calibrated yet, or unreadable)."""
    f = path_of(predictor, seed, quick)
    try:
        stamp = f.stat().st_mtime_ns
    except OSError:
        return None
    return _load(str(f), stamp)


@functools.lru_cache(maxsize=32)
def _load(f: str, stamp: int) -> ErrorModel | None:
    try:
        return ErrorModel.from_json(Path(f).read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return None


def outside_figures(device) -> list[str]:
    """The figures of ``device`` (``tensor_core.RANGE_FIGURES``) that lie outside those of the tensor-core networks'
    training GPUs (``measured_kernels.split``), each with its value and the training GPUs' range."""
    from neusight_core.data import devices, measured_kernels
    from neusight_core.predictors import tensor_core
    train = [devices.get_device(n) for n in measured_kernels.split()["training"]]
    return tensor_core.outside_range(devices.get_device(device), train)


def outside_range(device) -> bool:
    return bool(outside_figures(device))


# ------------------------------------------------------------------------------ one answer's spread
@dataclass(frozen=True)
class Spread:
    """An answer's spread: ``sigma`` (log) and each contributor's share of it, largest first."""
    sigma: float
    parts: tuple                      # ((name, size in log), ...), largest first

    def top(self, n: int = 2) -> str:
        """The ``n`` largest contributors, each with its share of the contributors' sizes added up."""
        total = sum(size for _, size in self.parts) or 1.0
        return ", ".join(f"{name} {size / total:.0%}" for name, size in self.parts[:n])


def spread(model: ErrorModel, part_ms: dict, part_sq: dict, kernel_ms: float, host_ms: float, gpu: str = "",
           outside: bool = False) -> Spread:
    """The spread of one answer: ``part_ms`` {part: its kernels' time}, ``part_sq`` {part: sum over its distinct
    kernels of (count x time)^2}, ``kernel_ms`` K, ``host_ms`` H (eager's host time; 0 with graph execution), on
    ``gpu`` (``outside``: beyond the tensor-core networks' training GPUs). The kernel part is scaled by the calibration;
    the host's spread is measured on machines directly and is not."""
    K = float(kernel_ms)
    if not (K > 0 and math.isfinite(K)):
        return Spread(float("nan"), ())
    shared, ind_sq, sizes = 0.0, 0.0, {}
    for name, t in part_ms.items():
        s_c, u_c = model.part(name, gpu, outside)
        a, b = t / K * s_c, part_sq.get(name, 0.0) / K**2 * u_c**2
        shared += a
        ind_sq += b
        sizes[name] = math.hypot(a, math.sqrt(b))
    k = model.scale
    s_k = k * math.sqrt(shared**2 + ind_sq + model.seed_sigma**2)
    H = float(host_ms) if host_ms and math.isfinite(host_ms) else 0.0
    # the step is the slower of the kernels and the host's launches (host.py): its error is that one's
    h = 1.0 if H > K else 0.0
    sigma = math.hypot((1 - h) * s_k, h * model.host_sigma)
    sizes = {n: (1 - h) * k * v for n, v in sizes.items()}
    if model.seed_sigma:
        sizes[SEEDS] = (1 - h) * k * model.seed_sigma
    if h:
        sizes[HOST] = model.host_sigma
    return Spread(sigma, tuple(sorted(((n, v) for n, v in sizes.items() if v > 0), key=lambda kv: -kv[1])))


def interval(estimate_ms: float, sigma: float, coverage: float, model: ErrorModel) -> tuple[float, float]:
    """(lo, hi) ms around ``estimate_ms`` at ``coverage``: it holds the estimate."""
    q_lo, q_hi = model.quantiles(coverage)
    return estimate_ms * math.exp(q_lo * sigma), estimate_ms * math.exp(q_hi * sigma)
