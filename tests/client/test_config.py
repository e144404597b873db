"""The clients' settings as data (client/config.py) and the producer's shared state
(client/state.py): one validated frozen object per client, keyword arguments building the
same one, and the state the compiled path is made from."""

from __future__ import annotations

import dataclasses

import pytest

from sluice import errors
from sluice.client.config import (
    ConsumerConfig,
    ProducerConfig,
    SubscriberConfig,
    TransactionProducerConfig,
)
from sluice.client.consumer import Consumer
from sluice.client.producer import Producer
from sluice.client.subscriber import Subscriber
from sluice.client.transaction import TransactionProducer
from sluice.protocol import compression, messages, records
from sluice.protocol.subscriptions import SubscriptionConfig


def test_keyword_arguments_build_the_config_a_producer_is_given():
    by_keywords = Producer("localhost:9092", acks="leader", linger_ms=1, batch_size=4096)
    given = Producer("localhost:9092", ProducerConfig(acks="leader", linger_ms=1, batch_size=4096))
    assert by_keywords.config == given.config == ProducerConfig(acks="leader", linger_ms=1, batch_size=4096)
    assert given.acks == messages.ACKS_LEADER and given.linger == 0.001 and given.batch_size == 4096


def test_keywords_go_over_a_given_config():
    base = ProducerConfig(acks="leader", linger_ms=7)
    p = Producer("localhost:9092", base, linger_ms=2)
    assert p.config == ProducerConfig(acks="leader", linger_ms=2)
    assert base.linger_ms == 7  # the given one is left as it is


def test_a_config_is_frozen_and_checked_when_made():
    cfg = ProducerConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.acks = "none"
    with pytest.raises(errors.ConfigError, match="acks must be one of"):
        ProducerConfig(acks="some")
    with pytest.raises(errors.ConfigError, match="batch_size must not exceed buffer_memory"):
        dataclasses.replace(cfg, batch_size=1 << 20, buffer_memory=1 << 19)
    with pytest.raises(TypeError, match="lingerms"):
        ProducerConfig(lingerms=5)
    with pytest.raises(errors.ConfigError, match="config must be a ProducerConfig"):
        Producer("localhost:9092", ConsumerConfig())


def test_effective_idempotence_settings():
    assert ProducerConfig().idempotent is True and ProducerConfig().in_flight_per_partition == 5
    off = ProducerConfig(acks="none")
    assert off.idempotent is False and off.in_flight_per_partition == 1
    assert off.enable_idempotence is None  # left as given: replace(acks="all") turns it on again
    assert dataclasses.replace(off, acks="all").idempotent is True
    assert ProducerConfig(producer_id=(1 << 62) + 1, producer_epoch=3).identity == ((1 << 62) + 1, 3)
    assert ProducerConfig(compression="lz4").codec == compression.COMPRESSION_CODES["lz4"]


def test_consumer_config():
    c = Consumer("localhost:9092", group="g", fetch_max_wait_ms=50)
    assert c.config == ConsumerConfig(group="g", fetch_max_wait_ms=50)
    assert c.auto_commit is True and c.fetch_max_wait_ms == 50
    with pytest.raises(errors.ConfigError, match="request_timeout_ms must exceed fetch_max_wait_ms"):
        ConsumerConfig(request_timeout_ms=100, fetch_max_wait_ms=100)
    with pytest.raises(errors.ConfigError, match="group must be a non-empty string"):
        Consumer("localhost:9092", ConsumerConfig(), group="")


def test_subscriber_config_merges_the_subscription_settings():
    base = SubscriptionConfig(mode="ordered", max_attempts=3)
    s = SubscriberConfig(config=base, max_attempts=5, tags=("blue",))
    assert s.subscription == SubscriptionConfig(mode="ordered", max_attempts=5, tags=["blue"])
    assert s.asked == SubscriptionConfig.__struct_fields__  # a config given: all of its settings asked
    assert SubscriberConfig(mode="ordered").asked == ("mode",)
    assert SubscriberConfig().subscription == SubscriptionConfig()
    with pytest.raises(errors.ConfigError, match="prefetch must be"):
        SubscriberConfig(prefetch=0)
    with pytest.raises(errors.ConfigError, match="start must be"):
        Subscriber("localhost:9092", "t", "s", start="middle")
    sub = Subscriber("localhost:9092", "t", "s", SubscriberConfig(prefetch=10), mode="key-ordered")
    assert sub.settings == SubscriberConfig(prefetch=10, mode="key-ordered") and sub.prefetch == 10


def test_transaction_producer_config():
    t = TransactionProducer("localhost:9092", group="g", retry_timeout_ms=5)
    assert t.config == TransactionProducerConfig(group="g", retry_timeout_ms=5) and t.retry_timeout == 0.005
    with pytest.raises(errors.ConfigError, match="group must be a non-empty string"):
        TransactionProducerConfig(group="")
    with pytest.raises(errors.ConfigError, match="register_interval_ms must be a number > 0"):
        TransactionProducer("localhost:9092", TransactionProducerConfig(group="g"), register_interval_ms=0)


def test_the_producer_hands_one_state_to_its_parts():
    p = Producer("localhost:9092")
    state = p.state
    assert state.config is p.config and state.memory is p._memory and state.accumulator is p._acc
    assert state.topics is p._cluster.topics and state.open is p._acc.open and state.lanes is p._line.lanes
    assert state.sticky is p._sticky and state.routes is p._appender._routes
    if records._C is None:
        assert state.appender is None
    else:
        assert state.appender is not None and p.send == state.appender.send


@pytest.mark.skipif(records._C is None, reason="the compiled codec is not built")
def test_the_compiled_path_refuses_a_state_of_another_shape():
    state = Producer("localhost:9092").state
    state.routes = []  # a list where the compiled path reads a dict
    with pytest.raises(TypeError, match="ProducerState.routes must be a dict"):
        records._C.Appender(state, print, print, print, print, print, False, 61, 32, 1, 1)
