"""``sluice produce``'s input splitting: messages as soon as they are complete."""

from __future__ import annotations

import os

import pytest

from sluice.cli.producing import key_separator_missing, read_available, split_messages


def test_each_chunk_yields_the_messages_it_completes():
    got = list(split_messages([b"a\nb", b"c\r\n", b"", b"d\n\ne"], b"\n"))
    assert got == [[b"a"], [b"bc\r"], [b"d", b""], [b"e"]]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 100])
def test_multibyte_delimiter_across_chunk_boundaries(size):
    data = b"one<>two<><>three<"
    chunks = [data[i : i + size] for i in range(0, len(data), size)]
    assert [m for ms in split_messages(chunks, b"<>") for m in ms] == [b"one", b"two", b"", b"three<"]


def test_whole_input_is_one_message_without_a_delimiter():
    assert list(split_messages([b"a\n", b"b\r\n"], None)) == [[b"a\nb\r\n"]]
    assert list(split_messages([], None)) == [[b""]]


def test_no_trailing_empty_message():
    assert list(split_messages([b"a\n"], b"\n")) == [[b"a"]]
    assert list(split_messages([], b"\n")) == []


def test_read_available_does_not_wait_for_a_full_buffer():
    r, w = os.pipe()
    try:
        os.write(w, b"line\n")
        chunks = read_available(r)
        assert next(chunks) == b"line\n"  # would block forever if it waited for 1 MiB
        os.close(w)
        w = None
        assert list(chunks) == []
    finally:
        os.close(r)
        if w is not None:
            os.close(w)


def test_a_message_without_its_key_separator_is_shown_with_single_escapes():
    """Bytes that are not UTF-8 and control characters read as one escape each, not as the
    doubled backslashes of a repr of the escaped text; long messages are cut."""
    err = key_separator_missing(b":", b"ab\x01\xff\xfecd\xc3\xa9")
    assert str(err) == "no key separator ':' in message 'ab\\x01\\xff\\xfecdé'"
    assert str(key_separator_missing(b"\t", b"x" * 50)) == f"no key separator '\\t' in message '{'x' * 40}…'"
    # the text \x01 and the byte 0x01 read apart: a backslash is doubled
    assert str(key_separator_missing(b":", b"a\\x01")) == "no key separator ':' in message 'a\\\\x01'"
