"""``scripts/serve`` installs once, then starts at once (no package index needed).

Runs the real script in a scratch copy of the repository layout whose ``.venv`` holds
stand-ins: ``pip`` records each install, ``sluice`` records how it was started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
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
