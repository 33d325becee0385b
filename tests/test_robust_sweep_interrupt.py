"""Issue 36, item 7: an interrupted sweep keeps the rows already computed, marked as partial, and says so; SIGTERM
leaves no hidden .NAME.PID.tmp behind. ``sweep.write_csv`` is the writer of ``neusight sweep --out``."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

from neusight_core.cost import engine, sweep
from neusight_core import paths


def _part(i, n=3):
    df = pd.DataFrame({"model": [f"m{i}"] * n, "e2e_ms": [float(i)] * n, "error": [""] * (n - 1) + ["bad"]})
    df.attrs[engine.RUN_KEY] = engine.RunInfo(tables_s=0.5, total_s=1.0)
    return df


def _hidden(folder):
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_a_whole_sweep_is_written_and_counted(tmp_path, capsys):
    out = tmp_path / "s.csv"
    got = sweep.write_csv(sweep.CsvTarget(str(out)), range(3), _part, progress=False)
    assert got == {"rows": 9, "bad": 3, "tables_s": 1.5, "total_s": 3.0}
    assert list(pd.read_csv(out)["model"]) == ["m0"] * 3 + ["m1"] * 3 + ["m2"] * 3
    assert _hidden(tmp_path) == [] and not sweep.partial_path(out).exists()


def test_ctrl_c_keeps_the_parts_written_as_partial_and_the_old_file(tmp_path, capsys):
    out = tmp_path / "s.csv"
    out.write_text("an earlier sweep\n")

    def run(i):
        if i == 2:
            raise KeyboardInterrupt
        return _part(i)
    with pytest.raises(KeyboardInterrupt):
        sweep.write_csv(sweep.CsvTarget(str(out)), range(4), run, progress=False)
    partial = tmp_path / "s.partial.csv"
    kept = pd.read_csv(partial)
    assert list(kept["model"]) == ["m0"] * 3 + ["m1"] * 3 and list(kept.columns) == ["model", "e2e_ms", "error"]
    assert out.read_text() == "an earlier sweep\n" and _hidden(tmp_path) == []
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and "interrupted (Ctrl-C) after 2 of 4 part(s): 6 rows kept in" in err[0]
    assert str(partial) in err[0] and "PARTIAL" in err[0]


def test_a_part_cut_in_the_middle_is_dropped(tmp_path, capsys, monkeypatch):
    out = tmp_path / "s.csv"
    real = pd.DataFrame.to_csv

    def to_csv(self, f, *a, **k):
        if self["model"].iloc[0] == "m1":        # Ctrl-C while the second part is being written
            f.write("m1,1.0,")
            raise KeyboardInterrupt
        return real(self, f, *a, **k)
    monkeypatch.setattr(pd.DataFrame, "to_csv", to_csv)
    with pytest.raises(KeyboardInterrupt):
        sweep.write_csv(sweep.CsvTarget(str(out)), range(3), _part, progress=False)
    monkeypatch.undo()
    kept = pd.read_csv(tmp_path / "s.partial.csv")
    assert list(kept["model"]) == ["m0"] * 3 and kept["e2e_ms"].notna().all()
    assert "after 1 of 3 part(s): 3 rows kept" in capsys.readouterr().err


def test_nothing_finished_keeps_nothing_and_other_errors_leave_nothing(tmp_path, capsys):
    out = tmp_path / "s.csv"
    with pytest.raises(KeyboardInterrupt):
        sweep.write_csv(sweep.CsvTarget(str(out)), range(2), lambda i: (_ for _ in ()).throw(KeyboardInterrupt()),
                        progress=False)
    assert "nothing kept" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError):
        sweep.write_csv(sweep.CsvTarget(str(out)), range(2),
                        lambda i: _part(i) if i == 0 else (_ for _ in ()).throw(OSError("disk full")), progress=False)
    assert list(tmp_path.iterdir()) == []


def _ctrl_c_delivered() -> None:
    """In the child before it starts: SIGINT back to its default. A job started in the background by a
    non-interactive shell (a CI runner, `cmd &`) inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt: the child would not see the Ctrl-C this test sends, as a terminal user's sweep would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


CHILD = textwrap.dedent("""
    import sys, time
    import pandas as pd
    from neusight_core.cost import sweep
    def run(i):
        if i == 2:
            print("ready", flush=True)
            time.sleep(60)
        return pd.DataFrame({"model": [f"m{i}"] * 2, "error": ["", ""]})     # no RunInfo: zero seconds
    try:
        sweep.write_csv(sweep.CsvTarget(sys.argv[1]), range(4), run, progress=False)
    except KeyboardInterrupt:
        sys.exit(130)
""")


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signal_keeps_the_partial_file_and_leaves_no_tmp(tmp_path, sig, code, word):
    out = tmp_path / "s.csv"
    env = {**os.environ, "PYTHONPATH": str(paths.REPO_ROOT)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, cwd=tmp_path, preexec_fn=_ctrl_c_delivered)
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(sig)
        _, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert child.returncode == code, err
    assert _hidden(tmp_path) == [] and not out.exists()
    assert list(pd.read_csv(tmp_path / "s.partial.csv")["model"]) == ["m0", "m0", "m1", "m1"]
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and f"sweep interrupted ({word}) after 2 of 4 part(s): 4 rows kept in" in lines[0], err


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_the_cli_sweep_keeps_its_partial_rows(tmp_path, sig, code, release_root):
    out = tmp_path / "s.csv"
    argv = [sys.executable, "-m", "neusight_core", "sweep", "--predictor", "roofline", "--model", "gpt2_large",
            "--device", "H100,A100", "--batch", "1,2,3,4,5,6", "--seq", "128", "--chunk", "2", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(paths.REPO_ROOT), "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
                             preexec_fn=_ctrl_c_delivered)
    try:
        for line in child.stderr:
            if line.startswith("part 3/"):
                break
        child.send_signal(sig)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == code
    assert _hidden(tmp_path) == [] and not out.exists()
    assert len(pd.read_csv(tmp_path / "s.partial.csv")) == 4
    assert "sweep interrupted" in err and "4 rows kept in" in err
