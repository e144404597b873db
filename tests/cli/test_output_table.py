"""Tables on a terminal: headers wrap between words on a narrow one, never cut short."""

from __future__ import annotations

import pytest

from sluice.cli import output, topic

SUB_COLUMNS = ["partition", "confirmed", "end", "backlog", "in flight", "retrying", "dead-lettered", "expired",
               "consumers", "note"]
SUB_ROWS = [[0, 3, 3, 0, 0, 0, 0, 0, 0, ""], [1, 12345, 12355, 10, 0, 0, 0, 0, 2, "slow"]]


def shown(monkeypatch, capsys, width: int, columns: list[str], rows: list[list]) -> list[str]:
    monkeypatch.setattr(output, "is_tty", lambda: True)
    monkeypatch.setenv("COLUMNS", str(width))
    output.table("a title", columns, rows)
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("width", [80, 100, 120])
@pytest.mark.parametrize(("columns", "rows"), [
    (SUB_COLUMNS, SUB_ROWS),
    (topic.PARTITION_COLUMNS, [[0, 2, "2,3,1", "2,1", 5, 10, 40, 42, 4096, 2]]),
])
def test_a_narrow_terminal_wraps_headers_between_words_and_keeps_cells_whole(
    monkeypatch, capsys, width, columns, rows
):
    lines = shown(monkeypatch, capsys, width, columns, rows)
    text = "\n".join(lines)
    assert "…" not in text and max(map(len, lines)) <= width
    words = text.replace("-\n", "-").split()
    for piece in output._header_words(" ".join(columns)):
        assert piece in words or any(piece in w for w in words), piece  # whole: "dead-" then "lettered"
    if width > 80:  # at 80 the sub table's cells may wrap (its headers alone need 79)
        for row in rows:
            for cell in map(str, row):
                assert cell in words or not cell, cell


def test_a_wide_terminal_gets_a_boxed_table_with_one_line_headers(monkeypatch, capsys):
    lines = shown(monkeypatch, capsys, 200, SUB_COLUMNS, SUB_ROWS)
    header = next(line for line in lines if "partition" in line)
    assert header.startswith("┃") and all(c in header for c in SUB_COLUMNS)


def test_headers_wrap_between_words_or_after_a_hyphen():
    assert output._wrap_header("dead-lettered", 8) == "dead-\nlettered"
    assert output._wrap_header("dead-lettered", 13) == "dead-lettered"
    assert output._wrap_header("high watermark", 9) == "high\nwatermark"
    assert output._wrap_header("a b c", 3) == "a b\nc"


def test_piped_output_is_tab_separated_rows(monkeypatch, capsys):
    monkeypatch.setattr(output, "is_tty", lambda: False)
    output.table("a title", ["a", "b"], [[1, "x y"], [2, ""]])
    assert capsys.readouterr().out == "1\tx y\n2\t\n"


@pytest.mark.parametrize("width", [40, 76, 80, 100])
def test_long_cells_wrap_within_the_terminal(monkeypatch, capsys, width):
    columns = ["topic", "partition", "committed", "log start", "log end", "lag", "last commit", "client"]
    row = ["orders-east-europe-2024", 0, 123456, 0, 123460, 4, "2024-01-01T00:00:00.000Z",
           "consumer-1-a2b3c4d5@10.0.0.12:53422"]
    lines = shown(monkeypatch, capsys, width, columns, [row])
    assert max(map(len, lines)) <= width
    if width >= 76:  # the headers, short cells and times fit: nothing is cut, long cells wrap
        text = "\n".join(lines)
        assert "…" not in text and all(c.split()[-1] in text for c in columns)
        assert "2024-01-01T00:00:00.000Z" in text, text  # a time is never wrapped
    if width >= 100:  # boxed
        assert all(line.rstrip()[-1] in "┓┃┩│┘" for line in lines[1:] if line.strip()), text


@pytest.mark.parametrize("when", ["2026-11-29T07:14:21.123Z", "2026-11-29T07:14:21.123+00:00"])
def test_a_group_table_keeps_its_times_whole_at_100_columns(monkeypatch, capsys, when):
    columns = ["topic", "partition", "committed", "log start", "log end", "lag", "last commit", "client"]
    rows = [["orders", p, 1000 + p, 0, 1010 + p, 10, when, f"127.0.0.1:{40000 + p}"] for p in range(3)]
    text = "\n".join(shown(monkeypatch, capsys, 100, columns, rows))
    assert text.count(when) == 3, text


def test_times_in_tables_are_utc_with_z():
    assert output.iso_ms(1_764_400_461_123) == "2025-11-29T07:14:21.123Z"
    assert output.iso_ms(-1) == "-"
