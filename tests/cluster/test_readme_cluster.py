"""The cluster guide's (docs/guides/cluster.md) first block, pasted as written into bash: three brokers on a real etcd,
a replicated topic, a broker stopped and started again, every message read back."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from cluster_helpers import free_ports

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "cluster.md"


def run_a_cluster_block() -> str:
    return re.search(r"```sh\n(.*?)\n```", GUIDE.read_text(), re.S).group(1)


def test_readme_run_a_cluster_block_runs_as_written(etcd, cluster_name, tmp_path):
    block = run_a_cluster_block()
    # our etcd (a test's own cluster name on the shared one) and free broker ports; the
    # block's own etcd lines are left out
    lines = block.splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.startswith("etcd "))
    script = "\n".join(lines[:i] + lines[i + 2 :])
    script = script.replace("etcd://127.0.0.1:2379", etcd.url(cluster_name))
    for old, new in zip(("7401", "7402", "7403"), free_ports(3), strict=True):
        script = script.replace(old, str(new))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("SLUICE_BOOTSTRAP", None)
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"  # files: the brokers outlive bash
    with open(out_path, "wb") as out_file, open(err_path, "wb") as err_file:
        proc = subprocess.Popen(
            ["bash", "-c", script], cwd=tmp_path, env=env, start_new_session=True,
            stdout=out_file, stderr=err_file,
        )
    try:
        proc.wait(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the brokers it left in the background
        except ProcessLookupError:
            pass
        proc.wait()
    out, err = out_path.read_bytes(), err_path.read_bytes()  # err: the brokers' logs too
    assert b"Traceback" not in err, err.decode(errors="replace")
    assert proc.returncode == 0, err.decode(errors="replace")
    assert sorted(out.decode().splitlines()[-4:]) == ["a", "b", "c", "d"], (out.decode(), err.decode())
    assert b'"moved"' in out  # the rebalance answered
