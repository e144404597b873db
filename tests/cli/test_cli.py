"""The documented ``sluice`` command line, end to end against a real broker process."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import crc32c
import pytest

from sluice.harness import BrokerProcess, free_port, wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One broker for the bad-input cases (each uses its own topic names); killed at the end."""
    d = tmp_path_factory.mktemp("shared-broker")
    b = BrokerProcess(d / "data", d / "broker.log").start()
    yield b
    b.kill()


def topic_names(b: BrokerProcess, cli) -> list[str]:
    return [ln.split("\t")[0] for ln in ok(cli("topic", "list", "-o", "plain", bootstrap=b.bootstrap)).splitlines() if ln]


# ---------------------------------------------------------------------- helpers


def ok(res) -> str:
    """Assert the command succeeded; return its stdout as text (bytes that are not UTF-8
    as surrogates: compare ``res.stdout`` for bytes)."""
    assert res.returncode == 0, (res.returncode, res.stderr.decode(errors="replace"))
    assert b"Traceback" not in res.stderr, res.stderr.decode(errors="replace")
    return res.stdout.decode(errors="surrogateescape")


def assert_error(res, *needles: str) -> str:
    """Non-zero exit, exactly one stderr line ``error: ...`` naming every needle, no traceback."""
    err = res.stderr.decode(errors="replace")
    assert res.returncode != 0, f"exit 0; stdout={res.stdout!r} stderr={err!r}"
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one stderr line, got:\n{err}"
    line = lines[0]
    assert line.startswith("error: "), line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line


def json_lines(out: str) -> list[dict]:
    return [json.loads(ln) for ln in out.splitlines() if ln.strip()]


def lines_in(*values: str) -> bytes:
    return "".join(v + "\n" for v in values).encode()


# ---------------------------------------------------------------------- topics


def test_topic_create_list_describe_delete(broker, cli):
    b = broker.bootstrap
    out = ok(cli("topic", "create", "orders", "--partitions", "3", bootstrap=b))
    assert "orders" in out and "3" in out
    ok(
        cli(
            "topic", "create", "audit", "--partitions", "1",
            "--config", "retention.ms=3600000", "--config", "flush.messages=0",
            bootstrap=b,
        )
    )

    listed = ok(cli("topic", "list", "-o", "plain", bootstrap=b))
    rows = sorted(ln.split("\t") for ln in listed.splitlines() if ln)
    assert rows == [["audit", "1"], ["orders", "3"]]

    desc = json.loads(ok(cli("topic", "describe", "audit", bootstrap=b)))
    assert desc["name"] == "audit"
    assert desc["config"]["retention.ms"] == "3600000"
    assert desc["config"]["flush.messages"] == "0"
    assert desc["config"]["max.message.bytes"] == "1048576"  # a default is shown too
    assert [p["partition"] for p in desc["partitions"]] == [0]

    desc = json.loads(ok(cli("topic", "describe", "orders", bootstrap=b)))
    assert sorted(p["partition"] for p in desc["partitions"]) == [0, 1, 2]

    ok(cli("topic", "delete", "orders", bootstrap=b))
    listed = ok(cli("topic", "list", "-o", "plain", bootstrap=b))
    assert [ln.split("\t")[0] for ln in listed.splitlines() if ln] == ["audit"]
    assert_error(cli("topic", "describe", "orders", bootstrap=b), "UNKNOWN_TOPIC", "orders")


def test_describe_json_shows_log_state(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "t", "--partitions", "2", bootstrap=b))
    ok(cli("produce", "t", "--partition", "1", bootstrap=b, input=lines_in("a", "b", "c")))
    desc = json.loads(ok(cli("topic", "describe", "t", bootstrap=b)))
    p1 = next(p for p in desc["partitions"] if p["partition"] == 1)
    assert p1["high_watermark"] == 3
    assert p1["size_bytes"] > 0


def test_describe_json_has_every_partition_field_even_when_zero(shared, cli):
    b = shared.bootstrap
    ok(cli("topic", "create", "empty", bootstrap=b))
    desc = json.loads(ok(cli("topic", "describe", "empty", bootstrap=b)))
    p0 = desc["partitions"][0]
    for key in ("partition", "leader", "log_start_offset", "high_watermark", "size_bytes", "segments"):
        assert key in p0, f"{key} missing from {p0}"


# ---------------------------------------------------------------------- produce / consume


def test_produce_and_consume_json_roundtrip_with_keys(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "orders", "--partitions", "3", bootstrap=b))
    before = int(time.time() * 1000)
    sent = {
        "customer-42": ["first", "second", "third"],
        "customer-7": ["x", "y"],
        "k3": ["héllo wörld"],
    }
    for key, values in sent.items():
        res = cli("produce", "orders", "--key", key, bootstrap=b, input=lines_in(*values))
        assert ok(res) == ""  # piped: nothing on stdout
    after = int(time.time() * 1000)

    out = ok(cli("consume", "orders", "--from", "earliest", "--max-messages", "6", "--json", bootstrap=b))
    recs = json_lines(out)
    assert len(recs) == 6
    for r in recs:
        assert set(r) == {"topic", "partition", "offset", "timestamp", "key", "value", "headers"}
        assert r["topic"] == "orders"
        assert r["headers"] == {}
        assert before - 1000 <= r["timestamp"] <= after + 1000
        # keys route consistently: crc32c(key) % partitions
        assert r["partition"] == crc32c.crc32c(r["key"].encode()) % 3
    got: dict[str, list[str]] = {}
    for r in sorted(recs, key=lambda r: (r["partition"], r["offset"])):
        got.setdefault(r["key"], []).append(r["value"])
    assert got == sent
    # offsets are dense from 0 in every partition
    for p in {r["partition"] for r in recs}:
        offs = sorted(r["offset"] for r in recs if r["partition"] == p)
        assert offs == list(range(len(offs)))


def test_produce_headers_and_keyless(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "h", bootstrap=b))
    ok(cli("produce", "h", "--header", "source=cli", "--header", "v=1", bootstrap=b, input=lines_in("a", "b")))
    recs = json_lines(ok(cli("consume", "h", "--from", "earliest", "--max-messages", "2", "--json", bootstrap=b)))
    assert [r["value"] for r in recs] == ["a", "b"]
    assert [r["key"] for r in recs] == [None, None]
    assert all(r["headers"] == {"source": "cli", "v": "1"} for r in recs)


def test_consume_plain_prints_values_one_per_line(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "plain", bootstrap=b))
    values = [f"line {i}" for i in range(5)]
    ok(cli("produce", "plain", bootstrap=b, input=lines_in(*values)))
    out = ok(cli("consume", "plain", "--from", "earliest", "--max-messages", "5", bootstrap=b))
    assert out.splitlines() == values


def test_consume_from_offset(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "off", bootstrap=b))
    ok(cli("produce", "off", bootstrap=b, input=lines_in(*(f"m{i}" for i in range(6)))))
    recs = json_lines(ok(cli("consume", "off", "--from", "2", "--timeout-ms", "500", "--json", bootstrap=b)))
    assert [(r["offset"], r["value"]) for r in recs] == [(i, f"m{i}") for i in range(2, 6)]


def test_consume_from_an_offset_past_the_end_starts_at_the_end_with_or_without_a_group(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "off", bootstrap=b))
    ok(cli("produce", "off", bootstrap=b, input=lines_in(*(f"m{i}" for i in range(6)))))
    for group in ([], ["--group", "g"]):
        res = cli("consume", "off", "--from", "1000", "--timeout-ms", "300", *group, bootstrap=b)
        assert ok(res) == "", group
        assert b"off-0 ends at offset 6: starting there, not at 1000" in res.stderr, group


def test_consume_partition_from_offset(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "off", "--partitions", "2", bootstrap=b))
    ok(cli("produce", "off", "--partition", "1", bootstrap=b, input=lines_in(*(f"m{i}" for i in range(6)))))
    out = ok(cli("consume", "off", "--partition", "1", "--from", "4", "--timeout-ms", "500", bootstrap=b))
    assert out.splitlines() == ["m4", "m5"]


def test_consume_from_iso_time(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "timed", "--partitions", "2", bootstrap=b))
    ok(cli("produce", "timed", bootstrap=b, input=lines_in("old-1", "old-2", "old-3")))
    time.sleep(0.3)
    cut = datetime.now(UTC)
    time.sleep(0.3)
    ok(cli("produce", "timed", bootstrap=b, input=lines_in("new-1", "new-2")))

    for spelled in (cut.isoformat(), cut.replace(tzinfo=None).isoformat(timespec="milliseconds")):
        out = ok(cli("consume", "timed", "--from", spelled, "--timeout-ms", "500", bootstrap=b))
        assert sorted(out.splitlines()) == ["new-1", "new-2"], spelled


def test_consume_group_resumes_where_previous_run_stopped(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "g", "--partitions", "2", bootstrap=b))
    values = [f"v{i}" for i in range(10)]
    ok(cli("produce", "g", "--key", "a", bootstrap=b, input=lines_in(*values[:5])))
    ok(cli("produce", "g", "--key", "b", bootstrap=b, input=lines_in(*values[5:])))

    first = ok(cli("consume", "g", "--group", "billing", "--from", "earliest", "--max-messages", "4", bootstrap=b))
    first = first.splitlines()
    assert len(first) == 4
    rest = ok(cli("consume", "g", "--group", "billing", "--timeout-ms", "500", bootstrap=b)).splitlines()
    assert len(rest) == 6
    assert sorted(first + rest) == sorted(values)
    # everything is committed now: a third run reads nothing
    assert ok(cli("consume", "g", "--group", "billing", "--timeout-ms", "500", bootstrap=b)) == ""
    # another group starts over
    other = ok(cli("consume", "g", "--group", "other", "--from", "earliest", "--timeout-ms", "500", bootstrap=b))
    assert sorted(other.splitlines()) == sorted(values)


def test_consume_timeout_exits_when_idle(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "idle", bootstrap=b))
    t0 = time.monotonic()
    out = ok(cli("consume", "idle", "--from", "earliest", "--timeout-ms", "400", bootstrap=b, timeout=15))
    assert out == ""
    assert time.monotonic() - t0 < 10


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize("name", ["bad name", "x" * 300, "__reserved", "..", "a/b"])
def test_create_bad_topic_name(shared, cli, name):
    line = assert_error(cli("topic", "create", name, bootstrap=shared.bootstrap), "INVALID_TOPIC_NAME")
    assert "(7)" in line


@pytest.mark.parametrize("n", ["0", "-3"])
def test_create_bad_partitions_is_one_clear_line(shared, cli, n):
    assert_error(cli("topic", "create", "p-bad", "--partitions", n, bootstrap=shared.bootstrap), "partitions")
    assert "p-bad" not in topic_names(shared, cli)


@pytest.mark.parametrize("n", ["0", "-3", "10001"])
def test_create_bad_partitions_is_a_usage_error_giving_the_range(shared, cli, n):
    assert_usage_error(cli("topic", "create", "p-many", "--partitions", n, bootstrap=shared.bootstrap),
                       "--partitions", "1<=x<=10000")


def test_create_partitions_help_and_a_count_past_32_bits(shared, cli):
    """Help gives the real range (not a 32-bit one); a count past it, however large, is a
    usage error at once, naming the option."""
    out = ok(cli("topic", "create", "--help", bootstrap=shared.bootstrap))
    assert "Partitions of the topic, 1-10000." in out and "2147483647" not in out
    res = cli("topic", "create", "p-huge", "--partitions", "99999999999", bootstrap=shared.bootstrap)
    assert res.returncode == 2
    assert_error(res, "USAGE_ERROR", "'--partitions': 99999999999 is not in the range 1<=x<=10000")


def test_create_existing_topic(shared, cli):
    b = shared.bootstrap
    ok(cli("topic", "create", "dup", "--partitions", "2", bootstrap=b))
    assert_error(cli("topic", "create", "dup", bootstrap=b), "TOPIC_ALREADY_EXISTS", "dup")
    desc = json.loads(ok(cli("topic", "describe", "dup", bootstrap=b)))
    assert len(desc["partitions"]) == 2  # untouched


@pytest.mark.parametrize("command", [("topic", "describe"), ("topic", "delete")])
def test_unknown_topic_admin(shared, cli, command):
    assert_error(cli(*command, "nope", bootstrap=shared.bootstrap), "UNKNOWN_TOPIC", "nope")


@pytest.mark.parametrize("args", [
    ("topic", "describe", "bad/name"), ("topic", "delete", "bad/name"),
    ("topic", "alter", "bad/name", "--config", "retention.ms=5"),
    ("consume", "bad/name", "--from", "earliest", "--timeout-ms", "300"), ("produce", "bad/name"),
])
def test_a_name_no_topic_can_have_is_named_invalid_not_unknown(shared, cli, args):
    res = cli(*args, bootstrap=shared.bootstrap, input=b"x\n", timeout=10)
    assert_error(res, "INVALID_TOPIC_NAME", "'bad/name'")


def test_consume_unknown_topic(shared, cli):
    assert_error(
        cli("consume", "nope", "--from", "earliest", "--timeout-ms", "300", bootstrap=shared.bootstrap),
        "UNKNOWN_TOPIC", "nope",
    )


def test_produce_unknown_topic_fails_promptly(shared, cli):
    res = cli("produce", "nope", bootstrap=shared.bootstrap, input=b"hi\n", timeout=4)
    assert_error(res, "UNKNOWN_TOPIC", "nope")


def test_produce_message_too_large(shared, cli):
    b = shared.bootstrap
    ok(cli("topic", "create", "small-1", "--config", "max.message.bytes=1024", bootstrap=b))
    assert_error(cli("produce", "small-1", bootstrap=b, input=b"a" * 5000 + b"\n"), "MESSAGE_TOO_LARGE")
    # small messages still go through
    ok(cli("produce", "small-1", bootstrap=b, input=b"tiny\n"))
    out = ok(cli("consume", "small-1", "--from", "earliest", "--timeout-ms", "500", bootstrap=b))
    assert out.splitlines() == ["tiny"]


def test_produce_with_one_oversized_line_fails_the_command(shared, cli):
    b = shared.bootstrap
    ok(cli("topic", "create", "small-2", "--config", "max.message.bytes=1024", bootstrap=b))
    line = assert_error(
        cli("produce", "small-2", bootstrap=b, input=b"ok-1\n" + b"a" * 5000 + b"\nok-2\n"),
        "MESSAGE_TOO_LARGE",
    )
    assert "1 of 3" in line


@pytest.mark.parametrize(
    "config, needle",
    [
        ("no.such.key=1", "no.such.key"),
        ("retention.ms=abc", "retention.ms"),
        ("flush.messages=-5", "flush.messages"),
        ("segment.bytes=10", "segment.bytes"),
        ("timestamp.type=Whenever", "timestamp.type"),
    ],
)
def test_create_bad_config(shared, cli, config, needle):
    b = shared.bootstrap
    assert_error(cli("topic", "create", "c-bad", "--config", config, bootstrap=b), "INVALID_CONFIG", needle)
    assert "c-bad" not in topic_names(shared, cli)  # nothing was created


def test_create_config_without_equals(shared, cli):
    res = cli("topic", "create", "c-bad", "--config", "retention.ms", bootstrap=shared.bootstrap)
    assert res.returncode != 0
    assert b"Traceback" not in res.stderr
    assert b"KEY=VALUE" in res.stderr


@pytest.mark.parametrize("bad", ["yesterday", "-5"])
def test_consume_bad_from_is_rejected(shared, cli, bad):
    res = cli("consume", "t", "--from", bad, "--timeout-ms", "300", bootstrap=shared.bootstrap)
    assert res.returncode != 0
    assert b"Traceback" not in res.stderr
    assert b"--from" in res.stderr


def test_consume_bad_from_is_one_error_line(shared, cli):
    assert_error(
        cli("consume", "t", "--from", "yesterday", "--timeout-ms", "300", bootstrap=shared.bootstrap),
        "--from",
    )


@pytest.mark.parametrize(
    "args, stdin",
    [
        (("topic", "list"), None),
        (("topic", "create", "t"), None),
        (("topic", "describe", "t"), None),
        (("produce", "t"), b"hi\n"),
        (("consume", "t", "--from", "earliest", "--timeout-ms", "300"), None),
    ],
)
def test_broker_not_running(cli, args, stdin):
    port = free_port()
    t0 = time.monotonic()
    res = cli(*args, bootstrap=f"127.0.0.1:{port}", input=stdin, timeout=20)
    line = assert_error(res, f"127.0.0.1:{port}")
    assert "connect" in line.lower()
    assert time.monotonic() - t0 < 15


# ---------------------------------------------------------------------- helpers for the newer options


def assert_usage_error(res, *needles: str) -> str:
    """A usage error: one ``error: USAGE_ERROR (1002): ...`` line and exit status 2."""
    line = assert_error(res, "USAGE_ERROR (1002)", *needles)
    assert res.returncode == 2, (res.returncode, line)
    return line


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int | None]:
    from sluice.client import SyncConsumer

    with SyncConsumer(bootstrap, group=group, enable_auto_commit=False) as c:
        return [c.committed((topic, p)) for p in range(partitions)]


def wait_for(condition, timeout: float = 15, what: str = "condition"):
    """Poll ``condition()`` until it returns something truthy; fail after ``timeout`` s
    (``sluice.harness.wait_until``)."""
    return wait_until(condition, timeout, what)


@contextlib.contextmanager
def running(*cmd, **kw):
    """``subprocess.Popen(cmd)``, killed (and reaped) on the way out whatever happens."""
    proc = subprocess.Popen(cmd, **kw)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None:
                f.close()


def sluice_cmd(bootstrap: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "sluice.cli.main", "--bootstrap", bootstrap, *args]


# ---------------------------------------------------------------------- item 2: group start positions


def test_new_group_starts_at_earliest(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "g2", "--partitions", "2", bootstrap=b))
    ok(cli("produce", "g2", bootstrap=b, input=lines_in("before-1", "before-2")))
    out = ok(cli("consume", "g2", "--group", "fresh", "--timeout-ms", "500", bootstrap=b))
    assert sorted(out.splitlines()) == ["before-1", "before-2"]


def test_group_less_consume_starts_at_latest(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "g3", bootstrap=b))
    ok(cli("produce", "g3", bootstrap=b, input=lines_in("old")))
    assert ok(cli("consume", "g3", "--timeout-ms", "300", bootstrap=b)) == ""


def test_group_commits_its_starting_position_even_when_it_reads_nothing(broker, cli):
    """An idle first run at `latest` must leave a position behind, or what is produced
    before the next run is skipped by it."""
    b = broker.bootstrap
    ok(cli("topic", "create", "g4", "--partitions", "2", bootstrap=b))
    ok(cli("produce", "g4", bootstrap=b, input=lines_in("skipped-1", "skipped-2")))
    assert ok(cli("consume", "g4", "--group", "late", "--from", "latest", "--timeout-ms", "300", bootstrap=b)) == ""
    assert sum(committed(b, "late", "g4", 2)) == 2  # the end of each partition, committed
    ok(cli("produce", "g4", bootstrap=b, input=lines_in("next")))
    assert ok(cli("consume", "g4", "--group", "late", "--timeout-ms", "500", bootstrap=b)) == "next\n"


def test_idle_new_group_commits_so_the_next_run_sees_new_messages(broker, cli):
    """The issue's reproduction: `consume --group fresh --timeout-ms ...` on an idle topic,
    then a message, then the same command again."""
    b = broker.bootstrap
    ok(cli("topic", "create", "orders", bootstrap=b))
    assert ok(cli("consume", "orders", "--group", "fresh", "--timeout-ms", "300", bootstrap=b)) == ""
    assert committed(b, "fresh", "orders", 1) == [0]
    ok(cli("produce", "orders", bootstrap=b, input=lines_in("m1")))
    assert ok(cli("consume", "orders", "--group", "fresh", "--timeout-ms", "500", bootstrap=b)) == "m1\n"


def test_consume_help_states_the_defaults(cli):
    out = ok(cli("consume", "--help", bootstrap="127.0.0.1:1"))
    flat = " ".join(out.split())
    assert "earliest where it has none" in flat and "without --group, latest" in flat


# ---------------------------------------------------------------------- item 3: bytes


def test_raw_mode_roundtrips_random_bytes_exactly(broker, cli, tmp_path):
    b = broker.bootstrap
    ok(cli("topic", "create", "bin", bootstrap=b))
    data = os.urandom(100_000)
    (tmp_path / "in").write_bytes(data)
    ok(cli("produce", "bin", "--raw", "--file", str(tmp_path / "in"), bootstrap=b))
    res = cli("consume", "bin", "--from", "earliest", "-e", "--raw", "--delimiter", "", bootstrap=b)
    ok(res)
    assert res.stdout == data
    text = cli("consume", "bin", "--from", "earliest", "-e", bootstrap=b).stdout
    assert len(text) > len(data)  # text mode escapes, as its help says


def test_raw_mode_with_a_nul_delimiter_keeps_newlines_and_carriage_returns(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "bin0", bootstrap=b))
    values = [b"line\r\nbreak", b"\xe9\xff\n", b"", b"tab\there"]
    ok(cli("produce", "bin0", "--delimiter", "\\0", bootstrap=b, input=b"\0".join(values) + b"\0"))
    res = cli("consume", "bin0", "--from", "earliest", "-e", "--raw", "--delimiter", "\\0", bootstrap=b)
    ok(res)
    assert res.stdout == b"".join(v + b"\0" for v in values)


def test_produce_keeps_a_carriage_return(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "crlf", bootstrap=b))
    ok(cli("produce", "crlf", bootstrap=b, input=b"dos\r\nunix\nlast"))
    recs = json_lines(ok(cli("consume", "crlf", "--from", "earliest", "-e", "--json", bootstrap=b)))
    assert [r["value"] for r in recs] == ["dos\r", "unix", "last"]


def test_help_says_what_each_mode_does_to_bytes(cli):
    flat = " ".join(ok(cli("consume", "--help", bootstrap="127.0.0.1:1")).split())
    assert "not UTF-8 are written as \\xNN escapes" in flat
    assert "--raw" in flat and "byte for byte" in flat and "base64" in flat
    flat = " ".join(ok(cli("produce", "--help", bootstrap="127.0.0.1:1")).split())
    assert "Only the delimiter is removed" in flat and "one message, byte for byte" in flat


# ---------------------------------------------------------------------- item 5: bad values


@pytest.mark.parametrize(
    "args, needle",
    [
        (("consume", "t", "--from", "9999999999999999999999"), "--from"),
        (("consume", "t", "--from", "9223372036854775808"), "out of range"),
        (("consume", "t", "--from", ""), "--from"),
        (("consume", "t", "--from", "1969-07-20T20:17:00"), "before 1970"),
        (("consume", "t", "--from", "\u00b2"), "--from"),
        (("consume", "t", "--partition", "99999999999999999999"), "--partition"),
        (("consume", "t", "--format", "%x"), "--format"),
        (("consume", "t", "--delimiter", "\\q"), "--delimiter"),
        (("consume", "t", "--json", "--raw"), "--json and --raw"),
        (("consume", "t", "--format", "%v", "--print-keys"), "--format and --print-keys"),
        (("consume", "t", "--group", ""), "--group"),
        (("produce", "t", "--key", "k", "--key-separator", ":"), "--key and --key-separator"),
        (("produce", "t", "--file", "/nonexistent/file"), "--file"),
        (("produce", "t", "--raw", "--delimiter", ","), "--raw and --delimiter"),
        (("produce", "t", "--partition", "-1"), "--partition"),
        (("topic", "create", "t", "--partitions", "99999999999999999999"), "--partitions"),
        (("--log-level", "bogus", "topic", "list"), "--log-level"),
        (("--bootstrap", "127.0.0.1:99999", "topic", "list"), "65535"),
        (("--bootstrap", "127.0.0.1:0", "topic", "list"), "--bootstrap"),
        (("--bootstrap", "h:port", "topic", "list"), "not a number"),
        (("--bootstrap", "", "topic", "list"), "--bootstrap"),
        (("no-such-command",), "no-such-command"),
        (("consume",), "TOPIC"),
        (("topic", "list", "--bootstrap", "127.0.0.1:0"), "--bootstrap"),  # after the command too
        (("topic", "list", "--output", "csv"), "--output"),
        (("topic", "list", "--json", "-o", "table"), "--json and --output table"),
    ],
)
def test_bad_usage_is_refused_before_anything_is_sent(cli, args, needle):
    """Against a port nobody listens on: a usage error proves nothing was sent."""
    res = cli(*args, bootstrap=f"127.0.0.1:{free_port()}", input=b"", timeout=20)
    assert_usage_error(res, needle)


def test_from_out_of_range_against_a_real_broker_is_one_line(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "orders", bootstrap=b))
    t0 = time.monotonic()
    res = cli("consume", "orders", "--from", "9999999999999999999999", bootstrap=b, timeout=20)
    assert_usage_error(res, "--from", "out of range")
    assert time.monotonic() - t0 < 10
    assert b"OverflowError" not in res.stderr and b"Task exception" not in res.stderr


def test_bad_log_level_from_the_environment(cli):
    res = subprocess.run(sluice_cmd("127.0.0.1:1", "topic", "list"), capture_output=True, timeout=20,
                         env={**os.environ, "SLUICE_LOG_LEVEL": "bogus"})
    assert_usage_error(res, "--log-level")


# ---------------------------------------------------------------------- item 6: error names and codes


def test_connection_refused_is_broker_unreachable_with_a_code(cli):
    port = free_port()
    res = cli("topic", "list", bootstrap=f"127.0.0.1:{port}")
    assert_error(res, f"BROKER_UNREACHABLE (1007): cannot connect to 127.0.0.1:{port}: Connection refused")
    assert res.returncode == 1


def test_bootstrap_without_a_port_means_7400(cli):
    """7400, Sluice's port; 9092 is Kafka's.  (A broker may listen on 7400 here.)"""
    res = cli("topic", "list", bootstrap="127.0.0.1", timeout=20)
    if res.returncode != 0:
        assert_error(res, "127.0.0.1:7400")


@pytest.mark.parametrize("host", ["999.1.1.1", "192.0.2.1", "no-such-host.invalid"])
def test_bad_host_names_the_option(cli, tmp_path, host):
    res = cli("serve", "--data-dir", str(tmp_path / "d"), "--host", host, "--port", "0", bootstrap="127.0.0.1:1")
    assert_usage_error(res, "--host", host)


def test_port_in_use_is_a_config_error(broker, cli, tmp_path):
    res = cli("serve", "--data-dir", str(tmp_path / "d"), "--port", str(broker.port), bootstrap="127.0.0.1:1")
    line = assert_error(res, "CONFIG_ERROR (1001)", f"cannot listen on 127.0.0.1:{broker.port}", "in use")
    assert res.returncode == 1, line


def test_bad_topic_default_is_a_usage_error(cli, tmp_path):
    res = cli("serve", "--data-dir", str(tmp_path / "d"), "--topic-default", "flush.messages=-5",
              bootstrap="127.0.0.1:1")
    assert_usage_error(res, "flush.messages")


def test_http_server_is_a_handshake_timeout_not_a_connect_timeout(cli):
    """Pointed at an HTTP server, the CLI says it connected and got no Sluice handshake,
    within a few seconds (the TCP connect timeout is 10 s)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        t0 = time.monotonic()
        res = cli("topic", "list", bootstrap=f"127.0.0.1:{port}", timeout=30)
        took = time.monotonic() - t0
        assert_error(res, "HANDSHAKE_TIMEOUT (1008)", f"connected to 127.0.0.1:{port}",
                     "did not answer the Sluice handshake", "is it a Sluice broker?")
        assert res.returncode == 1
        assert took < 9.5, took
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


# ---------------------------------------------------------------------- item 7: kcat-like options


def test_consume_format_print_keys_and_headers(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "fmt", bootstrap=b))
    ok(cli("produce", "fmt", "--key", "k1", "-H", "a=1", "--header", "b=2", bootstrap=b, input=lines_in("v1")))
    out = ok(cli("consume", "fmt", "--from", "earliest", "-e",
                 "--format", "%t|%p|%o|%k|%v|%h|%T|%%\\n", bootstrap=b))
    topic, part, off, key, value, headers, ts, pct = out.rstrip("\n").split("|")
    assert (topic, part, off, key, value, headers, pct) == ("fmt", "0", "0", "k1", "v1", "a=1,b=2", "%")
    assert abs(int(ts) - time.time() * 1000) < 60_000
    assert ok(cli("consume", "fmt", "--from", "earliest", "-e", "--print-keys", bootstrap=b)) == "k1\tv1\n"
    out = ok(cli("consume", "fmt", "--from", "earliest", "-e", "--print-keys", "--key-separator", " => ",
                 bootstrap=b))
    assert out == "k1 => v1\n"


def test_exit_at_end_stops_at_the_end_it_started_with(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "ends", "--partitions", "3", bootstrap=b))
    values = [f"v{i}" for i in range(20)]
    ok(cli("produce", "ends", "--key-separator", ":", bootstrap=b,
           input=lines_in(*(f"k{i % 5}:{v}" for i, v in enumerate(values)))))
    t0 = time.monotonic()
    out = ok(cli("consume", "ends", "--from", "earliest", "--exit-at-end", bootstrap=b, timeout=30))
    assert sorted(out.splitlines()) == sorted(values)
    assert time.monotonic() - t0 < 15
    # nothing left to read: exits at once, with a group too (which commits where it ended)
    assert ok(cli("consume", "ends", "-e", bootstrap=b)) == ""
    assert ok(cli("consume", "ends", "-e", "--group", "snap", bootstrap=b)) != ""
    assert ok(cli("consume", "ends", "-e", "--group", "snap", bootstrap=b)) == ""


# ---------------------------------------------------------------------- README and docs

README = Path(__file__).resolve().parents[2] / "README.md"


DOCS = README.parent / "docs"


def sh_commands(text: str) -> list[str]:
    """The command lines of every ```sh block of ``text``, in order."""
    blocks = re.findall(r"```sh\n(.*?)\n```", text, re.S)
    return [ln for block in blocks for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def tour_commands(text: str) -> list[str]:
    """The command lines of the "Five-minute tour" section of README.md or getting started."""
    start = text.index("## Five-minute tour")
    end = text.find("\n## ", start + 1)
    return sh_commands(text[start : end if end > 0 else len(text)])


@pytest.mark.parametrize("commands", [
    pytest.param(lambda: [c for page in ("cli", "operations") for c in sh_commands((DOCS / "guides" / f"{page}.md")
                                                                                   .read_text())],
                 id="guides/cli.md+operations.md"),
    pytest.param(lambda: tour_commands(README.read_text()), id="README tour"),
    pytest.param(lambda: tour_commands((DOCS / "getting-started.md").read_text()), id="getting-started tour"),
])
def test_documented_commands_run_as_written(broker, tmp_path, commands):
    """Every line as written, through bash, with the venv's `sluice` first on PATH and
    SLUICE_BOOTSTRAP pointing at the test broker."""
    commands = commands()
    assert len(commands) >= 8, commands
    env = {**os.environ, "SLUICE_BOOTSTRAP": broker.bootstrap,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for command in commands:
        res = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, timeout=60)
        assert res.returncode == 0, (command, res.stderr.decode(errors="replace"))
        assert b"Traceback" not in res.stderr, (command, res.stderr)


def test_bench_help_points_to_a_spec_in_the_repository(cli):
    flat = " ".join(ok(cli("bench", "--help", bootstrap="127.0.0.1:1")).split())
    assert "docs/benchmarks.md" in flat and "shared/" not in flat
    assert (README.parent / "docs" / "benchmarks.md").is_file()


def test_docs_name_no_pypi_install_and_say_times_are_utc():
    pages = [README, *DOCS.rglob("*.md")]
    text = " ".join(" ".join(p.read_text() for p in pages).replace("**", "").split())
    assert "pip install 'sluice[spark]'" not in text
    assert "pip install -e '.[spark]'" in text  # into the editable install, not over it
    spark = (DOCS / "guides" / "spark.md").read_text()  # local mode listens on loopback only
    assert '.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")' in spark
    assert "without a zone is UTC" in text
    assert "PYSPARK_PYTHON" in text


def test_readme_is_short_and_keeps_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert "```sh\n./scripts/serve\n```" in text and "```sh\n./scripts/test\n```" in text
    assert "./scripts/test" in (README.parent / ".ci" / "run").read_text()


# ---------------------------------------------------------------------- following across a restart


def read_until(stream, needle: bytes, timeout: float = 30) -> bytes:
    """Read ``stream`` (a pipe) until ``needle`` has appeared; fail after ``timeout`` s."""
    import select

    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{needle!r} not seen within {timeout}s; got {seen!r}"
        ready, _, _ = select.select([stream], [], [], left)
        if ready:
            chunk = os.read(stream.fileno(), 65536)
            assert chunk, f"stream ended before {needle!r}; got {seen!r}"
            seen += chunk
    return seen


@pytest.mark.parametrize("start", [("--from", "earliest"), ("--group", "riders")])
def test_following_consume_rides_out_a_broker_restart(broker, cli, start):
    b = broker.bootstrap
    ok(cli("topic", "create", "ride", "--partitions", "2", bootstrap=b))
    with running(*sluice_cmd(b, "consume", "ride", *start),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        ok(cli("produce", "ride", bootstrap=b, input=lines_in("before")))
        read_until(proc.stdout, b"before\n")
        assert broker.stop() == 0
        broker.start()
        ok(cli("produce", "ride", bootstrap=b, input=lines_in("after")))
        read_until(proc.stdout, b"after\n")
        if start[0] == "--group":  # it commits past both, across the restart
            wait_for(lambda: sum(o or 0 for o in committed(b, "riders", "ride", 2)) == 2, what="the commit")
        assert proc.poll() is None, proc.stderr.read()
