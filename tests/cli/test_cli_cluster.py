"""``sluice topic create --replication-factor``, ``topic describe``'s replication fields,
``sluice cluster status`` / ``rebalance`` and ``serve --advertise``, end to end against one
real broker process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sluice.harness import free_port

from .test_cli import assert_error, lines_in, ok

pytestmark = pytest.mark.timeout(120)


def status(cli, bootstrap: str, *args: str) -> tuple[int, dict]:
    res = cli("cluster", "status", *args, bootstrap=bootstrap)
    assert b"Traceback" not in res.stderr, res.stderr.decode(errors="replace")
    return res.returncode, json.loads(res.stdout)


def test_replicated_topic_on_one_broker(broker, cli):
    b = broker.bootstrap
    assert ok(cli("topic", "create", "r", "--partitions", "2", "--replication-factor", "1", bootstrap=b)) == (
        "created topic r with 2 partitions, 1 replica each\n"
    )
    ok(cli("produce", "r", "--partition", "1", bootstrap=b, input=lines_in("a", "b", "c")))
    desc = json.loads(ok(cli("topic", "describe", "r", "--json", bootstrap=b)))
    assert desc["replication_factor"] == 1
    p0, p1 = desc["partitions"]
    fields = {"partition", "leader", "replicas", "isr", "leader_epoch", "log_start_offset", "high_watermark",
              "log_end_offset", "size_bytes", "segments"}
    assert fields <= p0.keys() and fields <= p1.keys()
    assert (p0["leader"], p1["leader"], p1["high_watermark"]) == (0, 0, 3)

    code, shown = status(cli, b)  # piped: JSON
    assert code == 0
    assert shown == {"brokers": [{"node_id": 0, "address": b, "alive": True, "answers": True, "no_answer": ""}],
                     "controller": 0,
                     "under_replicated": [], "offline": [], "store_error": "", "healthy": True}
    assert status(cli, b, "--json") == (0, shown)


def test_describe_shows_the_single_broker_as_replica_and_the_log_end(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "d", "--replication-factor", "1", bootstrap=b))
    ok(cli("produce", "d", bootstrap=b, input=lines_in("a", "b")))
    [p] = json.loads(ok(cli("topic", "describe", "d", bootstrap=b)))["partitions"]
    assert (p["replicas"], p["isr"], p["log_end_offset"], p["high_watermark"]) == ([0], [0], 2, 2)


def test_bad_replication_factor_is_a_usage_error(broker, cli):
    for bad in ("0", "-1", "x"):
        res = cli("topic", "create", "bad", "--replication-factor", bad, bootstrap=broker.bootstrap)
        assert res.returncode == 2
        assert_error(res, "USAGE_ERROR", "--replication-factor")


def test_rebalance_on_one_broker_moves_nothing(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "e", "--partitions", "3", bootstrap=b))
    res = cli("cluster", "rebalance", bootstrap=b)
    assert res.returncode == 0, res.stderr
    nothing = {"moved": [], "failed": [], "replicas": {"replaced": [], "not_replaced": [], "moving": []}}
    assert json.loads(res.stdout) == nothing
    assert json.loads(ok(cli("cluster", "rebalance", "--topic", "e", "--json", bootstrap=b))) == nothing
    assert json.loads(ok(cli("cluster", "rebalance", "--leaders-only", "--json", bootstrap=b))) == nothing


@pytest.mark.parametrize("option", ["--advertise", "--advertised-address"])
def test_advertised_address_is_what_metadata_names(broker_factory, cli, option):
    b = broker_factory(extra_args=[option, "broker.example:7999"]).start()
    code, shown = status(cli, b.bootstrap)
    # the address clients are sent to does not answer from here: cluster status says so
    assert code == 6
    [listed] = shown["brokers"]
    assert (listed["node_id"], listed["address"], listed["alive"], listed["answers"]) == (
        0, "broker.example:7999", True, False)
    assert listed["no_answer"]


def test_advertise_is_documented_and_its_old_name_hidden(cli):
    flat = " ".join(ok(cli("serve", "--help", bootstrap="127.0.0.1:1")).split())
    assert "--advertise HOST[:PORT]" in flat and "--advertised-address" not in flat
    res = cli("serve", "--advertise", "a:1", "--advertised-address", "a:1", bootstrap="127.0.0.1:1")
    assert_error(res, "--advertise and --advertised-address cannot be used together")
    assert_error(cli("serve", "--advertise", "a:1,b:2", bootstrap="127.0.0.1:1"), "one HOST[:PORT]")
    assert_error(cli("serve", "--advertise", "a:b:c", bootstrap="127.0.0.1:1"), "--advertise: ", "neither host:port nor an IPv6")
    for bad in ("0.0.0.0", "bad host:7", "[::]:7"):
        assert_error(cli("serve", "--advertise", bad, bootstrap="127.0.0.1:1"), "no address a client can connect to")


def test_a_cluster_broker_listening_everywhere_must_say_where_it_is_reached(cli, tmp_path):
    """0.0.0.0 is no address another broker or a client can connect to."""
    for everywhere in ("0.0.0.0", "0"):
        res = cli("serve", "--data-dir", str(tmp_path), "--host", everywhere, "--port", str(free_port()),
                  "--cluster", "etcd://127.0.0.1:1", bootstrap="127.0.0.1:1")
        assert_error(res, "USAGE_ERROR", "needs --advertise HOST[:PORT]")


def test_bootstrap_list_from_option_and_environment(broker, cli):
    dead = f"127.0.0.1:{free_port()}"
    listed = f"{dead},{broker.bootstrap}"
    ok(cli("topic", "create", "l", bootstrap=listed))
    assert ok(cli("topic", "list", "-o", "plain", bootstrap=listed)) == "l\t1\n"
    env = {**os.environ, "SLUICE_BOOTSTRAP": listed}
    res = subprocess.run([sys.executable, "-m", "sluice.cli.main", "cluster", "status"],
                         env=env, capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["brokers"][0]["address"] == broker.bootstrap
    flat = " ".join(ok(cli("--help", bootstrap="127.0.0.1:1")).split())
    assert "HOST[:PORT] or a comma-separated list of them" in flat and "SLUICE_BOOTSTRAP" in flat
