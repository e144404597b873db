"""What a person at a shell meets first: Ctrl-C, pipes that close early, where a bare
``consume`` starts, ``-h``, short options, ``--bootstrap`` after the command, bad numbers,
and one output contract (a table on a terminal, JSON when piped, ``--output``) — against
real broker processes."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess

import pytest

from .test_cli import (
    assert_usage_error,
    committed,
    json_lines,
    lines_in,
    ok,
    running,
    sluice_cmd,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)


def env() -> dict:
    return {**os.environ, "COLUMNS": "120"}


# ---------------------------------------------------------------------- Ctrl-C, closed pipes


def test_ctrl_c_in_produce_says_how_many_were_sent_and_acknowledged(broker, cli):
    from sluice.client import SyncAdmin

    b = broker.bootstrap
    ok(cli("topic", "create", "intr", bootstrap=b))
    with running(*sluice_cmd(b, "produce", "intr"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE) as proc, SyncAdmin(b) as admin:
        proc.stdin.write(lines_in(*(f"m{i}" for i in range(5))))
        proc.stdin.flush()
        wait_for(lambda: admin.list_offsets("intr", [0])[0] == 5, what="5 messages stored")
        proc.send_signal(signal.SIGINT)  # stdin still open: produce is waiting for more
        assert proc.wait(30) == 130
        err = proc.stderr.read().decode()
    assert err.strip() == "interrupted: 5 messages sent, 5 acknowledged", err
    assert "Traceback" not in err


def closed_pipe() -> int:
    """The write end of a pipe whose reader is gone: every write fails with EPIPE."""
    r, w = os.pipe()
    os.close(r)
    return w


@pytest.mark.parametrize("args", [("topic", "list"), ("topic", "list", "-o", "plain"), ("topic", "describe", "p0"),
                                  ("consume", "p0", "--from", "earliest", "-e"), ("--help",)])
def test_a_reader_that_left_is_not_an_error(broker, cli, args):
    """`sluice topic list | head -1`: no error line, exit status 0."""
    b = broker.bootstrap
    ok(cli("topic", "create", "p0", bootstrap=b))
    ok(cli("produce", "p0", bootstrap=b, input=lines_in("a", "b")))
    w = closed_pipe()
    try:
        res = subprocess.run(sluice_cmd(b, *args), stdout=w, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(w)
    assert (res.returncode, res.stderr) == (0, b""), res.stderr.decode()


def test_consume_group_into_a_pipe_commits_what_the_reader_took(broker, cli):
    """`consume --group G | head -1`: the group's offset stays near what head read (one
    block), not at what the pipe's buffer held."""
    b = broker.bootstrap
    ok(cli("topic", "create", "piped", bootstrap=b))
    ok(cli("produce", "piped", bootstrap=b, input=lines_in(*(f"{i:05d}" for i in range(10_000)))))  # 60,000 bytes
    shell = " ".join(sluice_cmd(b, "consume", "piped", "--group", "G", "--from", "earliest", "-e")) + " | head -1"
    res = subprocess.run(["bash", "-c", shell], capture_output=True, timeout=60)
    assert (res.returncode, res.stdout, res.stderr) == (0, b"00000\n", b""), res.stderr.decode()
    [offset] = committed(b, "G", "piped", 1)
    assert offset is not None and 1 <= offset <= 4096 // 6 * 4, offset  # head reads a few KiB at most
    # the next run of the group starts where the reader stopped taking
    out = ok(cli("consume", "piped", "--group", "G", "-n", "1", bootstrap=b))
    assert out == f"{offset:05d}\n"


def test_consume_group_into_a_slow_pipe_commits_everything_once_read(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "slow", bootstrap=b))
    ok(cli("produce", "slow", bootstrap=b, input=lines_in(*(f"{i:05d}" for i in range(3000)))))
    shell = " ".join(sluice_cmd(b, "consume", "slow", "--group", "S", "--from", "earliest", "-e")) + " | (sleep 1; wc -l)"
    res = subprocess.run(["bash", "-c", shell], capture_output=True, timeout=60)
    assert (res.returncode, res.stdout.strip(), res.stderr) == (0, b"3000", b""), res.stderr.decode()
    assert committed(b, "S", "slow", 1) == [3000]


# ---------------------------------------------------------------------- where a bare consume starts


@pytest.mark.parametrize(("args", "said"), [
    ((), "reading hint from its end: new messages only (--from earliest"),
    (("-g", "g1"), "reading hint from group g1's committed offsets (earliest where it has none"),
])
def test_a_bare_consume_on_a_terminal_says_where_it_starts(broker, cli, args, said):
    b = broker.bootstrap
    ok(cli("topic", "create", "hint", bootstrap=b))
    main_fd, tty_fd = pty.openpty()
    try:
        with running(*sluice_cmd(b, "consume", "hint", *args), stdout=subprocess.PIPE, stderr=tty_fd) as proc:
            os.close(tty_fd)
            tty_fd = None
            seen = b""
            while said.encode() not in seen:
                chunk = os.read(main_fd, 4096)
                assert chunk, seen
                seen += chunk
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 130
    finally:
        os.close(main_fd)
        if tty_fd is not None:
            os.close(tty_fd)


def test_a_consume_with_from_or_piped_stderr_says_nothing(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "quiet", bootstrap=b))
    ok(cli("produce", "quiet", bootstrap=b, input=lines_in("x")))
    res = cli("consume", "quiet", "--from", "earliest", "-e", bootstrap=b)
    assert (ok(res), res.stderr) == ("x\n", b"")


# ---------------------------------------------------------------------- -h, short options, --bootstrap after


def test_short_options_and_bootstrap_after_the_command(broker, cli):
    b = broker.bootstrap
    wrong = "127.0.0.1:1"  # given before the command: the one after wins
    ok(cli("topic", "create", "short", "-p", "3", "-r", "1", "-b", b, bootstrap=wrong))
    ok(cli("produce", "short", "-p", "2", "-k", "K", "--bootstrap", b, bootstrap=wrong, input=lines_in("v")))
    recs = json_lines(ok(cli("consume", "short", "-p", "2", "--from", "earliest", "-n", "1", "--json", "-b", b,
                             bootstrap=wrong)))
    assert [(r["partition"], r["key"], r["value"]) for r in recs] == [(2, "K", "v")]
    ok(cli("consume", "short", "-g", "gs", "-p", "2", "-n", "1", "-b", b, bootstrap=wrong))
    assert committed(b, "gs", "short", 3)[2] == 1
    listing = json.loads(ok(cli("group", "list", "-o", "json", "-b", b, bootstrap=wrong)))
    assert [g["name"] for g in listing] == ["gs"]


@pytest.mark.parametrize("n", ["-1", "0", "10001", "99999999999", "many"])
def test_a_bad_partition_count_is_a_usage_error(shared_broker, cli, n):
    b = shared_broker.bootstrap
    assert_usage_error(cli("topic", "create", "bad-count", "--partitions", n, bootstrap=b), "--partitions")
    assert "bad-count" not in ok(cli("topic", "list", "-o", "plain", bootstrap=b))


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory):
    from sluice.harness import BrokerProcess

    d = tmp_path_factory.mktemp("conventions")
    b = BrokerProcess(d / "data", d / "broker.log").start()
    yield b
    b.kill()


def test_a_bad_topic_name_from_the_broker_exits_2(shared_broker, cli):
    res = cli("topic", "create", "bad/name", bootstrap=shared_broker.bootstrap)
    assert res.returncode == 2 and res.stderr.startswith(b"error: INVALID_TOPIC_NAME"), res.stderr


# ---------------------------------------------------------------------- one output contract


def test_piped_data_is_json_plain_is_rows_and_table_is_a_table(shared_broker, cli):
    b = shared_broker.bootstrap
    ok(cli("topic", "create", "shape", "-p", "2", bootstrap=b))
    piped = json.loads(ok(cli("topic", "list", bootstrap=b)))
    assert {"name": "shape", "partitions": 2} in piped
    assert json.loads(ok(cli("topic", "list", "--json", bootstrap=b))) == piped
    assert "shape\t2" in ok(cli("topic", "list", "-o", "plain", bootstrap=b)).splitlines()
    table = subprocess.run(sluice_cmd(b, "topic", "list", "--output", "table"), capture_output=True, env=env(),
                           timeout=60)
    assert "Topics" in ok(table) and "┃ topic" in ok(table)
    res = cli("topic", "list", "--json", "-o", "plain", bootstrap=b)
    assert_usage_error(res, "--json and --output plain")


def test_a_table_on_a_terminal(shared_broker, cli):
    b = shared_broker.bootstrap
    ok(cli("topic", "create", "tty-table", bootstrap=b))
    main_fd, tty_fd = pty.openpty()
    try:
        with running(*sluice_cmd(b, "topic", "list"), stdout=tty_fd, stderr=subprocess.PIPE, env=env()) as proc:
            os.close(tty_fd)
            tty_fd = None
            seen = b""
            while b"tty-table" not in seen:
                chunk = os.read(main_fd, 4096)
                assert chunk, seen
                seen += chunk
            assert proc.wait(30) == 0
    finally:
        os.close(main_fd)
        if tty_fd is not None:
            os.close(tty_fd)
    assert b"Topics" in seen and b"partitions" in seen


DATA_COMMANDS = [
    ("topic", "list"), ("topic", "describe", "contract"), ("group", "list"), ("group", "describe", "cg"),
    ("group", "reset-offsets", "cg", "--topic", "contract", "--to-earliest", "--dry-run"),
    ("sub", "list"), ("sub", "describe", "contract", "s1"), ("txn", "list"), ("txn", "list", "--delayed"),
    ("cluster", "status"), ("cluster", "rebalance"),
]


@pytest.mark.parametrize("args", DATA_COMMANDS, ids=" ".join)
def test_every_data_command_prints_the_same_json_piped_and_with_json(shared_broker, cli, args):
    b = shared_broker.bootstrap
    if "contract" not in ok(cli("topic", "list", "-o", "plain", bootstrap=b)):
        ok(cli("topic", "create", "contract", bootstrap=b))
        ok(cli("produce", "contract", bootstrap=b, input=lines_in("a")))
        ok(cli("consume", "contract", "-g", "cg", "-n", "1", bootstrap=b))
        ok(cli("sub", "create", "contract", "s1", bootstrap=b))
    piped = ok(cli(*args, bootstrap=b))
    assert json.loads(piped) is not None
    for flag in (("--json",), ("-o", "json"), ("--output", "json")):
        assert json.loads(ok(cli(*args, *flag, bootstrap=b))).__class__ is json.loads(piped).__class__
    plain = ok(cli(*args, "-o", "plain", bootstrap=b))
    assert not plain.lstrip().startswith(("{", "[")), plain


def test_consume_group_into_a_pipe_read_only_after_exit_does_not_hang(broker, cli):
    """A caller that waits for the command before reading its (small) output: the group
    commits what was taken, nothing, and the command still ends."""
    b = broker.bootstrap
    ok(cli("topic", "create", "late", bootstrap=b))
    ok(cli("produce", "late", bootstrap=b, input=lines_in("a", "b")))
    with running(*sluice_cmd(b, "consume", "late", "-g", "L", "--from", "earliest", "-e"),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.wait(40) == 0
        assert proc.stdout.read() == b"a\nb\n"
    assert committed(b, "L", "late", 1) in ([0], [None])  # nothing was taken before the end


@pytest.mark.parametrize("keyed", [False, True])
def test_ctrl_c_during_a_hand_over_is_raised_once_the_tally_holds_the_futures(broker, keyed):
    """A Ctrl-C landing while ``sluice produce`` hands messages to the producer (the bulk
    call, or the one-by-one hop of keyed messages) waits for that hand-over to return: the
    messages it buffered are then tallied as acknowledged when the producer closes, never
    lost to the tally (the signal is sent by the call itself, at its worst moment)."""
    from sluice.cli.producing import HeldInterrupts, Sender
    from sluice.client import SyncAdmin, SyncProducer

    with SyncAdmin(broker.bootstrap) as admin:
        admin.create_topic("held", partitions=1)
    interrupts = HeldInterrupts().install()
    try:
        with pytest.raises(KeyboardInterrupt), SyncProducer(broker.bootstrap) as producer:
            real = producer.send_each if keyed else producer.send_many

            def interrupted_hand_over(*args, **kw):
                result = real(*args, **kw)  # the messages are buffered now
                os.kill(os.getpid(), signal.SIGINT)
                return result

            if keyed:
                producer.send_each = interrupted_hand_over
            else:
                producer.send_many = interrupted_hand_over
            sender = Sender(producer, "held", key=b"k" if keyed else None, headers=None, partition=None,
                            report=None, interrupts=interrupts)
            sender.send([b"m%d" % i for i in range(5)], [b"k"] * 5 if keyed else None)
            pytest.fail("Ctrl-C was not raised after the hand-over")
    finally:
        interrupts.uninstall()
    assert (sender.sent, sender.acked, sender.failed) == (5, 5, 0)
