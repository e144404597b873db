"""``sluice group …``, ``sluice topic alter`` and ``sluice topic add-partitions`` end to end
against real broker processes: every option, dry runs, bad input, restarts."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import pytest

from clock import millisecond_after_now
from sluice.harness import BrokerProcess, wait_until

from .test_cli import assert_error, json_lines, lines_in, ok

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One broker for the bad-input cases (each uses its own names); killed at the end."""
    d = tmp_path_factory.mktemp("shared-admin-broker")
    b = BrokerProcess(d / "data", d / "broker.log").start()
    yield b
    b.kill()


def describe(cli, b: str, *args: str) -> dict:
    return json.loads(ok(cli(*args, bootstrap=b)))


def rows(out: str) -> list[list[str]]:
    return [ln.split("\t") for ln in out.splitlines() if ln]


def poll(check, what: str, timeout: float = 20):
    return wait_until(check, timeout, what, interval=0.1)


# ---------------------------------------------------------------------- groups


def test_group_list_and_describe(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "orders", "--partitions", "2", bootstrap=b))
    ok(cli("produce", "orders", "--partition", "0", bootstrap=b, input=lines_in(*"abcde")))
    ok(cli("produce", "orders", "--partition", "1", bootstrap=b, input=lines_in(*"xyz")))
    assert ok(cli("group", "list", "-o", "plain", bootstrap=b)) == ""
    t0 = int(time.time() * 1000)
    ok(cli("consume", "orders", "--group", "billing", "--partition", "0", "--from", "earliest",
           "--max-messages", "4", bootstrap=b))
    t1 = int(time.time() * 1000)

    [[name, topics, partitions, lag, last]] = rows(ok(cli("group", "list", "-o", "plain", bootstrap=b)))
    assert (name, topics, partitions, lag) == ("billing", "orders", "1", "1")
    assert t0 <= round(datetime.fromisoformat(last).timestamp() * 1000) <= t1
    [listing] = json.loads(ok(cli("group", "list", "--json", bootstrap=b)))
    assert listing["name"] == "billing" and listing["lag"] == 1

    for args in (("group", "describe", "billing"), ("group", "describe", "billing", "--json")):
        desc = describe(cli, b, *args)  # piped: JSON either way
        assert desc["name"] == "billing"
        p0, p1 = desc["partitions"]
        assert (p0["partition"], p0["committed_offset"], p0["high_watermark"], p0["lag"]) == (0, 4, 5, 1)
        assert t0 <= p0["commit_time_ms"] <= t1 and p0["committed_by"].startswith("127.0.0.1:")
        assert (p1["partition"], p1["committed_offset"], p1["high_watermark"], p1["lag"]) == (1, -1, 3, -1)


def test_group_reset_offsets_every_target(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "r", "--partitions", "2", bootstrap=b))
    ok(cli("produce", "r", "--partition", "0", bootstrap=b, input=lines_in("old-0", "old-1", "old-2")))
    cut = millisecond_after_now()  # the old messages are before it, the new ones after
    ok(cli("produce", "r", "--partition", "0", bootstrap=b, input=lines_in("new-0", "new-1")))

    def reset(*args: str) -> list[list[str]]:
        return rows(ok(cli("group", "reset-offsets", "g", "--topic", "r", *args, "-o", "plain", bootstrap=b)))

    assert reset("--to-offset", "2") == [["r", "0", "-", "2"], ["r", "1", "-", "0"]]  # clamped
    assert reset("--shift-by", "1", "--partition", "0") == [["r", "0", "2", "3"]]
    out = ok(cli("group", "reset-offsets", "g", "--topic", "r", "--shift-by", "-10", "--json", bootstrap=b))
    assert json.loads(out) == [
        {"topic": "r", "partition": 0, "old": 3, "new": 0},
        {"topic": "r", "partition": 1, "old": 0, "new": 0},
    ]
    assert reset("--to-latest", "--partition", "0", "--partition", "1") == [["r", "0", "0", "5"], ["r", "1", "0", "0"]]

    dry = cli("group", "reset-offsets", "g", "--topic", "r", "--to-earliest", "--dry-run", "-o", "plain", bootstrap=b)
    assert rows(ok(dry)) == [["r", "0", "5", "0"], ["r", "1", "0", "0"]]
    assert b"dry run" in dry.stderr
    committed = [p["committed_offset"] for p in describe(cli, b, "group", "describe", "g")["partitions"]]
    assert committed == [5, 0]  # the dry run changed nothing

    naive = cut.replace(tzinfo=None).isoformat(timespec="milliseconds")  # no zone: UTC
    assert reset("--to-datetime", naive) == [["r", "0", "5", "3"], ["r", "1", "0", "0"]]
    zoned = cut.astimezone(timezone(timedelta(hours=-5))).isoformat()
    assert reset("--to-datetime", zoned) == [["r", "0", "3", "3"], ["r", "1", "0", "0"]]
    # the group's consumer starts where the reset put it
    out = ok(cli("consume", "r", "--group", "g", "--timeout-ms", "500", bootstrap=b))
    assert out.splitlines() == ["new-0", "new-1"]
    assert reset("--to-earliest", "--partition", "0") == [["r", "0", "5", "0"]]


def test_group_delete(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "d", bootstrap=b))
    ok(cli("group", "reset-offsets", "gone", "--topic", "d", "--to-latest", bootstrap=b))
    ok(cli("group", "reset-offsets", "kept", "--topic", "d", "--to-latest", bootstrap=b))
    assert ok(cli("group", "delete", "gone", bootstrap=b)).strip() == "deleted group gone"
    assert [r[0] for r in rows(ok(cli("group", "list", "-o", "plain", bootstrap=b)))] == ["kept"]
    assert_error(cli("group", "describe", "gone", bootstrap=b), "UNKNOWN_GROUP (22)", "gone")
    assert_error(cli("group", "delete", "gone", bootstrap=b), "UNKNOWN_GROUP (22)", "gone")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("group", "describe", "nope"), ("UNKNOWN_GROUP (22)", "nope")),
        (("group", "delete", "nope"), ("UNKNOWN_GROUP (22)", "nope")),
        (("group", "describe", "bad name"), ("INVALID_GROUP (18)",)),
        (("group", "reset-offsets", "g", "--topic", "nope", "--to-earliest"), ("UNKNOWN_TOPIC (4)", "nope")),
        (("group", "reset-offsets", "g", "--topic", "t1", "--to-datetime", "yesterday"), ("--to-datetime", "ISO")),
        (("group", "reset-offsets", "g", "--topic", "t1", "--to-datetime", "2026-13-45"), ("--to-datetime",)),
        (("group", "reset-offsets", "g", "--topic", "t1"), ("exactly one of",)),
        (("group", "reset-offsets", "g", "--topic", "t1", "--to-earliest", "--to-offset", "3"), ("exactly one of",)),
        (("group", "reset-offsets", "g", "--topic", "t1", "--to-offset", "-1"), ("--to-offset",)),
        (("group", "reset-offsets", "g", "--topic", "t1", "--to-earliest", "--partition", "7"),
         ("UNKNOWN_PARTITION (5)",)),
        (("group", "reset-offsets", "g", "--topic", "t1", "--shift-by", "2"), ("INVALID_REQUEST (2)", "no committed offset")),
        (("group", "reset-offsets", "bad name", "--topic", "t1", "--to-earliest"), ("INVALID_GROUP (18)",)),
        (("group", "reset-offsets", "g", "--to-earliest"), ("--topic",)),
    ],
)
def test_group_bad_input(shared, cli, args, needles):
    if "t1" not in topics(shared, cli):
        ok(cli("topic", "create", "t1", bootstrap=shared.bootstrap))
    assert_error(cli(*args, bootstrap=shared.bootstrap), *needles)
    assert ok(cli("group", "list", "-o", "plain", bootstrap=shared.bootstrap)) == ""  # nothing was created


def topics(b: BrokerProcess, cli) -> list[str]:
    return [r[0] for r in rows(ok(cli("topic", "list", "-o", "plain", bootstrap=b.bootstrap)))]


# ---------------------------------------------------------------------- topic alter


def test_topic_alter_takes_effect_without_restart(broker_factory, cli):
    broker = broker_factory(extra_args=["--retention-check-ms", "100"]).start()
    b = broker.bootstrap
    ok(cli("topic", "create", "a", "--config", "segment.bytes=1024", "--config", "flush.ms=2000", bootstrap=b))
    for n in range(4):  # one batch of ~2 KiB per run: a segment each
        ok(cli("produce", "a", bootstrap=b, input=lines_in(*(f"{n}-{i}" + "x" * 200 for i in range(10)))))
    part = describe(cli, b, "topic", "describe", "a")["partitions"][0]
    assert part["segments"] > 3 and part["log_start_offset"] == 0

    # max.message.bytes: a larger message is refused at once
    out = ok(cli("topic", "alter", "a", "--config", "max.message.bytes=512", "--config", "retention.ms=1", bootstrap=b))
    assert out.strip() == "altered topic a: max.message.bytes=512, retention.ms=1"
    assert_error(cli("produce", "a", bootstrap=b, input=b"y" * 1000 + b"\n"), "MESSAGE_TOO_LARGE")
    ok(cli("produce", "a", bootstrap=b, input=b"small\n"))
    # retention.ms: the retention loop deletes the old segments
    part = poll(
        lambda: (p := describe(cli, b, "topic", "describe", "a")["partitions"][0])["log_start_offset"] > 0 and p,
        "retention to delete old segments",
    )
    assert part["segments"] == 1 and part["high_watermark"] == 41
    out = ok(cli("consume", "a", "--from", "earliest", "--timeout-ms", "500", bootstrap=b))
    assert out.splitlines()[-1] == "small"

    # --delete: back to the default; the other override stays
    out = ok(cli("topic", "alter", "a", "--delete", "retention.ms", "--delete", "flush.ms", bootstrap=b))
    assert out.strip() == "altered topic a: retention.ms reset to default, flush.ms reset to default"
    config = describe(cli, b, "topic", "describe", "a")["config"]
    assert (config["retention.ms"], config["flush.ms"]) == (str(7 * 24 * 3600 * 1000), "1000")
    assert config["max.message.bytes"] == "512"


def test_topic_alter_dry_run_changes_nothing(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "dry", "--config", "retention.ms=60000", bootstrap=b))
    before = describe(cli, b, "topic", "describe", "dry")
    out = ok(cli("topic", "alter", "dry", "--config", "flush.messages=0", "--delete", "retention.ms",
                 "--dry-run", bootstrap=b))
    assert out.startswith("dry run, nothing changed")
    assert describe(cli, b, "topic", "describe", "dry") == before
    assert_error(cli("topic", "alter", "dry", "--config", "flush.messages=x", "--dry-run", bootstrap=b),
                 "INVALID_CONFIG (9)", "flush.messages")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--config", "no.such.key=1"), ("INVALID_CONFIG (9)", "no.such.key")),
        (("--config", "retention.ms=abc"), ("INVALID_CONFIG (9)", "retention.ms")),
        (("--config", "segment.bytes=10"), ("INVALID_CONFIG (9)", "segment.bytes")),
        (("--config", "timestamp.type=Whenever"), ("INVALID_CONFIG (9)", "timestamp.type")),
        (("--delete", "no.such.key"), ("INVALID_CONFIG (9)", "no.such.key")),
        (("--config", "flush.ms=5", "--delete", "flush.ms"), ("INVALID_CONFIG (9)", "both set and deleted")),
        (("--config", "retention.ms=5", "--config", "max.message.bytes=1"), ("INVALID_CONFIG (9)", "max.message.bytes")),
        (("--config", "retention.ms"), ("KEY=VALUE",)),
        (("--delete", "retention.ms", "--delete", "retention.ms"), ("USAGE_ERROR", "retention.ms is given twice")),
        (("--config", "retention.ms=1", "--config", "retention.ms=2"), ("USAGE_ERROR", "retention.ms is given twice")),
        ((), ("--config", "--delete")),
    ],
)
def test_topic_alter_bad_input_changes_nothing(shared, cli, args, needles):
    b = shared.bootstrap
    if "alt" not in topics(shared, cli):
        ok(cli("topic", "create", "alt", bootstrap=b))
    before = describe(cli, b, "topic", "describe", "alt")
    assert_error(cli("topic", "alter", "alt", *args, bootstrap=b), *needles)
    assert describe(cli, b, "topic", "describe", "alt") == before


def test_topic_alter_unknown_topic(shared, cli):
    assert_error(cli("topic", "alter", "nope", "--config", "retention.ms=5", bootstrap=shared.bootstrap),
                 "UNKNOWN_TOPIC (4)", "nope")


# ---------------------------------------------------------------------- topic add-partitions


def test_topic_add_partitions(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "grow", bootstrap=b))
    ok(cli("produce", "grow", bootstrap=b, input=lines_in("p0")))
    assert ok(cli("topic", "add-partitions", "grow", "--num", "2", bootstrap=b)).strip() == (
        "grew topic grow to 3 partitions"
    )
    assert ok(cli("topic", "add-partitions", "grow", "--total", "5", bootstrap=b)).strip() == (
        "grew topic grow to 5 partitions"
    )
    out = ok(cli("topic", "add-partitions", "grow", "--total", "8", "--dry-run", bootstrap=b))
    assert out.startswith("dry run, nothing changed")
    ok(cli("topic", "add-partitions", "grow", "--num", "1", "--dry-run", bootstrap=b))
    desc = describe(cli, b, "topic", "describe", "grow")
    assert [(p["partition"], p["high_watermark"]) for p in desc["partitions"]] == [(0, 1), (1, 0), (2, 0), (3, 0), (4, 0)]
    assert rows(ok(cli("topic", "list", "-o", "plain", bootstrap=b))) == [["grow", "5"]]
    # the new partitions take messages and serve them
    ok(cli("produce", "grow", "--partition", "4", bootstrap=b, input=lines_in("p4")))
    assert ok(cli("consume", "grow", "--partition", "4", "--from", "earliest", "--max-messages", "1",
                  bootstrap=b)).splitlines() == ["p4"]
    recs = json_lines(ok(cli("consume", "grow", "--from", "earliest", "--max-messages", "2", "--json", bootstrap=b)))
    assert sorted((r["partition"], r["value"]) for r in recs) == [(0, "p0"), (4, "p4")]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--total", "2"), ("INVALID_PARTITIONS (8)", "above 3")),  # shrinking
        (("--total", "3"), ("INVALID_PARTITIONS (8)", "above 3")),
        (("--num", "0"), ("INVALID_PARTITIONS (8)", "to add must be at least 1, got 0")),
        (("--total", "10001"), ("INVALID_PARTITIONS (8)",)),
        (("--num", "20000"), ("INVALID_PARTITIONS (8)", "has 3 partitions", "at most 9997 more, not 20000")),
        (("--total", "1", "--dry-run"), ("INVALID_PARTITIONS (8)",)),
        (("--num", "1", "--total", "5"), ("exactly one of --num and --total",)),
        ((), ("exactly one of --num and --total",)),
        (("--total", "many"), ("--total",)),
    ],
)
def test_topic_add_partitions_bad_input(shared, cli, args, needles):
    b = shared.bootstrap
    if "three" not in topics(shared, cli):
        ok(cli("topic", "create", "three", "--partitions", "3", bootstrap=b))
    assert_error(cli("topic", "add-partitions", "three", *args, bootstrap=b), *needles)
    assert len(describe(cli, b, "topic", "describe", "three")["partitions"]) == 3


def test_serve_max_partitions_bounds_what_a_broker_holds(broker_factory, cli):
    assert "--max-partitions" in ok(cli("serve", "--help", bootstrap="127.0.0.1:1"))
    b = broker_factory(extra_args=["--max-partitions", "20"]).start().bootstrap
    line = assert_error(cli("topic", "create", "wide", "--partitions", "30", bootstrap=b), "INVALID_PARTITIONS (8)")
    assert line.endswith("30 more would pass its limit of 20 (sluice serve --max-partitions)")
    ok(cli("topic", "create", "narrow", "--partitions", "2", bootstrap=b))
    line = assert_error(cli("topic", "add-partitions", "narrow", "--num", "30", bootstrap=b), "INVALID_PARTITIONS (8)")
    assert line.endswith("30 more would pass its limit of 20 (sluice serve --max-partitions)")


def test_topic_add_partitions_unknown_topic(shared, cli):
    assert_error(cli("topic", "add-partitions", "nope", "--num", "1", bootstrap=shared.bootstrap),
                 "UNKNOWN_TOPIC (4)", "nope")


# ---------------------------------------------------------------------- restart


def test_admin_changes_persist_across_a_restart(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "kept", "--config", "flush.ms=500", bootstrap=b))
    ok(cli("produce", "kept", bootstrap=b, input=lines_in("a", "b", "c")))
    ok(cli("topic", "alter", "kept", "--config", "retention.ms=60000", "--delete", "flush.ms", bootstrap=b))
    ok(cli("topic", "add-partitions", "kept", "--total", "3", bootstrap=b))
    ok(cli("group", "reset-offsets", "g", "--topic", "kept", "--to-offset", "1", bootstrap=b))
    ok(cli("group", "reset-offsets", "dropped", "--topic", "kept", "--to-latest", bootstrap=b))
    ok(cli("group", "delete", "dropped", bootstrap=b))
    topic_before = describe(cli, b, "topic", "describe", "kept")
    group_before = describe(cli, b, "group", "describe", "g")

    assert broker.stop() == 0
    broker.start()
    assert describe(cli, b, "topic", "describe", "kept") == topic_before
    assert topic_before["config"]["retention.ms"] == "60000" and topic_before["config"]["flush.ms"] == "1000"
    assert len(topic_before["partitions"]) == 3
    assert describe(cli, b, "group", "describe", "g") == group_before
    assert [r[0] for r in rows(ok(cli("group", "list", "-o", "plain", bootstrap=b)))] == ["g"]
    assert ok(cli("consume", "kept", "--group", "g", "--timeout-ms", "500", bootstrap=b)).splitlines() == ["b", "c"]
