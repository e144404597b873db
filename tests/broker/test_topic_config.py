"""Topic config values: numbers are plain ASCII decimal integers, as the broker stores and
shows them; nothing else that ``int()`` would take."""

from __future__ import annotations

import re

import pytest

from sluice.config import TopicConfig
from sluice.errors import InvalidConfig


@pytest.mark.parametrize(
    "value", ["1_000", "+77", "٣٣", "１２", " 1000", "1000\n", "1e3", "1.0", "0x10", "", "-", "--1", "- 1"],
)
def test_a_number_is_ascii_digits_only(value):
    with pytest.raises(InvalidConfig, match=re.escape(f"retention.ms must be an integer, got {value!r}")):
        TopicConfig.parse({"retention.ms": value})
    with pytest.raises(InvalidConfig, match="flush.messages must be an integer"):
        TopicConfig.parse({"flush.messages": value})


def test_plain_numbers_and_minus_one_where_negatives_are_allowed():
    parsed = TopicConfig.parse({"retention.ms": "-1", "retention.bytes": "-1", "flush.messages": "0",
                                "segment.bytes": "0001024", "max.message.bytes": 65536})
    assert (parsed.retention_ms, parsed.retention_bytes, parsed.flush_messages) == (-1, -1, 0)
    assert (parsed.segment_bytes, parsed.max_message_bytes) == (1024, 65536)
    with pytest.raises(InvalidConfig, match="flush.messages must be at least 0 and at most .*, got -1"):
        TopicConfig.parse({"flush.messages": "-1"})


def test_settings_stored_before_are_read_as_they_were():
    """A topic created when any int() spelling was taken keeps working (restarts, alters)."""
    stored = TopicConfig.parse({"retention.ms": "1_000", "flush.messages": "+7", "flush.ms": "٣٣"}, stored=True)
    assert (stored.retention_ms, stored.flush_messages, stored.flush_ms) == (1000, 7, 33)
    with pytest.raises(InvalidConfig, match="must be at least"):  # the ranges hold still
        TopicConfig.parse({"segment.bytes": "1_0"}, stored=True)
