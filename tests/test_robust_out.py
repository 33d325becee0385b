"""``sweep --out`` against a full disk, a second interrupted sweep and a second sweep on the same file: the hidden
.tmp and the lock never outlive a sweep, an earlier sweep's partial rows are never replaced, and two sweeps never
write one file (``sweep.CsvTarget`` / ``sweep.write_csv``)."""
from __future__ import annotations

import builtins
import errno
import os
import signal
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from neusight_core.cost import engine, sweep
from neusight_core import paths
from neusight_core.__main__ import main as cli

BASE = ["sweep", "--model", "bert_large", "--device", "H100", "--batch", "1,2", "--seq", "64",
        "--predictor", "roofline", "--quick", "--no-progress"]
ENOSPC = os.strerror(errno.ENOSPC)      # "No space left on device"


def _part(i, n=3):
    df = pd.DataFrame({"model": [f"m{i}"] * n, "e2e_ms": [float(i)] * n, "error": [""] * n})
    df.attrs[engine.RUN_KEY] = engine.RunInfo(tables_s=0.5, total_s=1.0)
    return df


def _interrupted_at(k):
    def run(i):
        if i == k:
            raise KeyboardInterrupt
        return _part(i)
    return run


class _FullDisk:
    """The hidden .tmp on a disk that fills: ``fail`` ("write" or "close") raises ENOSPC, as a real full disk does
    at a write, a flush and then again at the close (which is what left the .tmp behind)."""

    def __init__(self, real, fail):
        self.real, self.fail = real, fail

    def write(self, s):
        if self.fail == "write" and self.real.tell() > 0:       # the first part fits, the second does not
            raise OSError(errno.ENOSPC, ENOSPC)
        return self.real.write(s)

    def flush(self):
        return self.real.flush()

    def tell(self):
        return self.real.tell()

    def close(self):
        self.real.close()
        raise OSError(errno.ENOSPC, ENOSPC)


@pytest.fixture
def full_disk(monkeypatch):
    def use(fail):
        monkeypatch.setattr(sweep, "open", lambda *a, **k: _FullDisk(builtins.open(*a, **k), fail), raising=False)
    return use


@pytest.fixture
def cache_dir(tmp_path, monkeypatch, release_root):
    monkeypatch.setenv("NEUSIGHT_TRACE_CACHE", str(tmp_path / "trace_cache"))
    return tmp_path / "trace_cache"


# ----------------------------------------------------------------------------- a full disk
@pytest.mark.parametrize("fail", ["write", "close"])
def test_a_full_disk_leaves_no_tmp_and_says_which_file_and_why(tmp_path, full_disk, fail):
    out = tmp_path / "s.csv"
    out.write_text("an earlier sweep\n")
    full_disk(fail)
    with pytest.raises(OSError) as e:
        sweep.write_csv(sweep.CsvTarget(str(out)), range(3), _part, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.csv"]       # no .tmp, no lock, no partial
    assert str(out) in str(e.value) and ENOSPC in str(e.value) and "\n" not in str(e.value)
    assert out.read_text() == "an earlier sweep\n"


def test_the_cli_on_a_full_disk_ends_with_one_line_and_the_next_sweep_runs(cache_dir, tmp_path, capsys, full_disk,
                                                                          monkeypatch):
    out = tmp_path / "s.csv"
    full_disk("close")
    assert cli(BASE + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and str(out) in err[0] and ENOSPC in err[0], err
    assert [p.name for p in tmp_path.iterdir() if p.name != "trace_cache"] == []
    monkeypatch.undo()
    monkeypatch.setenv("NEUSIGHT_TRACE_CACHE", str(cache_dir))
    assert cli(BASE + ["--out", str(out)]) == 0 and len(pd.read_csv(out)) == 2


def test_a_sweep_that_fails_before_writing_leaves_no_tmp(cache_dir, tmp_path, capsys):
    out = tmp_path / "s.csv"
    assert cli(BASE + ["--chunk", "0", "--out", str(out)]) == 2
    assert "chunk size must be >= 1" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir() if p.name != "trace_cache"] == []


# ----------------------------------------------------------------------------- a second interrupted sweep
def test_a_second_interrupted_sweep_keeps_the_first_ones_partial_rows(tmp_path, capsys):
    out = tmp_path / "s.csv"
    with pytest.raises(KeyboardInterrupt):
        sweep.write_csv(sweep.CsvTarget(str(out)), range(4), _interrupted_at(1), progress=False)
    first = tmp_path / "s.partial.csv"
    assert list(pd.read_csv(first)["model"]) == ["m0"] * 3
    capsys.readouterr()
    with pytest.raises(KeyboardInterrupt):
        sweep.write_csv(sweep.CsvTarget(str(out)), range(4), _interrupted_at(2), progress=False)
    second = tmp_path / "s.partial-2.csv"
    assert list(pd.read_csv(first)["model"]) == ["m0"] * 3                  # the first one's rows as they were
    assert list(pd.read_csv(second)["model"]) == ["m0"] * 3 + ["m1"] * 3
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and f"6 rows kept in {second}" in err[0] and f"{first} of an earlier sweep" in err[0], err
    with pytest.raises(KeyboardInterrupt):
        sweep.write_csv(sweep.CsvTarget(str(out)), range(4), _interrupted_at(1), progress=False)
    assert (tmp_path / "s.partial-3.csv").is_file() and len(pd.read_csv(second)) == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.partial-2.csv", "s.partial-3.csv", "s.partial.csv"]


# ----------------------------------------------------------------------------- two sweeps on one file
def test_a_second_sweep_on_the_same_out_is_refused_before_computing(tmp_path, capsys, monkeypatch):
    out = tmp_path / "s.csv"
    first = sweep.CsvTarget(str(out))                                       # a sweep under way
    monkeypatch.setattr(sweep, "run", lambda *a, **k: pytest.fail("computed before refusing --out"))
    assert cli(BASE + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another sweep" in err[0] and f"PID {os.getpid()}" in err[0] and str(out) in err[0]
    link = tmp_path / "link.csv"                                            # the same file by another name
    link.symlink_to(out)
    with pytest.raises(ValueError, match="another sweep"):
        sweep.CsvTarget(str(link))
    assert sweep.write_csv(first, range(2), _part, progress=False)["rows"] == 6
    assert len(pd.read_csv(out)) == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "s.csv"]     # the lock is gone with it
    sweep.write_csv(sweep.CsvTarget(str(out)), range(1), _part, progress=False)     # and the file is free again
    assert len(pd.read_csv(out)) == 3


HOLDER = textwrap.dedent("""
    import sys, time
    from neusight_core.cost import sweep
    target = sweep.CsvTarget(sys.argv[1])
    print("ready", flush=True)
    time.sleep(60)
""")


def test_a_sweep_in_another_process_is_seen_and_its_lock_taken_over_once_it_is_killed(tmp_path):
    out = tmp_path / "s.csv"
    env = {**os.environ, "PYTHONPATH": str(paths.REPO_ROOT)}
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(ValueError, match=f"another sweep \\(PID {child.pid}\\) is writing it"):
            sweep.CsvTarget(str(out))
        child.send_signal(signal.SIGKILL)                                   # dies with its lock and .tmp left
        child.wait(timeout=30)
    finally:
        child.kill()
    assert any(p.name.endswith(".lock") for p in tmp_path.iterdir())
    assert sweep.write_csv(sweep.CsvTarget(str(out)), range(1), _part, progress=False)["rows"] == 3
    assert not any(p.name.endswith(".lock") for p in tmp_path.iterdir())
