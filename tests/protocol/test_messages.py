"""Message structs: generic hypothesis round trips for every API, decode errors, registry."""

from __future__ import annotations

import re

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import InvalidRequest, UnsupportedVersion
from sluice.protocol import (
    messages,
    replication_messages,
    subscription_messages,
    transaction_messages,
)
from sluice.protocol.messages import APIS, Api, api_of, decode, encode, types_for

# --------------------------------------------------------------------------- strategies

_INT64 = st.integers(-(2**63), 2**63 - 1)
_SMALL_INT = st.integers(-3, 3)


def strategy_for(t: mi.Type) -> st.SearchStrategy:
    """A hypothesis strategy for a msgspec type; fails loudly on a type it does not know.

    Built from ``msgspec.inspect`` rather than ``st.from_type``: from_type draws unbounded
    ints, which msgpack cannot carry, and knows nothing of the wire's int64 range.
    """
    if isinstance(t, mi.StructType):
        return st.builds(t.cls, **{f.name: field_strategy(f) for f in t.fields})
    if isinstance(t, mi.IntType):
        assert (t.ge, t.gt, t.le, t.lt, t.multiple_of) == (None,) * 5, "add int constraints"
        return _SMALL_INT | _INT64
    if isinstance(t, mi.StrType):
        assert (t.min_length, t.max_length, t.pattern) == (None, None, None), "add str constraints"
        return st.text(max_size=12)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.BytesType):
        return st.binary(max_size=16)
    if isinstance(t, mi.ListType):
        return st.lists(strategy_for(t.item_type), max_size=3)
    if isinstance(t, mi.DictType):
        return st.dictionaries(strategy_for(t.key_type), strategy_for(t.value_type), max_size=3)
    if isinstance(t, mi.UnionType):
        return st.one_of([strategy_for(x) for x in t.types])
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.FloatType):
        return st.floats(allow_nan=False, allow_infinity=False)
    if isinstance(t, mi.TupleType):
        return st.tuples(*(strategy_for(x) for x in t.item_types))
    raise NotImplementedError(f"no strategy for msgspec type {t!r}: extend strategy_for")


def minimal(t: mi.Type):
    """The smallest value of a msgspec type (only required fields set, for structs)."""
    if isinstance(t, mi.StructType):
        return t.cls(**{f.name: minimal(f.type) for f in t.fields if f.required})
    if isinstance(t, mi.UnionType):
        return minimal(t.types[0])
    if isinstance(t, mi.LiteralType):
        return t.values[0]
    if isinstance(t, mi.TupleType):
        return tuple(minimal(x) for x in t.item_types)
    simple = {mi.IntType: 0, mi.StrType: "", mi.BoolType: False, mi.NoneType: None, mi.FloatType: 0.0}
    if type(t) in simple:
        return simple[type(t)]
    return {mi.ListType: [], mi.DictType: {}, mi.BytesType: b""}[type(t)]


def field_strategy(f: mi.Field) -> st.SearchStrategy:
    s = strategy_for(f.type)
    if not f.required:
        # Defaults are omitted on the wire (omit_defaults): make sure they come back.
        default = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
        s = st.just(default) | s
    return s


MESSAGE_TYPES = [
    pytest.param(cls, id=f"{api.name}.v{version}.{role}")
    for api, versions in APIS.items()
    for version, pair in versions.items()
    for role, cls in zip(("request", "response"), pair, strict=True)
]


def test_every_api_is_registered_with_both_types():
    assert set(APIS) == set(Api), "an Api without any registered version"
    for versions in APIS.values():
        assert versions, "an Api with no versions"
        for req, resp in versions.values():
            assert issubclass(req, messages.Struct) and not issubclass(req, messages.Response)
            assert issubclass(resp, messages.Response)


def test_every_defined_message_type_is_in_apis():
    defined = {
        cls
        for name, cls in vars(messages).items()
        if isinstance(cls, type)
        and issubclass(cls, messages.Struct)
        and cls.__module__ in {
            mod.__name__ for mod in (messages, subscription_messages, replication_messages, transaction_messages)
        }
        and re.search(r"(Request|Response)(V\d+)?$", name)
        and cls is not messages.Response
    }
    registered = {cls for versions in APIS.values() for pair in versions.values() for cls in pair}
    assert defined == registered
    assert len(MESSAGE_TYPES) == 2 * sum(len(v) for v in APIS.values()) == len(registered)


@pytest.mark.parametrize("cls", MESSAGE_TYPES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip(cls, data):
    message = data.draw(strategy_for(mi.type_info(cls)))
    encoded = encode(message)
    assert isinstance(encoded, bytes)
    assert decode(encoded, cls) == message
    assert decode(memoryview(encoded), cls) == message  # frames hand over memoryviews
    assert encode(decode(encoded, cls)) == encoded


@pytest.mark.parametrize("cls", MESSAGE_TYPES)
def test_defaults_are_omitted_on_the_wire(cls):
    message = minimal(mi.type_info(cls))
    required = {f.name for f in msgspec.structs.fields(cls) if f.required}
    assert set(msgspec.msgpack.decode(encode(message))) == required
    assert decode(encode(message), cls) == message


def test_round_trip_byte_table():
    req = messages.ProduceRequest(
        partitions=[messages.ProducePartition(topic="t", partition=0, size=61)], acks=-1
    )
    # {"partitions": [{"topic": "t", "partition": 0, "size": 61}], "acks": -1}
    assert encode(req) == (
        b"\x82\xaapartitions\x91\x83\xa5topic\xa1t\xa9partition\x00\xa4size\x3d\xa4acks\xff"
    )
    assert encode(messages.FetchResponse()) == b"\x80"
    assert decode(b"\x80", messages.FetchResponse) == messages.FetchResponse(
        error=0, message="", partitions=[]
    )


def test_admin_byte_table():
    req = messages.CreatePartitionsRequest(topics=[messages.PartitionsIncrease(name="t", total=4)])
    # {"topics": [{"name": "t", "total": 4}]}
    assert encode(req) == b"\x81\xa6topics\x91\x82\xa4name\xa1t\xa5total\x04"
    change = messages.TopicConfigChange(name="t", delete=["flush.ms"])
    # {"name": "t", "delete": ["flush.ms"]}: the empty config is omitted
    assert encode(change) == b"\x82\xa4name\xa1t\xa6delete\x91\xa8flush.ms"
    part = decode(b"\x82\xa5topic\xa1t\xa9partition\x00", messages.GroupPartition)
    assert (part.committed_offset, part.lag, part.commit_time_ms, part.committed_by) == (-1, -1, -1, "")
    assert decode(b"\x80", messages.ListGroupsRequest) == messages.ListGroupsRequest()


# --------------------------------------------------------------------------- decode errors


@pytest.mark.parametrize("cls", MESSAGE_TYPES)
@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=64))
def test_garbage_decodes_or_raises_invalid_request(cls, data):
    try:
        out = decode(data, cls)
    except InvalidRequest as exc:
        assert cls.__name__ in str(exc)
    else:
        assert isinstance(out, cls)


@pytest.mark.parametrize(
    ("cls", "obj"),
    [
        (messages.CreateTopicsRequest, {"topics": "not a list"}),
        (messages.CreateTopicsRequest, {}),  # required field missing
        (messages.CreateTopicsRequest, {"topics": [{"partitions": 3}]}),  # nested missing
        (messages.ProduceRequest, {"partitions": [], "acks": "all"}),
        (messages.ProduceRequest, {"partitions": [], "acks": None}),
        (messages.FetchRequest, {"partitions": [], "max_wait_ms": 1.5}),
        (messages.MetadataRequest, {"topics": [1, 2]}),
        (messages.MetadataRequest, [None]),  # an array, not a map
        (messages.OffsetCommitRequest, {"group": None, "offsets": []}),
        (messages.ApiVersionsResponse, {"error": "0"}),
        (messages.DescribeTopicsResponse, {"topics": [{"name": "t", "config": {"a": 1}}]}),
        (messages.ApiVersionsRequest, 5),
        (messages.DescribeGroupsRequest, {"names": "g"}),
        (messages.DeleteGroupsRequest, {}),
        (messages.AlterTopicConfigsRequest, {"topics": [{"name": "t", "config": {"retention.ms": 5}}]}),
        (messages.AlterTopicConfigsRequest, {"topics": [{"name": "t", "delete": "retention.ms"}]}),
        (messages.CreatePartitionsRequest, {"topics": [{"name": "t"}]}),  # total missing
        (messages.CreatePartitionsRequest, {"topics": [{"name": "t", "total": "4"}]}),
    ],
)
def test_wrong_types_raise_invalid_request(cls, obj):
    with pytest.raises(InvalidRequest, match=cls.__name__):
        decode(msgspec.msgpack.encode(obj), cls)


@pytest.mark.parametrize(
    "data", [b"", b"\xc1", b"\x81", b"\x81\xa6topics", b"\x80\x80", b"\x80\x00"]
)
def test_malformed_msgpack_raises_invalid_request(data):
    with pytest.raises(InvalidRequest) as info:
        decode(data, messages.MetadataRequest)
    assert info.value.code == 2
    assert isinstance(info.value.__cause__, msgspec.DecodeError)


def test_truncated_encodings_raise_invalid_request():
    message = messages.MetadataResponse(
        brokers=[messages.BrokerInfo(node_id=1, host="h", port=9092)],
        topics=[
            messages.TopicMetadata(
                name="t", partitions=[messages.PartitionMetadata(partition=0, leader=1)]
            )
        ],
    )
    encoded = encode(message)
    for cut in range(len(encoded)):
        with pytest.raises(InvalidRequest):
            decode(encoded[:cut], messages.MetadataResponse)


# --------------------------------------------------------------------------- registry


@pytest.mark.parametrize("api", list(Api))
def test_types_for_known(api):
    for version, pair in APIS[api].items():
        assert types_for(int(api), version) == pair


@pytest.mark.parametrize("api", [-1, len(Api), 99, 0xFFFF])
def test_types_for_unknown_api(api):
    with pytest.raises(UnsupportedVersion, match=f"unknown API key {api}") as info:
        types_for(api, 1)
    assert info.value.code == 3


@pytest.mark.parametrize("version", [0, 2, 0xFFFF])
def test_types_for_unknown_version(version):
    with pytest.raises(UnsupportedVersion) as info:
        types_for(int(Api.FETCH), version)
    text = str(info.value)
    assert f"FETCH version {version} is not supported" in text
    assert "supported: [1]" in text


def test_api_of_every_request():
    seen = set()
    for api, versions in APIS.items():
        for version, (req, _) in versions.items():
            assert api_of(minimal(mi.type_info(req))) == (api, version)
            seen.add(api)
    assert seen == set(Api)
    assert api_of(messages.FetchRequest(partitions=[])) == (Api.FETCH, 1)
    assert api_of(messages.ApiVersionsRequest()) == (Api.API_VERSIONS, 1)


def test_supported_versions_round_trip():
    resp = messages.ApiVersionsResponse(apis=messages.supported_versions())
    got = decode(encode(resp), messages.ApiVersionsResponse)
    assert {(r.api, r.min_version, r.max_version) for r in got.apis} == {
        (int(api), min(v), max(v)) for api, v in APIS.items()
    }


def test_api_keys_are_stable():
    # Wire values: changing one breaks every deployed client.
    assert {a.name: int(a) for a in Api} == {
        "API_VERSIONS": 0,
        "METADATA": 1,
        "CREATE_TOPICS": 2,
        "DELETE_TOPICS": 3,
        "DESCRIBE_TOPICS": 4,
        "PRODUCE": 5,
        "FETCH": 6,
        "LIST_OFFSETS": 7,
        "OFFSET_COMMIT": 8,
        "OFFSET_FETCH": 9,
        "LIST_GROUPS": 10,
        "DESCRIBE_GROUPS": 11,
        "DELETE_GROUPS": 12,
        "ALTER_TOPIC_CONFIGS": 13,
        "CREATE_PARTITIONS": 14,
        "REPLICA_FETCH": 15,
        "OFFSETS_FOR_LEADER_EPOCH": 16,
        "ELECT_LEADERS": 17,
        "INIT_PRODUCER_ID": 18,
        "END_TRANSACTION": 19,
        "REGISTER_PRODUCER": 20,
        "LIST_TRANSACTIONS": 21,
        "SUBSCRIBE": 22,
        "ACK": 23,
        "CREATE_SUBSCRIPTION": 24,
        "DELETE_SUBSCRIPTION": 25,
        "DESCRIBE_SUBSCRIPTIONS": 26,
        "SEEK_SUBSCRIPTION": 27,
    }
    assert {p.name: int(p) for p in messages.Push} == {"CHECK_TRANSACTION": 1, "DELIVER": 2, "SUBSCRIPTION_ENDED": 3}


def test_push_round_trip():
    push = messages.CheckTransaction(
        topic="t", partition=2, offset=7, group="g", timestamp=5, key=None, value=b"v",
        headers=[("h", b"x"), ("n", None)], checks=3,
    )
    assert decode(encode(push), messages.PUSHES[messages.Push.CHECK_TRANSACTION][1]) == push


def test_structs_are_frozen():
    message = messages.FetchPartition(topic="t", partition=0, offset=5)
    with pytest.raises(AttributeError):
        message.offset = 6
