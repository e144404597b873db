"""``sluice sub create|list|describe|seek|delete`` and ``sluice consume TOPIC --sub NAME``
end to end against a real broker: output, exit codes, one-line errors (cli/sub.py)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest

from sluice.harness import BrokerProcess

from .test_cli import assert_error, lines_in, ok

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One broker for the bad-input cases (each uses its own names); killed at the end."""
    d = tmp_path_factory.mktemp("shared-sub-broker")
    b = BrokerProcess(d / "data", d / "broker.log").start()
    yield b
    b.kill()


def describe(cli, b: str, topic: str, name: str) -> list[dict]:
    return json.loads(ok(cli("sub", "describe", topic, name, bootstrap=b)))


def consume_sub(cli, b: str, topic: str, name: str, *extra: str) -> list[str]:
    out = ok(cli("consume", topic, "--sub", name, "--exit-at-end", *extra, bootstrap=b, timeout=60))
    return out.splitlines()


def test_create_list_describe_consume_seek_delete(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "orders", "--partitions", "2", bootstrap=b))
    ok(cli("produce", "orders", "--partition", "0", bootstrap=b, input=lines_in("a", "b", "c")))
    ok(cli("produce", "orders", "--partition", "1", bootstrap=b, input=lines_in("x", "y")))

    out = ok(cli("sub", "create", "orders", "billing", "--mode", "ordered", "--max-attempts", "5",
                 "--ack-timeout-ms", "2000", "--backoff-ms", "100", bootstrap=b))
    assert out == "created subscription billing on orders\n"
    ok(cli("sub", "create", "orders", "audit", "--from", "latest", bootstrap=b))
    assert json.loads(ok(cli("sub", "list", bootstrap=b))) == {"orders": ["audit", "billing"]}
    assert json.loads(ok(cli("sub", "list", "orders", bootstrap=b))) == {"orders": ["audit", "billing"]}

    infos = describe(cli, b, "orders", "billing")
    assert [(i["partition"], i["confirmed"], i["in_flight"], i["consumers"]) for i in infos] == [
        (0, 0, 0, 0), (1, 0, 0, 0)
    ]
    assert infos[0]["backlog"] >= 3 and infos[1]["backlog"] >= 2  # see test_backlog_counts_messages_only
    assert {(i["mode"], i["max_attempts"], i["ack_timeout_ms"]) for i in infos} == {("ordered", 5, 2000)}
    assert [i["backlog"] for i in describe(cli, b, "orders", "audit")] == [0, 0]  # from the end

    # consume through it: every message once, then nothing left
    assert sorted(consume_sub(cli, b, "orders", "billing")) == ["a", "b", "c", "x", "y"]
    assert consume_sub(cli, b, "orders", "billing") == []
    assert [(i["backlog"], i["in_flight"], i["retrying"]) for i in describe(cli, b, "orders", "billing")] == [
        (0, 0, 0), (0, 0, 0)
    ]
    assert consume_sub(cli, b, "orders", "audit") == []

    # seek back to the start: everything again; to an offset; to a time after everything
    out = ok(cli("sub", "seek", "orders", "billing", "earliest", bootstrap=b))
    assert out == "moved subscription billing on orders to earliest: partition 0 at 0, 1 at 0\n"
    assert sorted(consume_sub(cli, b, "orders", "billing")) == ["a", "b", "c", "x", "y"]
    ok(cli("sub", "seek", "orders", "billing", "2", bootstrap=b))
    assert sorted(consume_sub(cli, b, "orders", "billing")) == ["c"]  # offset 2 of each partition
    # past the end: at the end, and the output says where that is
    ends = [i["high_watermark"] for i in describe(cli, b, "orders", "billing")]
    out = ok(cli("sub", "seek", "orders", "billing", "99999", bootstrap=b))
    assert out == f"moved subscription billing on orders to 99999: partition 0 at {ends[0]}, 1 at {ends[1]}\n"
    later = datetime.fromtimestamp(time.time() + 3600, UTC).isoformat()
    ok(cli("sub", "seek", "orders", "billing", later, bootstrap=b))
    assert consume_sub(cli, b, "orders", "billing") == []

    # consume --sub creates a missing subscription from --from (default earliest), and says so
    res = cli("consume", "orders", "--sub", "fresh", "--exit-at-end", bootstrap=b, timeout=60)
    assert sorted(ok(res).splitlines()) == ["a", "b", "c", "x", "y"]
    assert res.stderr.decode() == (
        "created subscription fresh on orders (from earliest); it stays until: sluice sub delete orders fresh\n"
    )
    res = cli("consume", "orders", "--sub", "fresh", "--exit-at-end", bootstrap=b, timeout=60)
    assert ok(res) == "" and res.stderr == b""
    assert consume_sub(cli, b, "orders", "late", "--from", "latest") == []
    lines = consume_sub(cli, b, "orders", "json", "--json", "--max-messages", "2")
    assert len(lines) == 2 and all("value" in json.loads(ln) for ln in lines)

    out = ok(cli("sub", "delete", "orders", "billing", bootstrap=b))
    assert out == "deleted subscription billing of orders\n"
    assert json.loads(ok(cli("sub", "list", "orders", bootstrap=b))) == {"orders": ["audit", "fresh", "json", "late"]}


def test_backlog_counts_messages_only(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "orders", bootstrap=b))
    ok(cli("produce", "orders", bootstrap=b, input=lines_in("a", "b", "c")))
    ok(cli("sub", "create", "orders", "billing", bootstrap=b))
    ok(cli("sub", "create", "orders", "audit", bootstrap=b))
    assert [i["backlog"] for i in describe(cli, b, "orders", "billing")] == [3]


def test_consume_sub_max_messages_acks_only_what_it_printed(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "orders", bootstrap=b))
    ok(cli("produce", "orders", bootstrap=b, input=lines_in(*"abcdef")))
    out = ok(cli("consume", "orders", "--sub", "work", "--max-messages", "2", bootstrap=b))
    assert out.splitlines() == ["a", "b"]
    # the rest is handed back at exit: the next run gets it at once, not after an ack timeout
    assert consume_sub(cli, b, "orders", "work") == ["c", "d", "e", "f"]


def test_create_existing_and_if_not_exists(shared, cli):
    b = shared.bootstrap
    ok(cli("topic", "create", "exists-t", bootstrap=b))
    ok(cli("sub", "create", "exists-t", "s", bootstrap=b))
    assert_error(cli("sub", "create", "exists-t", "s", bootstrap=b),
                 "SUBSCRIPTION_ALREADY_EXISTS", "(37)", "'s' already exists")
    out = ok(cli("sub", "create", "exists-t", "s", "--if-not-exists", bootstrap=b))
    assert out == "subscription s on exists-t already exists\n"


def test_if_not_exists_says_which_settings_it_did_not_change(shared, cli):
    b = shared.bootstrap
    ok(cli("topic", "create", "keep.x", bootstrap=b))
    ok(cli("sub", "create", "keep.x", "y", bootstrap=b))
    out = ok(cli("sub", "create", "keep.x", "y", "--max-attempts", "2", "--if-not-exists", bootstrap=b))
    assert out.splitlines() == [
        "subscription y on keep.x already exists",
        "its settings were not changed: max_attempts 0 (asked 2)",
    ]
    assert {i["max_attempts"] for i in describe(cli, b, "keep.x", "y")} == {0}


@pytest.mark.parametrize("name", ["bad name", "x" * 101, "slash/y", "é"])
def test_bad_subscription_names(shared, cli, name):
    b = shared.bootstrap
    cli("topic", "create", "names-t", bootstrap=b)  # once for the module; "exists" afterwards
    for args in (["sub", "create", "names-t", name], ["sub", "describe", "names-t", name],
                 ["sub", "seek", "names-t", name, "earliest"], ["sub", "delete", "names-t", name],
                 ["consume", "names-t", "--sub", name, "--exit-at-end"]):
        assert_error(cli(*args, bootstrap=b), "INVALID_SUBSCRIPTION", "invalid subscription name")


@pytest.mark.parametrize("args", [
    ["sub", "create", "no-such-topic", "s"],
    ["sub", "list", "no-such-topic"],
    ["sub", "describe", "no-such-topic", "s"],
    ["sub", "seek", "no-such-topic", "s", "earliest"],
    ["sub", "delete", "no-such-topic", "s"],
    ["consume", "no-such-topic", "--sub", "s", "--exit-at-end"],
])
def test_unknown_topic(shared, cli, args):
    assert_error(cli(*args, bootstrap=shared.bootstrap), "UNKNOWN_TOPIC", "no-such-topic")


@pytest.mark.parametrize("args", [
    ["sub", "describe", "subless", "nope"],
    ["sub", "seek", "subless", "nope", "latest"],
    ["sub", "delete", "subless", "nope"],
])
def test_unknown_subscription(shared, cli, args):
    b = shared.bootstrap
    cli("topic", "create", "subless", bootstrap=b)  # once for the module
    assert_error(cli(*args, bootstrap=b), "UNKNOWN_SUBSCRIPTION", "(36)", "'nope'")


@pytest.mark.parametrize(("args", "needle"), [
    (["sub", "create", "opts-t", "s", "--mode", "fifo"], "fifo"),
    (["sub", "create", "opts-t", "s", "--max-attempts", "1001"], "1001"),
    (["sub", "create", "opts-t", "s", "--ack-timeout-ms", "0"], "0"),
    (["sub", "seek", "opts-t", "s", "yesterday-ish"], "yesterday-ish"),
    (["sub", "create", "opts-t", "s", "--backoff-ms", "5000", "--backoff-max-ms", "1000"], "above --backoff-max-ms"),
    (["consume", "opts-t", "--sub", "s", "--group", "g"], "--group"),
    (["consume", "opts-t", "--sub", "s", "--partition", "0"], "--partition"),
])
def test_bad_usage_exits_2(shared, cli, args, needle):
    res = cli(*args, bootstrap=shared.bootstrap)
    err = res.stderr.decode()
    assert res.returncode == 2, (res.returncode, err)
    assert "Traceback" not in err and needle in err, err


def test_redrive_unknown_subscription_and_nothing_dead_lettered_yet(shared, cli):
    b = shared.bootstrap
    ok(cli("topic", "create", "redrive-t", bootstrap=b))
    assert_error(cli("sub", "redrive", "redrive-t", "nosuchsub", bootstrap=b),
                 "UNKNOWN_SUBSCRIPTION", "(36)", "'nosuchsub'")
    ok(cli("sub", "create", "redrive-t", "billing", "--max-attempts", "3", bootstrap=b))
    out = ok(cli("sub", "redrive", "redrive-t", "billing", bootstrap=b))
    assert out == "re-drove 0 message(s) from redrive-t.billing.dlq into redrive-t\n"


def test_create_refuses_a_dead_letter_topic_name_over_the_limit(shared, cli):
    b = shared.bootstrap
    topic = "t" * 240  # + ".billing.dlq": 252 characters
    ok(cli("topic", "create", topic, bootstrap=b))
    assert_error(cli("sub", "create", topic, "billing", "--max-attempts", "3", bootstrap=b),
                 "INVALID_SUBSCRIPTION", "(38)", "dead-letter topic name would be 252 characters, too long")
    assert json.loads(ok(cli("sub", "list", topic, bootstrap=b))) == {topic: []}
    ok(cli("sub", "create", topic, "b", "--max-attempts", "3", bootstrap=b))  # 246: fits
    ok(cli("sub", "create", topic, "billing", bootstrap=b))  # never dead-letters: no such topic


def test_create_refuses_another_subscriptions_dead_letter_topic(shared, cli):
    b = shared.bootstrap
    ok(cli("topic", "create", "col", bootstrap=b))
    ok(cli("topic", "create", "col.x", bootstrap=b))
    ok(cli("sub", "create", "col", "x.y", "--max-attempts", "3", bootstrap=b))
    assert_error(cli("sub", "create", "col.x", "y", "--max-attempts", "3", bootstrap=b),
                 "INVALID_SUBSCRIPTION", "'col.x.y.dlq'", "subscription 'x.y' of topic 'col'")
    ok(cli("sub", "delete", "col", "x.y", bootstrap=b))
    ok(cli("sub", "create", "col.x", "y", "--max-attempts", "3", bootstrap=b))


def test_a_topic_with_subscriptions_is_not_made_compacted(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "orders", bootstrap=b))
    ok(cli("sub", "create", "orders", "billing", bootstrap=b))
    ok(cli("sub", "create", "orders", "audit", bootstrap=b))

    def refused():
        for extra in ([], ["--dry-run"]):
            assert_error(cli("topic", "alter", "orders", "--config", "cleanup.policy=compact", *extra, bootstrap=b),
                         "INVALID_CONFIG", "(9)", "has subscriptions (audit, billing)")

    refused()
    broker.kill()
    broker.start()  # nothing loaded: the subscriptions are read from the log to answer
    refused()
    assert json.loads(ok(cli("sub", "list", bootstrap=b))) == {"orders": ["audit", "billing"]}
    ok(cli("sub", "delete", "orders", "billing", bootstrap=b))
    ok(cli("sub", "delete", "orders", "audit", bootstrap=b))
    ok(cli("topic", "alter", "orders", "--config", "cleanup.policy=compact", bootstrap=b))


def test_a_compacted_topic_takes_no_subscription_and_is_skipped_by_list(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "orders", bootstrap=b))
    ok(cli("sub", "create", "orders", "billing", bootstrap=b))
    ok(cli("topic", "create", "o2", bootstrap=b))
    # altering looks for subscriptions first: o2's (none) are loaded, then it is compacted
    ok(cli("topic", "alter", "o2", "--config", "cleanup.policy=compact", bootstrap=b))
    ok(cli("topic", "create", "c", "--config", "cleanup.policy=compact", bootstrap=b))
    for topic in ("o2", "c"):
        assert_error(cli("sub", "create", topic, "y", bootstrap=b),
                     "INVALID_SUBSCRIPTION", "(38)", f"topic {topic!r} is compacted")
        assert_error(cli("consume", topic, "--sub", "y", "--exit-at-end", bootstrap=b),
                     "INVALID_SUBSCRIPTION", "(38)", f"topic {topic!r} is compacted")
        assert json.loads(ok(cli("sub", "list", topic, bootstrap=b))) == {topic: []}
    assert json.loads(ok(cli("sub", "list", bootstrap=b))) == {"orders": ["billing"]}


def test_a_subscription_stranded_on_a_compacted_topic_can_be_deleted(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "orders", bootstrap=b))
    ok(cli("produce", "orders", bootstrap=b, input=lines_in("a", "b")))
    ok(cli("sub", "create", "orders", "billing", bootstrap=b))
    broker.kill()
    broker.extra_args = ["--topic-default", "cleanup.policy=compact"]
    broker.start()  # every topic without a cleanup.policy of its own is compacted now
    assert json.loads(ok(cli("sub", "list", bootstrap=b))) == {}
    assert_error(cli("sub", "create", "orders", "audit", bootstrap=b),
                 "INVALID_SUBSCRIPTION", "(38)", "is compacted")
    assert_error(cli("sub", "seek", "orders", "billing", "earliest", bootstrap=b),
                 "INVALID_SUBSCRIPTION", "(38)", "is compacted")
    assert [i["backlog"] for i in describe(cli, b, "orders", "billing")] == [2]
    assert ok(cli("sub", "delete", "orders", "billing", bootstrap=b)) == "deleted subscription billing of orders\n"
    assert_error(cli("sub", "describe", "orders", "billing", bootstrap=b), "UNKNOWN_SUBSCRIPTION", "(36)")


def test_consume_from_an_existing_subscription_says_from_is_not_applied(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "fr", bootstrap=b))
    ok(cli("produce", "fr", bootstrap=b, input=lines_in("a", "b")))
    first = cli("consume", "fr", "--sub", "s", "--from", "latest", "--timeout-ms", "300", bootstrap=b)
    assert first.returncode == 0 and b"created subscription s on fr (from latest)" in first.stderr, first
    again = cli("consume", "fr", "--sub", "s", "--from", "earliest", "--timeout-ms", "300", bootstrap=b)
    assert again.returncode == 0 and again.stdout == b"", again  # its cursor, at the end: a and b not replayed
    assert b"warning: subscription s of fr exists: it goes on from its own cursor, not --from earliest" in again.stderr
    plain = cli("consume", "fr", "--sub", "s", "--timeout-ms", "300", bootstrap=b)
    assert plain.returncode == 0 and b"warning" not in plain.stderr, plain
