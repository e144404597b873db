"""The documented ``sluice`` command line, end to end against a real broker process."""

from __future__ import annotations

import json
import socket
import time
from datetime import UTC, datetime

import crc32c
import pytest

from brokers import BrokerProcess

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One broker for the bad-input cases (each uses its own topic names); killed at the end."""
    d = tmp_path_factory.mktemp("shared-broker")
    b = BrokerProcess(d / "data", d / "broker.log").start()
    yield b
    b.kill()


def topic_names(b: BrokerProcess, cli) -> list[str]:
    return [ln.split("\t")[0] for ln in ok(cli("topic", "list", bootstrap=b.bootstrap)).splitlines() if ln]


# ---------------------------------------------------------------------- helpers


def ok(res) -> str:
    """Assert the command succeeded; return its stdout as text."""
    assert res.returncode == 0, (res.returncode, res.stderr.decode(errors="replace"))
    assert b"Traceback" not in res.stderr, res.stderr.decode(errors="replace")
    return res.stdout.decode()


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    listed = ok(cli("topic", "list", bootstrap=b))
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
    listed = ok(cli("topic", "list", bootstrap=b))
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


def test_create_too_many_partitions(shared, cli):
    assert_error(
        cli("topic", "create", "p-many", "--partitions", "10001", bootstrap=shared.bootstrap),
        "INVALID_PARTITIONS", "(8)",
    )


@pytest.mark.parametrize("n", ["0", "-3"])
def test_create_bad_partitions_names_invalid_partitions(shared, cli, n):
    assert_error(
        cli("topic", "create", "p-bad", "--partitions", n, bootstrap=shared.bootstrap), "INVALID_PARTITIONS"
    )


def test_create_existing_topic(shared, cli):
    b = shared.bootstrap
    ok(cli("topic", "create", "dup", "--partitions", "2", bootstrap=b))
    assert_error(cli("topic", "create", "dup", bootstrap=b), "TOPIC_ALREADY_EXISTS", "dup")
    desc = json.loads(ok(cli("topic", "describe", "dup", bootstrap=b)))
    assert len(desc["partitions"]) == 2  # untouched


@pytest.mark.parametrize("command", [("topic", "describe"), ("topic", "delete")])
def test_unknown_topic_admin(shared, cli, command):
    assert_error(cli(*command, "nope", bootstrap=shared.bootstrap), "UNKNOWN_TOPIC", "nope")


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
