"""Python's cycle collector paused over allocation-heavy work (a trace, an engine call).

Tracing a model or predicting a sweep allocates some 10^5 to 10^6 short-lived objects (kernel rows, meta tensors,
autograd nodes, pandas blocks). Each burst of allocations starts the collector again, and its oldest generation
walks every object alive: after torch and transformers are imported, about a million that never become garbage.
That walk was 4 % of a trace and a fifth of a sweep's work after its traces (measured on the 1,200-configuration
sweep of benchmarks/sweep_speed.py). Reference counting frees everything it frees as before, at the same moment,
so no table, timeline or number changes; what only the collector frees (objects in reference cycles) waits for
its next run once the work is over."""
from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def paused(promote: bool = False, collect_young: bool = False):
    """Within (also as a decorator, ``@paused()``): no automatic collection; the collector's state is restored.

    ``promote``: what the work left alive goes to the oldest generation without being walked, where the next full
    collection looks at it. Without it, the first young collection after the pause walks all of it: a cold sweep
    imports torch and transformers inside the engine, a million objects, 0.25 s. Only where nothing is frozen already
    (unfreezing would thaw what the caller froze); asking that walks the frozen objects, so it is for the outermost
    call only (``engine.predict``), not for every trace of a worker that froze a million.

    ``collect_young``: where the collector was off already (this work runs inside another pause, a trace inside an
    engine call), a young collection on leaving: what the work left in reference cycles (a traced model's modules,
    about 600 objects a trace) is freed now, not when the outer pause ends (a sweep of 72 traced ResNet-50 tables
    kept 44,621 such objects, 11 MB, until then)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if not was:
            if collect_young:
                gc.collect(0)
        else:
            if promote and not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()
