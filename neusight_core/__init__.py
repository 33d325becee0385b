"""NeuSight re-implementation and reproducibility toolkit.

Pipeline (one module per stage): release -> trace -> kernels/tiles -> predictors ->
model latency -> evaluation -> report.
"""

__version__ = "0.1.0"

import os as _os
import sys as _sys

# A progress bar redraws itself with escape codes: on a terminal that is a bar, in a log file (stderr redirected,
# a run's console captured) it is noise. tqdm reads TQDM_DISABLE; a Jupyter kernel (its stderr is no terminal either)
# keeps its bars. An explicit TQDM_DISABLE wins.
if not (getattr(_sys.stderr, "isatty", lambda: False)() or "ipykernel" in _sys.modules):
    _os.environ.setdefault("TQDM_DISABLE", "1")
