"""The Python guides (docs/guides: python, transactions, subscriptions, delayed), pasted as written (only the broker's address differs): the
producer/consumer example, the Admin example, the transactional-messages and the
subscription examples each run twice in a row, after the "Using it" commands have left no
``orders`` topic behind; the delayed-message example is delivered when due."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDES = [ROOT / "docs" / "guides" / f"{name}.md" for name in ("python", "transactions", "subscriptions", "delayed")]
ADDRESS = "127.0.0.1:7400"


def python_blocks() -> list[str]:
    """The ```python blocks of the Python guides, in order."""
    return [b for page in GUIDES for b in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)]


def block(needle: str) -> str:
    found = [b for b in python_blocks() if needle in b]
    assert len(found) == 1, f"one python block of the guides with {needle!r}, found {len(found)}"
    return found[0]


def run_block(code: str, bootstrap: str, tmp_path: Path) -> str:
    assert ADDRESS in code
    res = subprocess.run([sys.executable, "-c", code.replace(ADDRESS, bootstrap)], cwd=tmp_path,
                         capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    assert b"Traceback" not in res.stderr, res.stderr
    return res.stdout.decode()


def printed_this_run(lines: list[str], bulk_before: int) -> bool:
    """Whether the example's output shows its ``send`` (the record at the partition and
    offset it printed first) and its three ``send_many`` records (partition 0, offsets past
    ``bulk_before``)."""
    if not lines:
        return False
    hello = f"{lines[0]} b'hello'"  # print(meta.partition, meta.offset), then the record
    bulk = {ln.split()[2] for ln in lines[1:] if ln.startswith("0 ") and int(ln.split()[1]) > bulk_before}
    return hello in lines[1:] and bulk == {"b'a'", "b'b'", "b'c'"}


def test_producer_and_consumer_example_runs_twice(broker, tmp_path):
    """The example ends in a consumer loop that runs until stopped: read its output until it
    has printed what this run sent (the group may print earlier runs' records again, as its
    last commit may not have landed when the run before was stopped), then stop it."""
    code = block("async for record in consumer").replace(ADDRESS, broker.bootstrap)
    bulk_before = -1  # the highest offset of a send_many record an earlier run printed
    for _ in range(2):
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            lines: list[str] = []
            buffer, deadline = b"", time.monotonic() + 60

            while not printed_this_run(lines, bulk_before):
                left = deadline - time.monotonic()
                assert left > 0 and proc.poll() is None, (lines, proc.poll())
                ready, _, _ = select.select([proc.stdout], [], [], left)
                if ready:
                    chunk = os.read(proc.stdout.fileno(), 65536)
                    assert chunk, lines
                    buffer += chunk
                    *complete, buffer = buffer.split(b"\n")
                    lines += [ln.decode() for ln in complete]
        finally:
            proc.kill()
            stderr = proc.communicate(timeout=30)[1]
        assert b"Traceback" not in stderr, stderr
        bulk_before = max(int(ln.split()[1]) for ln in lines[1:] if ln.startswith("0 ") and ln.endswith(("'a'", "'b'", "'c'")))


def test_admin_example_runs(broker, tmp_path):
    run_block(block("SyncAdmin(\"127.0.0.1:7400\") as admin:\n    admin.create_topic(\"invoices\""),
              broker.bootstrap, tmp_path)


def test_transaction_example_runs_twice(broker, tmp_path):
    code = block("send_in_transaction")
    for _ in range(2):
        out = run_block(code, broker.bootstrap, tmp_path).split()
        assert re.fullmatch(r"orders/[0-2]/\d+", out[0]) and out[1:3] == ["committed", out[2]], out
        assert int(out[2]) >= 0


def test_fast_sending_example_runs_twice(broker, tmp_path):
    code = block("send_nowait")
    for _ in range(2):
        out = run_block(code, broker.bootstrap, tmp_path).split("\n")
        assert out[0].startswith("acked 1000 up to offset ") and "failed:" not in out
        assert out[1] == "done"


def test_subscription_example_runs_twice(broker, tmp_path):
    """Each run sends ten payments and settles every message it is given once: the first
    run all ten (one acked silently, nine printed by the handler), the second its own ten
    (the first run's were acked, so they never come again)."""
    code = block("sub.run(handle")
    for _ in range(2):
        lines = run_block(code, broker.bootstrap, tmp_path).splitlines()
        values = sorted(ln.split(maxsplit=3)[3] for ln in lines)
        assert len(values) == 9 and all(ln.split()[2] == "1" for ln in lines), lines  # attempt 1


def test_delayed_example_runs(broker, tmp_path, cli):
    """After the subscription example (which creates ``payments``), as the README runs."""
    assert cli("topic", "create", "payments", "--partitions", "3", bootstrap=broker.bootstrap).returncode == 0
    before = time.time() * 1000
    printed = run_block(block("send_delayed"), broker.bootstrap, tmp_path).split()
    assert len(printed) == 3 and printed[0] == f"payments/{printed[1]}/{printed[0].split('/')[2]}", printed
    assert before + 5_000 <= int(printed[2]) <= time.time() * 1000 + 5_000  # due 5 s after it was sent
    out = cli("consume", "payments", "--from", "earliest", "--exit-at-end", bootstrap=broker.bootstrap)
    assert out.returncode == 0 and b"reminder" not in out.stdout  # not due for 5 s
    deadline = time.monotonic() + 30
    while b"reminder" not in out.stdout:
        assert time.monotonic() < deadline, "the delayed message was never delivered"
        time.sleep(0.5)
        out = cli("consume", "payments", "--from", "earliest", "--exit-at-end", bootstrap=broker.bootstrap)


def test_readme_tour_python_block_runs_twice(broker, tmp_path):
    """README's five-minute tour, from Python: the blocking clients' start() and poll()."""
    [code] = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    started = (ROOT / "docs" / "getting-started.md").read_text()
    assert re.findall(r"```python\n(.*?)```", started, re.S) == [code]  # the same tour there
    for _ in range(2):
        out = run_block(code, broker.bootstrap, tmp_path).splitlines()
        assert out[0].startswith("stored at 0 "), out
        offset = int(out[0].split()[-1])
        assert f"{offset} b'k' b'hello'" in out[1:], out  # the group read on from where it committed
