"""Command-line parameter parsing: refused input never reaches a broker."""

from __future__ import annotations

import click
import pytest

from sluice.cli.params import MAX_OFFSET, Start, StartPosition, header_pairs, key_values, unescape


@pytest.mark.parametrize(
    "spelled, start",
    [
        ("earliest", Start("earliest")),
        (" LATEST ", Start("latest")),
        ("0", Start("offset", 0)),
        (str(MAX_OFFSET), Start("offset", MAX_OFFSET)),
        ("1970-01-01T00:00:00", Start("time", 0)),
        ("2026-11-22T10:00:00", Start("time", 1795341600000)),  # no zone: UTC
        ("2026-11-22T11:00:00+01:00", Start("time", 1795341600000)),
        ("2026-11-22T10:00:00Z", Start("time", 1795341600000)),
    ],
)
def test_start_positions(spelled, start):
    assert StartPosition().convert(spelled, None, None) == start


@pytest.mark.parametrize(
    "bad, needle",
    [
        ("9999999999999999999999", "out of range"),
        (str(MAX_OFFSET + 1), "out of range"),
        ("-5", "out of range"),
        ("", "expected earliest"),
        ("   ", "expected earliest"),
        ("yesterday", "expected earliest"),
        ("\u00b2", "expected earliest"),  # a digit to str.isdigit, not to int()
        ("1969-12-31T23:59:59", "before 1970"),
    ],
)
def test_bad_start_positions_are_usage_errors(bad, needle):
    with pytest.raises(click.BadParameter, match=needle):
        StartPosition().convert(bad, None, None)


@pytest.mark.parametrize(
    "text, data",
    [("\\n", b"\n"), ("\\t", b"\t"), ("\\0", b"\0"), ("\\r\\n", b"\r\n"), ("\\\\", b"\\"),
     ("\\xe9\\xff", b"\xe9\xff"), ("é", "é".encode()), ("a|b", b"a|b"), ("", b"")],
)
def test_unescape(text, data):
    assert unescape(text) == data


@pytest.mark.parametrize("bad", ["\\q", "\\", "\\x4"])
def test_unescape_refuses_unknown_escapes(bad):
    with pytest.raises(ValueError, match="unknown escape"):
        unescape(bad)


def test_key_values_refuse_a_key_given_twice():
    assert key_values(("a=1", " b = 2 "), "--config") == {"a": "1", "b": "2"}
    with pytest.raises(click.BadParameter, match=r"a is given twice \('1', '2'\)"):
        key_values(("a=1", "a=2"), "--config")


def test_headers_keep_a_key_given_twice_and_refuse_the_sluice_namespace():
    assert header_pairs(("a=1", " b = 2 ", "a=3")) == [("a", b"1"), ("b", b"2"), ("a", b"3")]
    with pytest.raises(click.BadParameter, match="set by Sluice itself, not 'sluice.tag': give --tag"):
        header_pairs(("sluice.tag=vip",))
    with pytest.raises(click.BadParameter, match="not 'sluice.dlq.topic'"):
        header_pairs(("sluice.dlq.topic=x",))
    with pytest.raises(click.BadParameter, match="expected KEY=VALUE"):
        header_pairs((" =x",))
