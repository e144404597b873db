"""``sluice consume``'s output modes, byte for byte."""

from __future__ import annotations

import json

import pytest

from sluice.cli import output
from sluice.protocol.records import Record


def rec(value=b"v\xe9", key=b"k", headers=(("h", b"1"), ("n", None))):
    return Record("orders", 2, 41, 1795341600000, key, value, list(headers))


def fmt(**kw):
    opts = dict(as_json=False, raw=False, fmt=None, print_keys=False, delimiter=b"\n", key_separator=b"\t")
    opts.update(kw)
    return output.formatter(**opts)


def test_text_mode_escapes_bytes_that_are_not_utf8():
    assert fmt()(rec()) == b"v\\xe9\n"
    assert fmt(print_keys=True)(rec()) == b"k\tv\\xe9\n"
    assert fmt(print_keys=True)(rec(key=None)) == b"\tv\\xe9\n"


def test_raw_mode_is_byte_exact_with_any_delimiter():
    value = bytes(range(256))
    assert fmt(raw=True)(rec(value)) == value + b"\n"
    assert fmt(raw=True, delimiter=b"")(rec(value)) == value
    assert fmt(raw=True, print_keys=True, key_separator=b"\0", delimiter=b"\0")(rec(value)) == b"k\0" + value + b"\0"
    assert fmt(raw=True)(rec(None)) == b"\n"


def test_format_directives():
    render = output.template(b"%t|%p|%o|%k|%v|%s|%h|%T|%%\n")
    assert render(rec()) == b"orders|2|41|k|v\xe9|v\xe9|h=1,n=|1795341600000|%\n"
    assert output.template(b"plain")(rec()) == b"plain"
    assert output.template(b"%k\xff%v")(rec(key=None)) == b"\xffv\xe9"


@pytest.mark.parametrize("bad", [b"%x", b"%", b"%v%q"])
def test_unknown_directive(bad):
    with pytest.raises(ValueError, match="unknown directive"):
        output.template(bad)


def test_json_mode():
    obj = json.loads(fmt(as_json=True)(rec()))
    assert obj == {"topic": "orders", "partition": 2, "offset": 41, "timestamp": 1795341600000,
                   "key": "k", "value": "duk=", "value_encoding": "base64",
                   "headers": {"h": "1", "n": None}}
    repeated = rec(headers=[("a", b"1"), ("b", None), ("a", b"2"), ("a", None)])
    assert json.loads(fmt(as_json=True)(repeated))["headers"] == {"a": ["1", "2", None], "b": None}
