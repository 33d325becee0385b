"""The Jupyter kernels the runner starts, and how an interrupted run stops them.

A SIGINT / SIGTERM that reaches the runner while papermill waits on a kernel is raised from a
signal handler, and where it lands inside asyncio decides its fate: raised in a task's step, it is
stored on that task (asyncio re-raises only KeyboardInterrupt and SystemExit), and a background task
nobody awaits loses it, so the run went on into the next notebook (a CI run waited 120 s on a kernel
sleeping 300 s). Killing the kernels does not depend on where the exception lands: the notebook
ends at once with a dead kernel, and the runner, which also remembers the signal, stops there. It is
the runner's fallback (``runner._Fallback``), started by the signal and cancelled when the exception
arrives: killed at once, a kernel that the client was shutting down anyway prints a dead-kernel
traceback over the run's last lines.
"""
from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

# the kernels of this process, live or not (a handful per run)
_STARTED: list = []


def manager_class(log: Path):
    """A KernelManager whose kernel writes its own stdout and stderr (its log, not the notebook's
    output) to ``log`` instead of the console: an interrupted or dying kernel would otherwise print
    tracebacks over the run's progress lines, and a kernel that outlived the runner would hold the
    console's pipe open. Cell output, errors included, stays in the executed notebook. Each kernel
    started is remembered for ``stop_all``."""
    from jupyter_client.manager import AsyncKernelManager

    class _LoggedKernelManager(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd, **kw):
            kw["stderr"] = kw["stdout"] = open(log, "ab")  # noqa: SIM115 (the kernel process owns it)
            try:
                return await super()._async_launch_kernel(kernel_cmd, **kw)
            finally:
                process = getattr(self.provisioner, "process", None)
                if process is not None:
                    _STARTED.append(process)

    return _LoggedKernelManager


class _KilledKernelTasks(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" for a DeadKernelError: once ``stop_all`` has
    killed a kernel, the client's background task that was watching it ends with that error, nobody awaits
    it, and asyncio printed its traceback after the run's summary lines (the run's record and exit code
    were right)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return type(exc).__name__ != "DeadKernelError"


_QUIET = _KilledKernelTasks()


def stop_all() -> int:
    """Kill every kernel this process started that still runs, with its process group (jupyter_client
    starts each kernel in a session of its own); never waits. After a kill, a dead-kernel error of a task
    nobody awaits is no longer printed (``_KilledKernelTasks``).
    Returns how many were running."""
    n = 0
    for process in list(_STARTED):
        if process.poll() is not None:
            continue
        n += 1
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                process.kill()
            except ProcessLookupError:
                pass
    if n:
        logging.getLogger("asyncio").addFilter(_QUIET)     # adding it twice keeps one
    return n
