"""``scripts/serve`` installs once, then starts at once (no package index needed).

Runs the real script in a scratch copy of the repository layout whose ``.venv`` holds
stand-ins: ``pip`` records each install, ``sluice`` records how it was started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STUB = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$(dirname "$0")/../../calls"
"""
PIP = STUB + """[ "$1" = install ] && cp "$(dirname "$0")/sluice.stub" "$(dirname "$0")/sluice"
exit 0
"""


def make_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "serve", repo / "scripts" / "serve")
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    bin_dir = repo / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("python", STUB), ("pip", PIP), ("sluice.stub", STUB)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return repo


def serve(repo: Path, *args: str) -> list[str]:
    """Run scripts/serve; return the calls it made, and forget them."""
    subprocess.run([str(repo / "scripts" / "serve"), *args], check=True, timeout=30,
                   env={**os.environ, "PATH": "/usr/bin:/bin"})
    calls = (repo / "calls").read_text().splitlines()
    (repo / "calls").unlink()
    return calls


def test_installs_once_then_only_starts(tmp_path):
    repo = make_repo(tmp_path)
    first = serve(repo, "--port", "7401")
    assert first[0].startswith("pip install") and first[-1] == "sluice serve --port 7401"
    assert serve(repo) == ["sluice serve"]  # no pip: nothing to reach
    assert serve(repo, "--data-dir", "d") == ["sluice serve --data-dir d"]


def test_installs_again_when_pyproject_changes(tmp_path):
    repo = make_repo(tmp_path)
    serve(repo)
    stamp = repo / ".venv" / ".sluice-installed"
    os.utime(stamp, ((repo / "pyproject.toml").stat().st_mtime - 10,) * 2)  # pyproject is newer
    again = serve(repo)
    assert again[0].startswith("pip install") and again[-1] == "sluice serve"
    assert serve(repo) == ["sluice serve"]


def test_installs_when_sluice_is_missing(tmp_path):
    repo = make_repo(tmp_path)
    serve(repo)
    (repo / ".venv" / "bin" / "sluice").unlink()
    assert serve(repo)[0].startswith("pip install")


def test_installs_again_when_a_c_source_changes(tmp_path):
    """The compiled codec is built by the install: a changed C file or header rebuilds it."""
    repo = make_repo(tmp_path)
    (repo / "src" / "sluice").mkdir(parents=True)
    sources = [repo / "src" / "sluice" / name for name in ("_crecords.c", "_cproducer.c", "_crecords.h")]
    for f in sources:
        f.write_text("/* C */\n")
    serve(repo)
    assert serve(repo) == ["sluice serve"]
    stamp = repo / ".venv" / ".sluice-installed"
    t0 = time.time() - 1000
    for changed in sources:
        os.utime(stamp, (t0, t0))
        for f in [*sources, repo / "pyproject.toml"]:
            os.utime(f, (t0 - 100, t0 - 100))
        assert serve(repo) == ["sluice serve"]
        os.utime(changed, (t0 + 10, t0 + 10))  # only this source is newer than the install
        assert serve(repo)[0].startswith("pip install"), changed.name
        assert serve(repo) == ["sluice serve"]
