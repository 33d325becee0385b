"""Sweeps: many configurations predicted together (docs/interfaces.md, "Sweeps").

    from neusight_core.cost import sweep
    df = sweep.sweep(["gpt2_large", "bert_large"], ["H100", "A100-40GB"], batches=[1, 2, 4, 8],
                     seqs=[128, 256, 512], modes=["inf", "train"], predictors=["neusight", "roofline"])

How a sweep runs
1. Every configuration (model, device, batch, seq, mode, fusion, parallel plan, gpus, micro-batches,
   link bandwidth, past) is checked; a bad one gets its message in the ``error`` column and the
   sweep goes on. Image models have an ``image_size`` instead of a ``seq`` (the column of
   the other kind is empty); their tables are always traced (no shape derivation across image sizes).
2. Kernel tables are needed per (model, batch, seq, mode, options), not per device. Plain tables of a
   derivable family (``table_families.py``) are evaluated for all their (batch, seq) points at once; the rest
   (fusion, parallel plans, short sequences, non-derivable models) come from real traces through the
   trace cache. Each table is reduced to its distinct kernels with launch counts (module and block
   index dropped: the predictors do not read them).
3. Distinct kernels of all tables are pooled; every predictor (and seed) is called once over the
   pool x the devices that need them (the predictor splits the call by device and op class).
4. Per-configuration sums by phase and op class are vectorised; tables with communication rows or
   pipeline stages go through ``tables.aggregate`` (same arithmetic as ``latency.predict_model``).
Steps 1-4 are ``engine.predict``'s (this module builds the grid and keeps the sweep's columns).
"""
from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import threading
from pathlib import Path

import pandas as pd

from neusight_core.cost import engine
from neusight_core.cost import request
# the engine's names for a configuration frame; compact_table / kernel_table: the tables it predicts from
from neusight_core.cost.engine import RESULTS
from neusight_core.question.step import INPUTS, SweepInputError
from neusight_core.question.step import options as options_of
from neusight_core.question.schema import Mode

#: the memory columns a sweep keeps: whether the configuration fits (False / None when unknown) and why
MEMORY_VERDICT = ["memory_fits", "memory_verdict"]
from neusight_core.cost.tables import compact_table, kernel_table

__all__ = ["INPUTS", "RESULTS", "CsvTarget", "SweepInputError", "chunks", "compact_table", "grid", "kernel_table",
           "partial_path", "run", "sweep", "write_csv"]


def _as_list(x):
    if x is None:
        return [None]
    if isinstance(x, (str, int, float, bool)):
        return [x]
    return list(x)


def _image_model(model) -> bool:
    from neusight_core.data import configs
    try:
        return configs.is_image_model(model)
    except Exception:  # noqa: BLE001 - an unknown model is a text model here; its row gets the error
        return False


#: how ``grid`` names the lists of its first arguments (and its messages say them)
PLURAL = {"model": "models", "device": "devices", "batch": "batches", "seq": "seqs", "mode": "modes",
          "image_size": "image_sizes"}


def grid(models, devices, batches, seqs=None, modes=None, **options) -> pd.DataFrame:
    """The full product of the arguments as a configuration frame (columns ``INPUTS``). ``options``: any other field
    of ``step.Scenario`` by its name (``image_sizes`` for ``image_size``), each a value or a list (repeated values
    count once); a field not given takes its declared plain default, or stays empty (its rule applies per row). An
    empty list is an error (it would make an empty sweep). Text models take the ``seqs``, image models the
    ``image_sizes`` (default 224); sizes for a kind no model is of, or text models without ``seqs``, are an error."""
    if "image_sizes" in options:
        options["image_size"] = options.pop("image_sizes")
    unknown = sorted(set(options) - set(INPUTS))
    if unknown:
        raise SweepInputError(f"unknown option(s) {', '.join(unknown)}; the options are {', '.join(INPUTS)}")
    lists = dict(options, model=models, device=devices, batch=batches, seq=seqs, mode=modes)
    for name, v in lists.items():
        if not isinstance(v, (str, int, float, bool)) and v is not None and len(list(v)) == 0:
            raise SweepInputError(f"{PLURAL.get(name, name)}: empty list (give at least one value)")
    plain = {name: o.user if o.user is None or isinstance(o.user, (str, int, float)) else None
             for name, o in options_of().items()}
    values = {name: list(dict.fromkeys(_as_list(plain[name] if lists.get(name) is None else lists[name])))
              for name in INPUTS}
    models, seqs, sizes = values["model"], values["seq"], values["image_size"]
    image = {m: _image_model(m) for m in models}
    if seqs != [None] and all(image.values()):
        raise SweepInputError(f"--seq is for text models: {', '.join(map(str, models))} are image models; "
                              "give --image-size")
    if sizes != [None] and not any(image.values()):
        raise SweepInputError("--image-size is for image models: none of the models is one; give --seq")
    if seqs == [None] and not all(image.values()):
        raise SweepInputError(f"give the sequence length(s) (--seq) of the text model(s) "
                              f"{', '.join(str(m) for m in models if not image[m])}")
    # the product in the columns' order, the size (seq or image_size, by the model's kind) one axis at seq's place
    rest = [values[name] for name in INPUTS if name not in ("model", "device", "batch", "seq", "image_size")]
    rows = []
    for m in models:
        size = [(None, i) for i in sizes] if image[m] else [(q, None) for q in seqs]    # (seq, image_size)
        for d, b, (q, i), *other in itertools.product(values["device"], values["batch"], size, *rest):
            rows.append((m, d, b, q, i, *other))
    return pd.DataFrame(rows, columns=INPUTS)


def chunks(configs: pd.DataFrame, size: int = 5000):
    """``configs`` in consecutive pieces of at most ``size`` rows, ordered so that the configurations of
    one model / mode / past / dtype stay together (their kernel tables and shape families are shared):
    a sweep of any length runs in bounded memory (``run`` per piece; the shape families and the trace
    cache carry over between pieces)."""
    if size < 1:
        raise SweepInputError(f"chunk size must be >= 1, got {size}")
    keys = [c for c in ("model", "mode", "past", "dtype", "batch", "seq") if c in configs]
    order = configs.astype({c: str for c in keys}).sort_values(keys, kind="stable").index if keys else configs.index
    ordered = configs.loc[order]
    for a in range(0, len(ordered), size):
        yield ordered.iloc[a:a + size]


def sweep(models, devices, batches, seqs=None, modes=(Mode.INF,), predictors=("neusight",), seeds=(0,),
          quick: bool | None = None, progress: bool = True, use_derivation: bool = True, **options) -> pd.DataFrame:
    """Predict the product of models x devices x batches x seqs (image models: ``image_sizes=``, default
    224) x modes (x options); see ``run``."""
    return run(grid(models, devices, batches, seqs, modes, **options), predictors, seeds, quick=quick,
               progress=progress, use_derivation=use_derivation)


# ------------------------------------------------------------------------------ the sweep
def run(configs: pd.DataFrame, predictors=("neusight",), seeds=(0,), quick: bool | None = None,
        progress: bool = True, use_derivation: bool = True) -> pd.DataFrame:
    """Predict every row of ``configs`` (columns ``INPUTS``; missing ones take defaults) with every
    predictor and seed: ``engine.predict``'s rows (one per configuration x predictor x seed), its columns
    ``INPUTS`` + ``RESULTS`` + ``MEMORY_VERDICT`` (the inputs with the device as its catalogue name, ``predictor``, ``seed``,
    ``e2e_ms``, ``fw_ms``, ``bw_ms``, ``acc_ms``, ``comm_ms``, ``comm_exposed_ms``, ``<CLASS>_ms`` per op
    class, ``kernels`` (launches), ``derived`` (table from shape derivation, not a trace) and ``error``
    ('' when predicted)). ``predictors``: names, or (label, trained predictor) pairs. Wall times are in its
    ``engine.RunInfo`` (``engine.run_info(frame)``). ``quick``: None (default) picks the weights as the CLI does
    (``engine.predict``: never half an hour of training unasked); True / False force them."""
    out = engine.predict(request.parse(request.rows_of_frame(configs)), predictors, seeds, quick=quick,
                         progress=progress, use_derivation=use_derivation, memory_columns=True)
    # every row's footprint: a traced table's from what memory.footprint reads of it (the table is not kept), a
    # derived one's from its family (family_memory.py); the lower bound where neither exists
    return out[INPUTS + RESULTS[:-1] + MEMORY_VERDICT + RESULTS[-1:]]


# ------------------------------------------------------------------------------ writing a sweep (``sweep --out``)
class CsvTarget:
    """Where ``sweep --out`` writes, checked before anything is computed.

    A regular file (or a new name in a writable folder) is written aside (``.NAME.PID.tmp``) and renamed over it
    when the sweep is done, so an interrupted sweep leaves the old file as it was. Interrupted (Ctrl-C, SIGTERM:
    ``write_csv``), the parts already written are kept as ``partial_path``, never as a hidden .tmp; an earlier
    sweep's partial file is never replaced (the next free name, ``NAME.partial-2.csv``, ...). Any other end
    (an error, a full disk, a failing close) removes the .tmp. While it is written the file is locked
    (``.NAME.lock`` beside it, flock): a second sweep on the same file, under any name, is refused here; the lock
    of a sweep that died (even by SIGKILL) is free and taken over. A symlink is followed (the link stays, its
    target gets the rows). Anything else that is not a folder (``/dev/null``, a pipe) is written through as it
    is, never replaced (and not locked). As a context manager, leaving it before ``commit`` or ``keep_partial``
    abandons it."""

    def __init__(self, name: str):
        if not name.strip():
            raise ValueError("--out: empty file name")
        self.path = Path(name).expanduser()
        target = self.path.resolve() if self.path.is_symlink() else self.path
        if target.is_dir():
            raise ValueError(f"--out {name}: is a folder (give a file name)")
        self.through = target.exists() and not target.is_file()
        self.lock, self._lock_fd, self._finished = None, None, False
        if self.through:
            if not os.access(target, os.W_OK):
                raise ValueError(f"--out {name}: not writable")
            self.final, self.tmp = target, None
            return
        folder = target.parent
        if not folder.is_dir():
            raise ValueError(f"--out {name}: folder {folder} does not exist")
        self.final, self.tmp = target, folder / f".{target.name}.{os.getpid()}.tmp"
        self.lock = folder / f".{target.name}.lock"     # the resolved name: every link to the file meets it
        self._lock_fd = _lock(self.lock, name)
        try:        # the real test of a place (access() says yes to root everywhere): make the file now
            self._file = open(self.tmp, "w", newline="")
        except OSError as e:
            self._release()
            raise ValueError(f"--out {name}: not writable ({e.strerror or e})") from None
        if target.exists() and not os.access(target, os.W_OK):
            self.abandon()
            raise ValueError(f"--out {name}: not writable (permission denied)")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.abandon()

    def open(self):
        return self._file if self.tmp is not None else open(self.final, "w", newline="")

    def commit(self) -> None:
        if self.tmp is not None:
            self._file.close()
            self.tmp.replace(self.final)
        self._finished = True
        self._release()

    def abandon(self) -> None:
        """Nothing kept: the .tmp removed and the lock given back, whatever closing the file says. (A full disk fails
        the close as it failed the write, and a close that raised before the delete left the .tmp for good.)"""
        if self._finished:
            return
        self._finished = True
        try:
            if self.tmp is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self.tmp.unlink(missing_ok=True)
        finally:
            self._release()

    def keep_partial(self, size: int) -> Path | None:
        """The first ``size`` bytes written (whole parts) renamed to ``partial_path`` (the next free name when an
        earlier sweep's partial file is there); None (and no file) if none. The .tmp is gone in any case."""
        self._finished = True
        if self.tmp is None:
            return None
        try:
            with contextlib.suppress(OSError):  # the parts counted in ``size`` were flushed; a failing close loses none
                self._file.close()
            if size <= 0 or not self.tmp.exists():       # (not there: interrupted after ``commit`` renamed it)
                return None
            with open(self.tmp, "r+b") as fh:       # drop a part cut in the middle: only whole rows stay
                fh.truncate(size)
            dest = _free_partial(self.final)
            try:
                self.tmp.replace(dest)
            except OSError:
                dest.unlink(missing_ok=True)
                raise
            return dest
        finally:
            self.tmp.unlink(missing_ok=True)
            self._release()

    def _release(self) -> None:
        if self._lock_fd is not None:
            # removed before it is unlocked: a sweep that opened it meanwhile finds it gone and makes its own
            with contextlib.suppress(OSError):
                self.lock.unlink()
            os.close(self._lock_fd)
            self._lock_fd = None


def _lock(lock: Path, name: str) -> int | None:
    """Lock ``lock`` for this sweep (exclusive flock, this PID written in it for the message of a second sweep);
    its descriptor, or None where the file system has no locks. A kernel lock, not a PID check: it ends with its
    process however that dies, so a lock file left by a killed sweep is simply locked again, and no PID reused
    by another process can keep it. Raises ValueError (one line) when another sweep holds it."""
    import fcntl         # here: the POSIX-only module stays out of ``import neusight_core.cost.sweep``
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ValueError(f"--out {name}: not writable ({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = ""
            with contextlib.suppress(OSError):
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            pid = f" (PID {holder})" if holder.isdigit() else ""
            raise ValueError(f"--out {name}: another sweep{pid} is writing it (lock {lock}); "
                             "wait for it or choose another --out") from None
        except OSError:            # no locks on this file system (ENOLCK, EOPNOTSUPP): written unlocked, as before
            os.close(fd)
            with contextlib.suppress(OSError):
                lock.unlink()
            return None
        try:                # the holder before us may have removed it between our open and our lock: lock the new one
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            with contextlib.suppress(OSError):      # only for a second sweep's message: a full disk may refuse it
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)


def partial_path(final: Path, n: int = 1) -> Path:
    """Where an interrupted sweep keeps its rows: ``NAME.partial.csv`` beside ``NAME.csv`` (the name says it);
    ``n`` > 1: ``NAME.partial-n.csv``, the name of the n-th when the earlier ones' files are still there."""
    final = Path(final)
    return final.with_name(f"{final.stem}.partial{'' if n == 1 else f'-{n}'}{final.suffix or '.csv'}")


def _free_partial(final: Path) -> Path:
    """The first ``partial_path(final, n)`` not there, made empty with O_EXCL (taken from no one, even a sweep on
    another name with the same partial name): the rows of an earlier interrupted sweep are never replaced."""
    for n in itertools.count(1):
        dest = partial_path(final, n)
        try:
            os.close(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            return dest
        except FileExistsError:
            continue


class _Terminated(SystemExit):
    """SIGTERM while a sweep writes: exits 143 (128 + 15) after the rows written are kept."""


@contextlib.contextmanager
def _sigterm_raises():
    """SIGTERM raises ``_Terminated`` in the main thread (its default kills the process at once, which left the
    hidden .tmp for good). Elsewhere (a thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise _Terminated(128 + signum)
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def _writing(target: CsvTarget):
    """An OSError of the writing itself (a full disk: ENOSPC at a write, flush or close) as one line that names the
    file and the reason; the bare ``[Errno 28] No space left on device`` said neither which file nor what became of
    it. A reader gone from a pipe (BrokenPipeError) stays as it is: the CLI ends quietly on it."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as e:
        left = f"{target.path} left as it was" if target.tmp is not None else "its rows are incomplete"
        raise OSError(f"--out {target.path}: cannot write the rows ({e.strerror or e}); {left}") from e


def write_csv(target: CsvTarget, pieces, run_part, progress: bool = True) -> dict:
    """Write ``run_part(piece)`` (a frame with an ``error`` column and an ``engine.RunInfo``) for every
    piece into ``target``, part by part (memory holds one part). Returns ``rows``, ``bad`` (rows with an error),
    ``tables_s``, ``total_s``. Interrupted by Ctrl-C or SIGTERM: the whole parts written are kept as
    ``partial_path`` (a part cut in the middle is dropped; an earlier sweep's partial file is kept and the rows go
    to the next free name, ``NAME.partial-2.csv``, ...), one line on stderr says so, and the interruption goes
    on (KeyboardInterrupt: the CLI exits 130; SIGTERM: exits 143). Any other error leaves nothing behind (no .tmp,
    no lock); one of the writing (a full disk) is raised as an OSError whose one line names the file and why."""
    pieces = list(pieces)
    done = {"rows": 0, "bad": 0, "tables_s": 0.0, "total_s": 0.0}
    parts = size = 0
    try:
        with _sigterm_raises():
            with _writing(target):
                f = target.open()
            try:
                for i, part in enumerate(pieces):
                    if len(pieces) > 1 and progress:
                        print(f"part {i + 1}/{len(pieces)}: {len(part)} configurations", file=sys.stderr, flush=True)
                    df = run_part(part)
                    with _writing(target):
                        df.to_csv(f, index=False, header=(i == 0))
                        f.flush()
                        size = f.tell() if target.tmp is not None else size
                    parts += 1
                    done["rows"] += len(df)
                    done["bad"] += int((df["error"] != "").sum())
                    run = engine.run_info(df)
                    done["tables_s"] += run.tables_s
                    done["total_s"] += run.total_s
            finally:
                if target.tmp is None:
                    with _writing(target):
                        f.close()
            with _writing(target):
                target.commit()
    except (KeyboardInterrupt, _Terminated) as e:
        why = "Ctrl-C" if isinstance(e, KeyboardInterrupt) else "SIGTERM"
        kept = target.keep_partial(size)
        first = partial_path(target.final)
        earlier = f"; {first} of an earlier sweep left as it was" if kept is not None and kept != first else ""
        where = (f"{done['rows']} rows kept in {kept} (PARTIAL; {target.path} left as it was{earlier})" if kept else
                 f"{done['rows']} rows written to {target.path} (PARTIAL)" if target.tmp is None and done["rows"] else
                 f"nothing kept ({target.path} left as it was)")
        print(f"sweep interrupted ({why}) after {parts} of {len(pieces)} part(s): {where}", file=sys.stderr, flush=True)
        raise
    except BaseException:
        target.abandon()
        raise
    return done
