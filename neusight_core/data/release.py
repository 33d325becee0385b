"""The authors' data release: find it, verify every file, unpack it into git-ignored folders.

Sources, in order (SPEC section 2):
  1. an explicit path (``--source``) or the environment variable ``NEUSIGHT_RELEASE``: a folder
     holding the release archive (like ``../shared/neusight-upstream``), the ``.tar.xz`` itself, or
     a clone of the upstream repository (a folder with ``scripts/asplos``);
  2. ``../shared/neusight-upstream`` beside the repository;
  3. ``git clone`` of the pinned upstream commit (needs internet).

Every file is checked against ``release_manifest.json``, a list of sha256 sums that this project
keeps (one per file of the pinned commit that the data-only archive holds). Files are staged and
verified in a scratch folder first and only moved into place when all of them are good, so a
failure never leaves a half-unpacked tree. Layout after provisioning:

  labels/<GPU>/<config>.{json,csv}       <- scripts/asplos/label/
  artifacts/release/{data,results,summary,fp16mm.csv,LICENSE}  <- scripts/asplos/ and LICENSE

Command line: ``python -m neusight_core.data.release [--source PATH] [--force] [--verify]``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from neusight_core import paths

MANIFEST_PATH = Path(__file__).with_name("release_manifest.json")
ASPLOS = "scripts/asplos/"
STAMP = ".provisioned.json"


class ReleaseError(RuntimeError):
    """A problem with the release that the user must fix; the message is one line."""


@dataclass
class Report:
    action: str                      # "unpacked" | "verified"
    source: str
    n_files: int
    seconds: float
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"release {self.action}: {self.n_files} files OK from {self.source} "
                f"in {self.seconds:.1f} s (commit {paths.UPSTREAM_COMMIT[:7]})")


# ----------------------------------------------------------------------------- manifest
def load_manifest() -> dict:
    """{'commit', 'archive_sha256', 'files': {relpath: sha256}} with relpaths as in the repo."""
    with open(MANIFEST_PATH) as f:
        return json.load(f)


def manifest_digest(manifest: dict) -> str:
    blob = json.dumps(manifest["files"], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def installed_path(rel: str, home: Path) -> Path:
    """Where a release file (path relative to the upstream repo root) lives once provisioned."""
    if rel.startswith(ASPLOS + "label/"):
        return home / "labels" / rel[len(ASPLOS + "label/"):]
    if rel.startswith(ASPLOS):
        return home / "artifacts" / "release" / rel[len(ASPLOS):]
    return home / "artifacts" / "release" / rel


def check_tree(files: dict[str, str], locate, desc: str = "verify") -> list[str]:
    """Compare each manifest entry with the file ``locate(rel)``; return problems, one per file."""
    problems = []
    for rel, digest in tqdm(sorted(files.items()), desc=desc, unit="file", leave=False,
                            disable=None):
        p = locate(rel)
        if not p.is_file():
            problems.append(f"missing: {rel}")
        elif sha256_file(p) != digest:
            problems.append(f"corrupt (checksum mismatch): {rel}")
    return problems


def _fail(problems: list[str], where: str) -> None:
    shown = "; ".join(problems[:5]) + (f"; ... and {len(problems) - 5} more" if len(problems) > 5 else "")
    raise ReleaseError(f"{len(problems)} bad file(s) in {where}: {shown}")


# ----------------------------------------------------------------------------- sources
def find_source(explicit: str | os.PathLike | None = None) -> Path | None:
    """The first source that exists, or None when only a git clone is left."""
    for cand in (explicit, os.environ.get("NEUSIGHT_RELEASE")):
        if cand:
            p = Path(cand).expanduser().resolve()
            if not p.exists():
                raise ReleaseError(f"release source not found: {p}")
            return p
    shared = paths.REPO_ROOT.parent / "shared" / "neusight-upstream"
    return shared if shared.exists() else None


def _archive_in(folder: Path) -> Path | None:
    found = sorted(folder.glob("*.tar.xz"))
    return found[0] if found else None


def _source_kind(src: Path) -> tuple[str, Path]:
    """("archive", the .tar.xz) or ("clone", the upstream checkout) for a source path; ReleaseError when
    it holds neither."""
    if src.is_file():
        return "archive", src
    if (src / "scripts" / "asplos").is_dir():
        return "clone", src
    if (arch := _archive_in(src)) is not None:
        return "archive", arch
    raise ReleaseError(f"{src} holds neither a release archive (*.tar.xz) nor an upstream clone")


def _stage_from_archive(archive: Path, staging: Path, manifest: dict) -> Path:
    sums = archive.with_name("ARCHIVE.sha256")
    if sums.is_file():
        # The archive may legitimately be recompressed; the per-file check below is what counts,
        # but a mismatch here is worth saying.
        if sha256_file(archive) != manifest["archive_sha256"]:
            print(f"note: {archive.name} differs from the pinned archive checksum; checking files one by one",
                  file=sys.stderr)
    try:
        with tarfile.open(archive, "r:xz") as tar:
            members = tar.getmembers()
            for m in tqdm(members, desc=f"unpack {archive.name}", unit="file", leave=False, disable=None):
                tar.extract(m, staging, filter="data")
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:
        raise ReleaseError(f"corrupt release archive {archive}: {e}") from None
    roots = [p for p in staging.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise ReleaseError(f"unexpected layout in {archive}: expected one top folder, found {len(roots)}")
    return roots[0]


def _stage_from_clone(clone: Path, staging: Path, manifest: dict) -> Path:
    root = staging / "clone"
    for rel in tqdm(manifest["files"], desc=f"copy {clone.name}", unit="file", leave=False, disable=None):
        src = clone / rel
        if src.is_file():
            dst = root / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    return root


def _git_clone(dest: Path) -> Path:
    if (dest / "scripts" / "asplos").is_dir():
        return dest
    try:
        subprocess.run(["git", "clone", "--quiet", paths.UPSTREAM_URL, str(dest)], check=True)
        subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", paths.UPSTREAM_COMMIT], check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise ReleaseError(
            f"no release found (give --source or NEUSIGHT_RELEASE, or put it in ../shared/neusight-upstream) "
            f"and git clone of {paths.UPSTREAM_URL} failed: {e}") from None
    return dest


# ----------------------------------------------------------------------------- provisioning
def is_provisioned(home: Path | None = None) -> bool:
    home = Path(home) if home else paths.home()
    return (home / "artifacts" / "release" / STAMP).is_file()


def verify_installed(home: Path | None = None) -> Report:
    """Check every provisioned file against the manifest; raise ReleaseError naming bad files."""
    t0 = time.time()
    home = Path(home) if home else paths.home()
    manifest = load_manifest()
    stamp = home / "artifacts" / "release" / STAMP
    if not stamp.is_file():
        raise ReleaseError(f"release not provisioned under {home}: run `python -m neusight_core.data.release`")
    info = json.loads(stamp.read_text())
    if info.get("manifest_digest") != manifest_digest(manifest):
        raise ReleaseError("provisioned release was made from another manifest: rerun with --force")
    problems = check_tree(manifest["files"], lambda r: installed_path(r, home))
    if problems:
        _fail(problems, f"{home} (rerun `python -m neusight_core.data.release --force` to restore)")
    return Report("verified", info.get("source", "?"), len(manifest["files"]), time.time() - t0)


def provision(source: str | os.PathLike | None = None, home: str | os.PathLike | None = None,
              force: bool = False) -> Report:
    """Make labels/ and artifacts/release/ under ``home`` hold the verified release.

    Idempotent: when already provisioned from the same manifest, only verifies.
    """
    home = Path(home).resolve() if home else paths.home()
    manifest = load_manifest()
    # A source that was asked for must exist, even when nothing needs unpacking (a typo in
    # NEUSIGHT_RELEASE is an error, not silently ignored).
    # Nor is one that holds no release (an empty folder): it is checked before the stamp is trusted.
    for what, cand in (("--source", source), ("NEUSIGHT_RELEASE", os.environ.get("NEUSIGHT_RELEASE"))):
        if cand and not Path(cand).expanduser().exists():
            raise ReleaseError(f"release source not found: {what} points to {cand}, which does not exist")
        if cand:
            try:
                _source_kind(Path(cand).expanduser().resolve())
            except ReleaseError as e:
                raise ReleaseError(f"{what}: {e}") from None
    if is_provisioned(home) and not force:
        return verify_installed(home)

    t0 = time.time()
    src = find_source(source)
    cache = home / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    staging = cache / f"staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        if src is None:
            src = _git_clone(cache / "upstream-clone")
        kind, path = _source_kind(src)
        root = (_stage_from_clone if kind == "clone" else _stage_from_archive)(path, staging, manifest)
        problems = check_tree(manifest["files"], lambda r: root / r)
        if problems:
            _fail(problems, str(src))
        # All good: replace the installed tree in one go.
        labels, release = home / "labels", home / "artifacts" / "release"
        for d in (labels, release):
            if d.exists():
                for child in d.iterdir():
                    if child.name != "README.md":
                        shutil.rmtree(child) if child.is_dir() else child.unlink()
        for rel in manifest["files"]:
            dst = installed_path(rel, home)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(root / rel, dst)
        release.mkdir(parents=True, exist_ok=True)
        (release / STAMP).write_text(json.dumps({
            "commit": manifest["commit"], "source": str(src), "n_files": len(manifest["files"]),
            "manifest_digest": manifest_digest(manifest),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }, indent=2))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Report("unpacked", str(src), len(manifest["files"]), time.time() - t0)


def status() -> dict:
    """Short description of the provisioned release, for environment captures."""
    stamp = paths.release_dir() / STAMP
    if not stamp.is_file():
        return {"provisioned": False}
    info = json.loads(stamp.read_text())
    info["provisioned"] = True
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m neusight_core.data.release", description=__doc__.split("\n")[0])
    ap.add_argument("--source", help="release folder, .tar.xz archive or upstream clone")
    ap.add_argument("--home", help="folder to hold labels/ and artifacts/ (default: repository root)")
    ap.add_argument("--force", action="store_true", help="unpack again even if already provisioned")
    ap.add_argument("--verify", action="store_true", help="only verify the provisioned files")
    a = ap.parse_args(argv)
    try:
        rep = verify_installed(a.home and Path(a.home)) if a.verify else provision(a.source, a.home, a.force)
    except ReleaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # staging is removed; the stamp is written last, so a re-run unpacks again
        print("interrupted: the release was not (fully) provisioned; run the same command again", file=sys.stderr)
        return 130
    print(rep.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
