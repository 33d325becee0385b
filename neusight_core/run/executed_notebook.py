"""What the runner does with an executed notebook: progress bars stripped, the HTML exported beside it,
and a full disk recognised in whatever papermill or the kernel raised (so that the run says so)."""
from __future__ import annotations

import errno
import re
from pathlib import Path

from neusight_core.run.run_summary import write_atomic


def export_html(ipynb: Path) -> str | None:
    """Write ``<notebook>.html`` beside the executed notebook; None, or why it was not written. A full disk makes
    the run's evidence incomplete (the caller fails the notebook); another export problem is said beside an OK."""
    try:
        from nbconvert import HTMLExporter
        import nbformat

        body, _ = HTMLExporter().from_notebook_node(nbformat.read(ipynb, as_version=4))
        write_atomic(ipynb.with_suffix(".html"), body)
    except Exception as e:  # an export problem must not turn an OK notebook into a failure
        print(f"    (HTML export of {ipynb.name} failed: {e})", flush=True)
        if is_disk_full(e):
            return disk_full_reason(e, ipynb.with_suffix(".html"))
        return f"HTML export failed: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
    return None


_BAR = re.compile(r"\d+%\|")


def strip_progress(ipynb: Path) -> None:
    """Drop progress bars from an executed notebook: tqdm widgets (frozen at their first state in a
    stored notebook, "0%|") and stderr streams made only of bar updates. Nothing else is touched."""
    try:
        import nbformat

        nb = nbformat.read(ipynb, as_version=4)
        changed = False
        for cell in nb.cells:
            outs = cell.get("outputs") or []
            keep = []
            for o in outs:
                data = o.get("data") or {}
                text = o.get("text") or ""
                widget = "application/vnd.jupyter.widget-view+json" in data and _BAR.search(str(data.get("text/plain", "")))
                bar_stream = (o.get("output_type") == "stream" and o.get("name") == "stderr"
                              and all(_BAR.search(x) for x in re.split(r"[\r\n]+", text) if x.strip()) and text.strip())
                if widget or bar_stream:
                    changed = True
                    continue
                keep.append(o)
            if len(keep) != len(outs):
                cell["outputs"] = keep
        if changed:
            nbformat.write(nb, ipynb)
    except Exception as e:  # cosmetic: never turns a notebook into a failure
        print(f"    (could not strip progress bars from {ipynb.name}: {e})", flush=True)


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_reason(exc: OSError, default: Path | str) -> str:
    return f"disk full while writing {getattr(exc, 'filename', None) or default}"


def disk_full_cause(exc: BaseException) -> OSError | None:
    """The ENOSPC error behind ``exc`` (papermill wraps what the kernel or its writer raised), if any."""
    seen = 0
    while exc is not None and seen < 10:
        if is_disk_full(exc):
            return exc
        text = str(getattr(exc, "evalue", "") or exc)
        if "No space left on device" in text:   # raised inside the notebook's kernel: only its text comes back
            m = re.search(r"No space left on device: '([^']+)'", text)
            return OSError(errno.ENOSPC, "No space left on device", m.group(1) if m else None)
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None
