"""The pure part of the Spark connector: option parsing and offset arithmetic.

No Spark session and no broker: ``ReadOptions`` / ``WriteOptions`` parsing, capping a
micro-batch (``limit_offsets``), cutting ranges for ``minPartitions`` (``split_ranges``) and
the checkpoint form of offsets (``to_json`` / ``from_json``).
"""

from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sluice.errors import ConfigError
from sluice.spark import planning
from sluice.spark.options import EARLIEST, LATEST, ReadOptions, WriteOptions
from sluice.spark.reading import OffsetRange

B = {"bootstrap": "127.0.0.1:9"}


def read(**opts: str) -> ReadOptions:
    return ReadOptions.parse({**B, **opts})


def config_error(options: dict, *fragments: str, parse=ReadOptions.parse) -> str:
    with pytest.raises(ConfigError) as info:
        parse(options)
    text = str(info.value)
    for fragment in fragments:
        assert fragment in text, (fragment, text)
    return text


# ---------------------------------------------------------------------- ReadOptions


def test_read_defaults():
    o = read(topic="t")
    assert o == ReadOptions(bootstrap="127.0.0.1:9", topics=("t",))
    assert o.starting is None and o.ending == "latest"
    assert o.max_offsets_per_trigger is None and o.min_partitions is None
    assert o.include_headers is False and o.fail_on_data_loss is True
    assert pickle.loads(pickle.dumps(o)) == o


@pytest.mark.parametrize(
    "chosen",
    [
        {},
        {"topic": "a", "topics": "a,b"},
        {"topic": "a", "topicPattern": "a.*"},
        {"topics": "a", "topicPattern": "a.*"},
        {"topic": "a", "topics": "b", "topicPattern": "c"},
    ],
)
def test_exactly_one_of_topic_topics_pattern(chosen):
    config_error({**B, **chosen}, "exactly one of", "topic", "topics", "topicPattern")


def test_topics_split_stripped_and_deduplicated():
    assert read(topics=" a, b ,a,c ").topics == ("a", "b", "c")
    assert read(topic=" a ").topics == ("a",)
    # ``topic`` is one name: a comma in it is not a separator
    assert read(topic="a,b").topics == ("a,b",)


@pytest.mark.parametrize("raw", ["a,,b", "a, ", " ", ""])
def test_empty_topic_names(raw):
    config_error({**B, "topics": raw}, "empty topic name")


def test_topic_pattern():
    o = read(topicPattern="ev-[0-9]+")
    assert o.pattern == "ev-[0-9]+" and o.topics == ()
    assert o.matches("ev-1") and o.matches("ev-42")
    # the pattern must match the whole name
    assert not o.matches("ev-1x") and not o.matches("xev-1") and not o.matches("ev-")
    fixed = read(topics="a,b")
    assert fixed.matches("a") and fixed.matches("b") and not fixed.matches("ab")


def test_bad_topic_pattern():
    config_error({**B, "topicPattern": "ev-[0-9"}, "topicPattern", "regular expression")


@pytest.mark.parametrize("bootstrap", [None, "", "   "])
def test_bootstrap_required(bootstrap):
    opts = {"topic": "t"} if bootstrap is None else {"topic": "t", "bootstrap": bootstrap}
    config_error(opts, "bootstrap", "required")


def test_unknown_options_are_named():
    text = config_error({**B, "topic": "t", "startingOffset": "earliest", "zzz": "1"}, "unknown")
    assert "startingoffset" in text and "zzz" in text and "'sluice'" in text


def test_options_spark_adds_are_accepted():
    o = read(topic="t", path="/x", checkpointLocation="/cp", queryName="q")
    assert o.topics == ("t",)


def test_keys_are_case_insensitive():
    o = ReadOptions.parse(
        {
            "BOOTSTRAP": "h:1",
            "TOPICPATTERN": "x.*",
            "STARTINGOFFSETS": "Earliest",
            "endingoffsets": '{"xa": {"0": 7}}',
            "MaxOffsetsPerTrigger": "10",
            "minpartitions": "3",
            "IncludeHeaders": "TRUE",
            "FAILONDATALOSS": "False",
        }
    )
    assert o == ReadOptions(
        bootstrap="h:1",
        pattern="x.*",
        starting="earliest",
        ending={"xa": {0: 7}},
        max_offsets_per_trigger=10,
        min_partitions=3,
        include_headers=True,
        fail_on_data_loss=False,
    )


def test_none_values_are_dropped():
    o = ReadOptions.parse({**B, "topic": "t", "includeHeaders": None, "zzz": None})
    assert o.include_headers is False


def test_offsets_words_and_json():
    assert read(topic="t", startingOffsets="earliest").starting == "earliest"
    assert read(topic="t", startingOffsets=" LATEST ").starting == "latest"
    assert read(topic="t", endingOffsets="latest").ending == "latest"
    spec = '{"a": {"0": 5, "1": -2, "2": -1}, "b": {"3": 0}}'
    assert read(topic="a", startingOffsets=spec).starting == {
        "a": {0: 5, 1: EARLIEST, 2: LATEST},
        "b": {3: 0},
    }
    assert read(topic="a", endingOffsets='{"a": {"0": 5, "1": -1}}').ending == {
        "a": {0: 5, 1: LATEST}
    }


@pytest.mark.parametrize(
    ("name", "raw", "fragment"),
    [
        ("startingOffsets", "earliset", "must be earliest, latest or JSON"),
        ("startingOffsets", "{bad json", "must be earliest, latest or JSON"),
        ("startingOffsets", "[1, 2]", "JSON must look like"),
        ("startingOffsets", '{"t": 5}', "JSON must look like"),
        ("startingOffsets", "5", "JSON must look like"),
        ("startingOffsets", '{"t": {"zero": 5}}', "is not a number"),
        ("startingOffsets", '{"t": {"0": -3}}', "bad offset"),
        ("startingOffsets", '{"t": {"0": "5"}}', "bad offset"),
        ("startingOffsets", '{"t": {"0": 1.5}}', "bad offset"),
        ("startingOffsets", '{"t": {"0": true}}', "bad offset"),
        ("endingOffsets", "earliest", "must be latest or JSON"),
        ("endingOffsets", '{"t": {"0": -2}}', "bad offset"),
        ("endingOffsets", "{", "must be latest or JSON"),
    ],
)
def test_bad_offsets(name, raw, fragment):
    config_error({**B, "topic": "t", name: raw}, name, fragment)


def test_timestamps_win_over_offsets():
    o = read(
        topic="t",
        startingOffsets="earliest",
        endingOffsets="latest",
        startingTimestamp="1000",
        endingTimestamp="2000",
    )
    assert o.starting == 1000 and o.ending == 2000
    assert read(topic="t", startingTimestamp="0").starting == 0


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("startingTimestamp", "-1"),
        ("startingTimestamp", "soon"),
        ("endingTimestamp", "1.5"),
        ("maxOffsetsPerTrigger", "0"),
        ("maxOffsetsPerTrigger", "-5"),
        ("maxOffsetsPerTrigger", "ten"),
        ("minPartitions", "0"),
        ("minPartitions", "2x"),
    ],
)
def test_bad_numbers(name, raw):
    config_error({**B, "topic": "t", name: raw}, name, raw)


@pytest.mark.parametrize("name", ["includeHeaders", "failOnDataLoss"])
@pytest.mark.parametrize("raw", ["yes", "1", "", "tru", "on"])
def test_bad_booleans(name, raw):
    config_error({**B, "topic": "t", name: raw}, name, "true or false")


@pytest.mark.parametrize(("raw", "value"), [("true", True), ("TRUE", True), ("False", False)])
def test_booleans(raw, value):
    o = read(topic="t", includeHeaders=raw, failOnDataLoss=raw)
    assert o.include_headers is value and o.fail_on_data_loss is value


# ---------------------------------------------------------------------- WriteOptions


def test_write_defaults_and_producer_config():
    o = WriteOptions.parse({"bootstrap": "h:1"})
    assert o == WriteOptions(bootstrap="h:1")
    assert o.topic is None
    assert o.producer_config() == {
        "acks": "all",
        "compression": "none",
        "linger_ms": 5,
        "batch_size": 262144,
    }
    assert pickle.loads(pickle.dumps(o)) == o


def test_write_options_case_insensitive():
    o = WriteOptions.parse(
        {
            "Bootstrap": "h:1",
            "TOPIC": " out ",
            "acks": "leader",
            "Compression": "zstd",
            "LINGERMS": "0",
            "batchSize": "1024",
            "checkpointLocation": "/cp",
            "path": "/p",
        }
    )
    assert o == WriteOptions("h:1", "out", "leader", "zstd", 0, 1024)
    assert o.producer_config() == {
        "acks": "leader",
        "compression": "zstd",
        "linger_ms": 0,
        "batch_size": 1024,
    }


@pytest.mark.parametrize(
    ("opts", "fragments"),
    [
        ({}, ("bootstrap", "required")),
        ({"bootstrap": " "}, ("bootstrap", "required")),
        ({"bootstrap": "h:1", "topic": "  "}, ("topic", "empty")),
        ({"bootstrap": "h:1", "lingerMs": "-1"}, ("lingerMs", ">= 0")),
        ({"bootstrap": "h:1", "lingerMs": "x"}, ("lingerMs", "integer")),
        ({"bootstrap": "h:1", "batchSize": "0"}, ("batchSize", ">= 1")),
        ({"bootstrap": "h:1", "acks": "1"}, ("acks", "one of")),
        ({"bootstrap": "h:1", "compression": "brotli"}, ("compression", "one of")),
        ({"bootstrap": "h:1", "startingOffsets": "earliest"}, ("unknown", "startingoffsets")),
        ({"bootstrap": "h:1", "topics": "a,b"}, ("unknown", "topics")),
    ],
)
def test_bad_write_options(opts, fragments):
    config_error(opts, *fragments, parse=WriteOptions.parse)


# ---------------------------------------------------------------------- limit_offsets

TPS = st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 3))


@st.composite
def start_and_latest(draw):
    """``(start, latest)``: ``latest >= start`` per partition; some partitions (new ones)
    may be missing from ``start`` and then wait from 0."""
    tps = draw(st.lists(TPS, min_size=1, max_size=8, unique=True))
    start, latest = {}, {}
    for tp in tps:
        begin = draw(st.integers(0, 10_000))
        latest[tp] = begin + draw(st.one_of(st.just(0), st.integers(0, 50), st.integers(0, 5000)))
        if draw(st.booleans()) or begin:
            start[tp] = begin
    return start, latest


@settings(max_examples=400, deadline=None)
@given(start_and_latest(), st.integers(1, 6000))
@example(({("a", 0): 0, ("a", 1): 0}, {("a", 0): 1, ("a", 1): 1}), 1)
@example(({("a", 0): 5}, {("a", 0): 5, ("a", 1): 3}), 2)
@example(({("a", 0): 0, ("a", 1): 0, ("a", 2): 0}, {("a", 0): 1, ("a", 1): 1, ("a", 2): 1}), 2)
@example(({}, {("a", 0): 1, ("a", 1): 1, ("a", 2): 4}), 3)
def test_limit_offsets_properties(sl, max_rows):
    start, latest = sl
    end = planning.limit_offsets(start, latest, max_rows)
    assert set(end) == set(latest)
    waiting = {tp: latest[tp] - start.get(tp, 0) for tp in latest}
    total = sum(waiting.values())
    # reads exactly min(max_rows, waiting)
    taken = {tp: end[tp] - start.get(tp, 0) for tp in latest}
    assert sum(taken.values()) == min(max_rows, total)
    for tp in latest:
        # never backwards, never beyond latest
        assert 0 <= taken[tp] <= waiting[tp], tp
        if waiting[tp] == 0:
            assert end[tp] == latest[tp] == start.get(tp, 0)
        # shared in proportion to what waits: at most one record off the exact share
        # (the records left over after rounding down go one each to the partitions with
        # the most still waiting, not by largest remainder: 1, 1, 4 waiting and a cap of
        # 3 read 0, 0, 3)
        if total > max_rows:
            share = waiting[tp] * max_rows / total
            assert abs(taken[tp] - share) <= 1, (tp, taken[tp], share)
    if total <= max_rows:
        assert end == latest


def test_limit_offsets_examples():
    start = {("t", 0): 100, ("t", 1): 0, ("t", 2): 50}
    latest = {("t", 0): 400, ("t", 1): 100, ("t", 2): 50}
    # 300 + 100 waiting, 40 allowed: 30 and 10; the idle partition stays where it is
    assert planning.limit_offsets(start, latest, 40) == {("t", 0): 130, ("t", 1): 10, ("t", 2): 50}
    assert planning.limit_offsets(start, latest, 400) == latest
    assert planning.limit_offsets(start, latest, 10_000) == latest
    # a new partition (not in start) waits from offset 0
    assert planning.limit_offsets({}, {("n", 0): 10, ("n", 1): 30}, 8) == {("n", 0): 2, ("n", 1): 6}
    # the input maps are not modified
    assert start == {("t", 0): 100, ("t", 1): 0, ("t", 2): 50}


# ---------------------------------------------------------------------- split_ranges / ranges

OPTS = ReadOptions(bootstrap="h:1", topics=("a", "b", "c"))


@st.composite
def offset_ranges(draw):
    tps = draw(st.lists(TPS, min_size=0, max_size=6, unique=True))
    out = []
    for t, p in tps:
        start = draw(st.integers(0, 1000))
        size = draw(st.one_of(st.integers(1, 5), st.integers(1, 300)))
        out.append(OffsetRange(t, p, start, start + size, OPTS))
    return out


def offsets_of(rngs):
    return sorted((r.topic, r.partition, o) for r in rngs for o in range(r.start, r.end))


@settings(max_examples=400, deadline=None)
@given(offset_ranges(), st.one_of(st.none(), st.integers(1, 64)))
@example([OffsetRange("a", 0, 0, 5, OPTS)], 4)
@example([OffsetRange("a", 0, 0, 10, OPTS)], 4)
@example([OffsetRange("a", 0, 0, 3, OPTS), OffsetRange("b", 0, 0, 1, OPTS)], 4)
def test_split_ranges_properties(rngs, min_partitions):
    out = planning.split_ranges(rngs, min_partitions)
    # exactly the same offsets, each once
    assert offsets_of(out) == offsets_of(rngs)
    # no empty piece, same read options
    assert all(r.start < r.end and r.options is OPTS for r in out)
    # the pieces of one partition are contiguous and in order
    for orig in rngs:
        pieces = [r for r in out if (r.topic, r.partition) == (orig.topic, orig.partition)]
        assert pieces[0].start == orig.start and pieces[-1].end == orig.end
        assert all(a.end == b.start for a, b in zip(pieces, pieces[1:], strict=False))
    total = sum(r.size for r in rngs)
    if not min_partitions or len(rngs) >= min_partitions:
        assert out == rngs  # nothing to split
    elif total >= min_partitions:
        assert len(out) >= min_partitions, (total, min_partitions, [r.size for r in out])
    else:
        assert len(out) == total  # one record per piece is as far as it goes
    if min_partitions and len(rngs) < min_partitions and total:
        # cut into near-equal pieces: none longer than total / min_partitions, rounded up
        target = -(-total // min_partitions)
        assert all(r.size <= target for r in out), (target, [r.size for r in out])


def test_split_ranges_example():
    rngs = [OffsetRange("a", 0, 10, 20, OPTS), OffsetRange("a", 1, 0, 2, OPTS)]
    out = planning.split_ranges(rngs, 4)
    # 12 offsets in 4 pieces: none longer than 3
    assert [(r.partition, r.start, r.end) for r in out] == [
        (0, 10, 13),
        (0, 13, 16),
        (0, 16, 18),
        (0, 18, 20),
        (1, 0, 2),
    ]
    assert planning.split_ranges(rngs, None) == rngs
    assert planning.split_ranges(rngs, 2) == rngs
    assert planning.split_ranges([], 4) == []


def test_ranges_skips_empty_and_unknown_partitions():
    opts = ReadOptions(bootstrap="h:1", topics=("a",), min_partitions=None)
    start = {("a", 0): 5, ("a", 1): 7, ("a", 2): 0, ("a", 3): 9}
    end = {("a", 0): 8, ("a", 1): 7, ("a", 2): 4, ("a", 4): 3, ("a", 3): 2}
    got = planning.ranges(start, end, opts)
    # (a,1) is empty, (a,3) would go backwards, (a,4) has no start: none gives a range
    assert [(r.topic, r.partition, r.start, r.end) for r in got] == [("a", 0, 5, 8), ("a", 2, 0, 4)]
    assert all(r.options is opts for r in got)
    split = planning.ranges(
        start, end, ReadOptions(bootstrap="h:1", topics=("a",), min_partitions=7)
    )
    assert offsets_of(split) == offsets_of(got) and len(split) == 7


# ---------------------------------------------------------------------- checkpoint JSON


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.tuples(st.text(min_size=1, max_size=8), st.integers(0, 1000)),
        st.integers(0, 2**62),
        max_size=10,
    )
)
def test_json_round_trip(offsets):
    doc = planning.to_json(offsets)
    # what Spark keeps in the checkpoint is plain JSON with string partition keys
    assert json.loads(json.dumps(doc)) == doc
    assert all(isinstance(p, str) for parts in doc.values() for p in parts)
    assert planning.from_json(json.loads(json.dumps(doc))) == offsets


def test_json_form():
    assert planning.to_json({("b", 1): 7, ("a", 10): 3, ("a", 2): 0}) == {
        "a": {"2": 0, "10": 3},
        "b": {"1": 7},
    }
    assert planning.from_json({"t": {"0": "5", "3": 9}}) == {("t", 0): 5, ("t", 3): 9}
    assert planning.to_json({}) == {} and planning.from_json({}) == {}


def test_input_partitions_and_readers_pickle():
    """What Spark ships to executors is plain data."""
    from sluice.spark.source import StreamReader

    rng = OffsetRange("a", 1, 5, 9, read(topic="a", startingOffsets='{"a": {"1": 5}}'))
    assert pickle.loads(pickle.dumps(rng)) == rng
    reader = StreamReader(read(topic="a"))
    assert pickle.loads(pickle.dumps(reader)).opts == reader.opts
