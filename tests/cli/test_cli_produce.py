"""``sluice produce``: input streamed as it comes, keys from the input, delayed messages,
tags (real broker processes)."""

from __future__ import annotations

import os
import pty
import subprocess

from .test_cli import assert_error, json_lines, ok, running, sluice_cmd, wait_for

# ---------------------------------------------------------------------- streaming input


def test_produce_sends_each_line_while_stdin_stays_open(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "live", bootstrap=b))
    from sluice.client import SyncConsumer

    with running(*sluice_cmd(b, "produce", "live"), stdin=subprocess.PIPE, stderr=subprocess.PIPE) as proc, \
            SyncConsumer(b, auto_offset_reset="earliest") as consumer:
        consumer.assign([("live", 0)])
        got: list[bytes] = []
        for line in (b"first", b"second"):
            proc.stdin.write(line + b"\n")
            proc.stdin.flush()
            wait_for(lambda line=line: got.extend(r.value for r in consumer.getmany(timeout_ms=200))
                     or line in got, what=f"{line!r} to arrive while stdin is open")
            assert proc.poll() is None  # still reading its input
        proc.stdin.close()
        assert proc.wait(15) == 0
        assert got == [b"first", b"second"]
        assert proc.stderr.read() == b""


def test_produce_on_a_terminal_says_where_each_message_went(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "tty", bootstrap=b))
    main_fd, tty_fd = pty.openpty()
    try:
        with running(*sluice_cmd(b, "produce", "tty"), stdin=tty_fd, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE) as proc:
            os.close(tty_fd)
            tty_fd = None
            for offset, line in enumerate([b"typed one\n", b"typed two\n"]):
                os.write(main_fd, line)
                assert proc.stderr.readline() == f"tty: partition 0, offset {offset}\n".encode()
            os.write(main_fd, b"\x04")  # Ctrl-D: end of input
            assert proc.wait(15) == 0
            assert proc.stdout.read() == b""
    finally:
        os.close(main_fd)
        if tty_fd is not None:
            os.close(tty_fd)
    out = ok(cli("consume", "tty", "--from", "earliest", "-e", bootstrap=b))
    assert out.splitlines() == ["typed one", "typed two"]


def test_large_piped_input_arrives_whole_and_in_order(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "big", "--config", "flush.messages=0", bootstrap=b))
    values = [b"%07d" % i + b"x" * (i % 300) for i in range(100_000)]
    ok(cli("produce", "big", bootstrap=b, input=b"\n".join(values) + b"\n"))
    res = cli("consume", "big", "--from", "earliest", "-e", "--raw", bootstrap=b)
    ok(res)
    assert res.stdout.split(b"\n")[:-1] == values


# ---------------------------------------------------------------------- keys, delays, tags


def test_produce_delayed_stores_the_good_messages_and_says_which_failed(broker, cli):
    b = broker.bootstrap
    ok(cli("topic", "create", "later", bootstrap=b))
    res = cli("produce", "later", "--key-separator", ":", "--delay-ms", "3000", bootstrap=b,
              input=b"a:1\nno separator\nb:2\n")
    line = assert_error(res, "(1 of 3 messages failed)")
    assert line.startswith("error: USAGE_ERROR (1002): no key separator ':' in message 'no separator'")
    assert res.returncode == 2  # bad input, as USAGE_ERROR always is
    assert ok(cli("consume", "later", "--from", "earliest", "-e", bootstrap=b)) == ""  # not due yet

    def both():  # one stored batch per key: each is delivered on its own, in either order
        recs = json_lines(ok(cli("consume", "later", "--from", "earliest", "-e", "--json", bootstrap=b)))
        return recs if len(recs) >= 2 else None

    recs = wait_for(both, 15, "both delayed messages")
    assert sorted((r["key"], r["value"]) for r in recs) == [("a", "1"), ("b", "2")]


def test_produce_delayed_splits_stored_batches_to_fit_max_message_bytes(broker, cli):
    """Stored batches of delayed messages fit the topic's max.message.bytes, however many
    messages that takes; a message too large on its own fails alone."""
    b = broker.bootstrap
    ok(cli("topic", "create", "small-later", "--config", "max.message.bytes=65536", bootstrap=b))
    values = [str(i).encode() for i in range(1, 20_001)]
    too_large = b"y" * 70_000
    res = cli("produce", "small-later", "--delay-ms", "1000", bootstrap=b,
              input=b"\n".join([*values[:5000], too_large, *values[5000:]]) + b"\n")
    line = assert_error(res, "(1 of 20001 messages failed)")
    assert line.startswith("error: MESSAGE_TOO_LARGE (10): batch of ")
    assert res.returncode == 1

    def all_of_them():
        out = ok(cli("consume", "small-later", "--from", "earliest", "-e", "--raw", bootstrap=b))
        got = out.encode().split(b"\n")[:-1]
        return got if len(got) >= len(values) else None

    got = wait_for(all_of_them, 20, "20000 delayed messages")
    assert sorted(got, key=int) == values


def test_produce_key_separator_file_and_short_header(broker, cli, tmp_path):
    b = broker.bootstrap
    ok(cli("topic", "create", "keys", bootstrap=b))
    (tmp_path / "input").write_bytes(b"alice:one:1\nbob:two\nno separator here\n")
    res = cli("produce", "keys", "--key-separator", ":", "--file", str(tmp_path / "input"), "-H", "src=file",
              bootstrap=b, input=b"ignored:stdin\n")
    line = assert_error(res, "1 of 3 messages failed", "no key separator")
    assert line.startswith("error: USAGE_ERROR (1002): no key separator ':' in message 'no separator here'")
    assert res.returncode == 2
    recs = json_lines(ok(cli("consume", "keys", "--from", "earliest", "-e", "--json", bootstrap=b)))
    assert [(r["key"], r["value"], r["headers"]) for r in recs] == [
        ("alice", "one:1", {"src": "file"}), ("bob", "two", {"src": "file"})]


def test_produce_refuses_a_tag_no_subscription_could_have(broker, cli):
    """As `sub create --tag ''` refuses it: 1-100 characters, said before anything is sent."""
    for bad in ("", "x" * 101):
        res = cli("produce", "never-made", "--tag", bad, bootstrap=broker.bootstrap, input=b"x\n")
        assert res.returncode == 2
        assert_error(res, "USAGE_ERROR", "'--tag': a tag has 1-100 characters")
