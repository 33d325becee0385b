"""Release provisioning: checksums, missing files, idempotence, nothing half-unpacked."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from neusight_core import paths
from neusight_core.data import release

SHARED = paths.REPO_ROOT.parent / "shared" / "neusight-upstream"


def _make_archive(tmp: Path, files: dict[str, bytes]) -> Path:
    """A tiny release archive with the upstream layout (top folder + files)."""
    arch = tmp / "mini" / "NeuSight-mini-data.tar.xz"
    arch.parent.mkdir(parents=True)
    with tarfile.open(arch, "w:xz") as tar:
        for rel, data in files.items():
            info = tarfile.TarInfo(f"NeuSight-mini/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return arch


@pytest.fixture
def mini(tmp_path, monkeypatch):
    """A three-file release and a manifest that describes it."""
    files = {
        "LICENSE": b"MIT\n",
        "scripts/asplos/label/GPU_X/m-inf-8-1.json": b'{"e2e_latency": 1.0}',
        "scripts/asplos/summary/t.csv": b"a,b\n1,2\n",
    }
    import hashlib
    manifest = {"commit": "x", "archive_sha256": "0" * 64,
                "files": {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}}
    mpath = tmp_path / "manifest.json"
    mpath.write_text(json.dumps(manifest))
    monkeypatch.setattr(release, "MANIFEST_PATH", mpath)
    return tmp_path, files


def test_unpack_then_idempotent(mini):
    tmp, files = mini
    arch = _make_archive(tmp, files)
    home = tmp / "home"
    rep = release.provision(arch.parent, home)
    assert rep.action == "unpacked" and rep.n_files == 3
    assert (home / "labels/GPU_X/m-inf-8-1.json").read_bytes() == files["scripts/asplos/label/GPU_X/m-inf-8-1.json"]
    assert (home / "artifacts/release/summary/t.csv").is_file()
    mtime = (home / "artifacts/release/summary/t.csv").stat().st_mtime_ns
    rep2 = release.provision(arch.parent, home)
    assert rep2.action == "verified"
    assert (home / "artifacts/release/summary/t.csv").stat().st_mtime_ns == mtime


def test_corrupt_file_named_and_nothing_unpacked(mini):
    tmp, files = mini
    bad = dict(files)
    bad["scripts/asplos/summary/t.csv"] = b"a,b\n1,3\n"
    arch = _make_archive(tmp, bad)
    home = tmp / "home"
    with pytest.raises(release.ReleaseError, match=r"corrupt \(checksum mismatch\): scripts/asplos/summary/t.csv"):
        release.provision(arch.parent, home)
    assert not (home / "labels").exists() and not (home / "artifacts/release").exists()
    assert not list((home / ".cache").glob("staging-*"))


def test_missing_file_named(mini):
    tmp, files = mini
    arch = _make_archive(tmp, {k: v for k, v in files.items() if k != "LICENSE"})
    with pytest.raises(release.ReleaseError, match="missing: LICENSE"):
        release.provision(arch.parent, tmp / "home")


def test_installed_corruption_detected_and_cli_exit_code(mini, capsys):
    tmp, files = mini
    arch = _make_archive(tmp, files)
    home = tmp / "home"
    release.provision(arch, home)                      # the archive file itself is a valid source
    (home / "labels/GPU_X/m-inf-8-1.json").write_text("{}")
    rc = release.main(["--home", str(home), "--verify"])
    err = capsys.readouterr().err
    assert rc == 2 and "m-inf-8-1.json" in err
    assert len(err.strip().splitlines()) == 1


def test_truncated_archive_is_a_clear_error(mini):
    tmp, files = mini
    arch = _make_archive(tmp, files)
    arch.write_bytes(arch.read_bytes()[:40])
    with pytest.raises(release.ReleaseError, match="corrupt release archive"):
        release.provision(arch, tmp / "home")


def test_upstream_clone_layout(mini):
    tmp, files = mini
    clone = tmp / "clone"
    for rel, data in files.items():
        (clone / rel).parent.mkdir(parents=True, exist_ok=True)
        (clone / rel).write_bytes(data)
    rep = release.provision(clone, tmp / "home")
    assert rep.n_files == 3 and (tmp / "home/labels/GPU_X/m-inf-8-1.json").is_file()


def test_unknown_source_path(mini):
    tmp, _ = mini
    with pytest.raises(release.ReleaseError, match="release source not found"):
        release.provision(tmp / "nope", tmp / "home")


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/neusight-upstream not present")
def test_real_release_verifies(release_root):
    rep = release.verify_installed()
    assert rep.n_files == 1828 and rep.action == "verified"


def test_environment_yml_follows_requirements():
    env = (paths.REPO_ROOT / "environment.yml").read_text()
    assert "python=3.11" in env and "-r requirements.txt" in env
    reqs = (paths.REPO_ROOT / "requirements.txt").read_text()
    for line in (paths.REPO_ROOT / "requirements.in").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            assert line.lower() in reqs.lower(), f"{line} of requirements.in not pinned in requirements.txt"


def test_release_env_pointing_to_nothing_is_an_error(mini, monkeypatch):
    tmp, files = mini
    arch = _make_archive(tmp, files)
    release.provision(arch.parent, tmp / "home")
    monkeypatch.setenv("NEUSIGHT_RELEASE", str(tmp / "typo"))
    with pytest.raises(release.ReleaseError, match="NEUSIGHT_RELEASE points to .*typo"):
        release.provision(None, tmp / "home")  # even though the release is already provisioned


def test_release_env_pointing_to_an_empty_folder_is_an_error(mini, monkeypatch):
    tmp, files = mini
    arch = _make_archive(tmp, files)
    release.provision(arch.parent, tmp / "home")
    (tmp / "empty").mkdir()
    monkeypatch.setenv("NEUSIGHT_RELEASE", str(tmp / "empty"))
    with pytest.raises(release.ReleaseError, match="NEUSIGHT_RELEASE: .*empty holds neither"):
        release.provision(None, tmp / "home")  # not silently ignored because a release is provisioned


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/neusight-upstream not present")
def test_sigint_during_unpacking_then_rerun_recovers(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    home = tmp_path / "home"
    cmd = [sys.executable, "-m", "neusight_core.data.release", "--source", str(SHARED), "--home", str(home)]
    # (a shell's background job inherits SIGINT ignored; give the child the default, as in a terminal)
    proc = subprocess.Popen(cmd, cwd=paths.REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for _ in range(600):  # wait until unpacking has started (its staging folder exists)
        if list((home / ".cache").glob("staging-*")):
            break
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert "Traceback" not in err
    assert proc.returncode == 130 and "interrupted" in err and not release.is_provisioned(home)
    assert not list((home / ".cache").glob("staging-*"))
    again = subprocess.run(cmd, cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "1828 files OK" in again.stdout
