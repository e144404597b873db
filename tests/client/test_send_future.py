"""The compiled SendFuture keeps asyncio.Future's contract: every scenario here runs on
both, and their outcomes must be the same (asyncio.Future is the reference)."""

import asyncio
import contextvars
import gc
import weakref

import pytest

from sluice.client import RecordMetadata
from sluice.protocol import records

pytestmark = pytest.mark.skipif(records._C is None, reason="the compiled codec is not built")


def send_future(loop):
    return records._C.SendFuture(loop)


def asyncio_future(loop):
    return loop.create_future()


KINDS = [asyncio_future, send_future]
both = pytest.mark.parametrize("make", KINDS, ids=["asyncio", "SendFuture"])


async def outcome(aw):
    """What awaiting ``aw`` gives: ('ok', value) or ('raised', type, args)."""
    try:
        return ("ok", await aw)
    except BaseException as exc:  # noqa: BLE001 - the outcome is what we compare
        return ("raised", type(exc), exc.args)


@both
async def test_await_a_pending_future_then_its_result(make):
    loop = asyncio.get_running_loop()
    fut = make(loop)
    assert asyncio.isfuture(fut) and not fut.done() and fut.get_loop() is loop
    loop.call_later(0.01, fut.set_result, 42)
    assert await fut == 42
    assert fut.done() and not fut.cancelled() and fut.result() == 42 and fut.exception() is None
    assert await fut == 42  # a done future awaits at once, again and again


@both
async def test_a_done_future_awaited_gives_a_tuple_result_whole(make):
    fut = make(asyncio.get_running_loop())
    fut.set_result((1, 2))
    assert await fut == (1, 2)
    assert list(fut.__await__()) == []  # iterated, a done future yields nothing


@both
async def test_exceptions(make):
    loop = asyncio.get_running_loop()
    fut = make(loop)
    fut.set_exception(KeyError("k"))
    assert await outcome(fut) == ("raised", KeyError, ("k",))
    with pytest.raises(KeyError):
        fut.result()
    assert isinstance(fut.exception(), KeyError)
    cls = make(loop)
    cls.set_exception(ValueError)  # a class is instantiated
    assert isinstance(cls.exception(), ValueError)
    for bad in (StopIteration(), 3):
        with pytest.raises(TypeError):
            make(loop).set_exception(bad)


@both
async def test_invalid_states(make):
    loop = asyncio.get_running_loop()
    fut = make(loop)
    with pytest.raises(asyncio.InvalidStateError):
        fut.result()
    with pytest.raises(asyncio.InvalidStateError):
        fut.exception()
    fut.set_result(1)
    with pytest.raises(asyncio.InvalidStateError):
        fut.set_result(2)
    with pytest.raises(asyncio.InvalidStateError):
        fut.set_exception(KeyError())
    assert fut.cancel() is False and fut.result() == 1


@both
async def test_cancel_with_and_without_a_message(make):
    loop = asyncio.get_running_loop()
    fut = make(loop)
    assert fut.cancel(msg="stop") is True and fut.cancelled() and fut.done()
    assert await outcome(fut) == ("raised", asyncio.CancelledError, ("stop",))
    with pytest.raises(asyncio.CancelledError):
        fut.exception()
    plain = make(loop)
    plain.cancel()
    assert await outcome(plain) == ("raised", asyncio.CancelledError, ())
    with pytest.raises(asyncio.InvalidStateError):
        plain.set_result(1)


@both
async def test_callbacks_run_on_the_loop_in_order_in_their_context(make):
    loop = asyncio.get_running_loop()
    var = contextvars.ContextVar("var", default="none")
    seen = []
    fut = make(loop)
    fut.add_done_callback(lambda f: seen.append(("a", var.get(), f is fut)))
    var.set("set")
    fut.add_done_callback(lambda f: seen.append(("b", var.get(), f is fut)))
    other = contextvars.Context()
    fut.add_done_callback(lambda f: seen.append(("c", var.get(), f is fut)), context=other)
    fut.set_result(1)
    assert seen == []  # scheduled, not called
    await asyncio.sleep(0)
    assert seen == [("a", "none", True), ("b", "set", True), ("c", "none", True)]
    fut.add_done_callback(lambda f: seen.append("late"))  # done: scheduled at once
    await asyncio.sleep(0)
    assert seen[-1] == "late"


@both
async def test_remove_done_callback_counts_and_removes_every_equal_one(make):
    loop = asyncio.get_running_loop()
    seen = []
    fut = make(loop)

    def cb(f):
        seen.append("cb")

    fut.add_done_callback(cb)
    fut.add_done_callback(lambda f: seen.append("other"))
    fut.add_done_callback(cb)
    assert fut.remove_done_callback(cb) == 2
    assert fut.remove_done_callback(cb) == 0
    fut.set_result(None)
    await asyncio.sleep(0)
    assert seen == ["other"]


@both
async def test_asyncio_functions_take_it(make):
    loop = asyncio.get_running_loop()
    a, b = make(loop), make(loop)
    loop.call_soon(a.set_result, "a")
    loop.call_soon(b.set_result, "b")
    assert await asyncio.gather(a, b) == ["a", "b"]
    c = make(loop)
    done, pending = await asyncio.wait([c], timeout=0.01)
    assert not done and pending == {c}
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(c, 0.01)
    assert c.cancelled()  # wait_for cancels what it gave up on
    d = make(loop)
    loop.call_soon(d.set_result, "d")
    assert await asyncio.shield(d) == "d"
    e = make(loop)
    loop.call_soon(e.set_exception, KeyError("e"))
    assert await asyncio.gather(e, return_exceptions=True) == [e.exception()]


@both
async def test_cancelling_a_task_cancels_the_future_it_awaits(make):
    loop = asyncio.get_running_loop()
    fut = make(loop)
    task = asyncio.ensure_future(outcome(fut))
    await asyncio.sleep(0)
    task.cancel("bye")
    assert (await task)[:2] == ("raised", asyncio.CancelledError)
    assert fut.cancelled()


@both
async def test_a_future_of_another_loop_is_refused_by_a_task(make):
    other = asyncio.new_event_loop()
    try:
        fut = make(other)
        with pytest.raises(RuntimeError):
            await fut
    finally:
        other.close()


@both
def test_an_exception_never_retrieved_is_reported_to_the_loop(make):
    loop = asyncio.new_event_loop()
    reported = []
    loop.set_exception_handler(lambda lp, ctx: reported.append(ctx))
    try:
        fut = make(loop)
        fut.set_exception(KeyError("lost"))
        del fut
        gc.collect()
        retrieved = make(loop)
        retrieved.set_exception(KeyError("seen"))
        retrieved.exception()
        del retrieved
        gc.collect()
    finally:
        loop.close()
    assert len(reported) == 1
    assert "exception was never retrieved" in reported[0]["message"]
    assert isinstance(reported[0]["exception"], KeyError)


@both
def test_a_cycle_through_a_callback_is_collected(make):
    loop = asyncio.new_event_loop()
    try:
        fut = make(loop)
        fut.add_done_callback(lambda f, fut=fut: None)  # fut -> callback -> fut
        ref = weakref.ref(fut)
        del fut
        gc.collect()
        assert ref() is None
    finally:
        loop.close()


async def test_a_resolved_send_future_builds_its_metadata_once():
    """resolve_records finishes a batch's SendFutures with what their metadata needs and
    builds each RecordMetadata on the first ask, the same the reference resolution sets."""
    loop = asyncio.get_running_loop()
    buf = records._C.RecordBuffer()
    buf.futures = [send_future(loop), loop.create_future(), send_future(loop)]
    buf.timestamps = [10, 11, 12]
    waiter = asyncio.ensure_future(buf.futures[0])
    buf.resolve_records(RecordMetadata, "t", 3, 100, -1)
    assert [f.result() for f in buf.futures] == [RecordMetadata("t", 3, 100 + i, 10 + i) for i in range(3)]
    assert buf.futures[0].result() is buf.futures[0].result()
    assert await waiter == RecordMetadata("t", 3, 100, 10)
    appended = records._C.RecordBuffer()
    appended.futures, appended.timestamps = [send_future(loop)], [5]
    appended.resolve_records(RecordMetadata, "t", 0, -1, 777)  # acks=none and log-append time
    assert appended.futures[0].result() == RecordMetadata("t", 0, -1, 777)
    assert "RecordMetadata" in repr(appended.futures[0])


def test_constructor_takes_the_loop_positionally():
    loop = asyncio.new_event_loop()
    try:
        assert not records._C.SendFuture(loop).done()
        with pytest.raises(TypeError):
            records._C.SendFuture()
        with pytest.raises(TypeError):
            records._C.SendFuture(loop=loop)
    finally:
        loop.close()
