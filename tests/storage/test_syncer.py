"""Syncer: fdatasync from the event loop, in native threads (``sluice._csyncer``) and in the
Python fallback; each future gets its own sync's outcome."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import sysconfig
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sluice import native
from sluice.storage import syncer as syncer_module
from sluice.storage.segment import Segment
from sluice.storage.syncer import Syncer

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(params=["native", "python"])
def syncer(request):
    if request.param == "native" and syncer_module._csyncer is None:
        pytest.skip("sluice._csyncer is not built or not used (SLUICE_PURE_PYTHON)")
    executor = ThreadPoolExecutor(2, thread_name_prefix="test-sync")
    s = Syncer(2, executor, native=request.param == "native")
    yield s
    s.close()
    executor.shutdown(wait=True)


def test_native_where_a_compiler_is():
    """``pip install`` builds the native syncer wherever a C compiler and Python's headers are."""
    have_cc = shutil.which("cc") or shutil.which("gcc")
    have_headers = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    if not (have_cc and have_headers):
        pytest.skip("no C compiler or Python headers: syncs run in Python threads")
    if native.pure_python():
        pytest.skip("SLUICE_PURE_PYTHON is set")
    assert syncer_module._csyncer is not None


async def test_a_sync_of_a_file_completes(syncer, tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        for _ in range(20):
            os.write(fd, b"x" * 100)
            assert await syncer.fdatasync(fd) is None
    finally:
        os.close(fd)
    assert syncer.native == (syncer._use_native)  # the threads run until close


async def test_each_future_gets_its_own_outcome(syncer, tmp_path):
    """A burst mixing syncs that succeed (files) and fail (pipes: EINVAL), all in flight at
    once across the threads: each future fails or succeeds as its own descriptor does."""
    files = [os.open(tmp_path / f"f{i}", os.O_RDWR | os.O_CREAT) for i in range(8)]
    pipes = [os.pipe() for _ in range(8)]
    try:
        fds = [fd for pair in zip(files, (r for r, _ in pipes), strict=True) for fd in pair]
        results = await asyncio.gather(*(syncer.fdatasync(fd) for fd in fds), return_exceptions=True)
    finally:
        for fd in files + [fd for pair in pipes for fd in pair]:
            os.close(fd)
    for fd, result in zip(fds, results, strict=True):
        if fd in files:
            assert result is None
        else:
            assert isinstance(result, OSError) and result.errno == errno.EINVAL


async def test_the_caller_may_close_its_descriptor_meanwhile(syncer, tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    os.write(fd, b"data")
    fut = syncer.fdatasync(fd)
    os.close(fd)  # and the number may be reused at once
    other = os.open(tmp_path / "g", os.O_RDWR | os.O_CREAT)
    try:
        assert await fut is None
    finally:
        os.close(other)


async def test_the_python_fallback_syncs_what_it_was_given_when_the_thread_runs_late(tmp_path):
    """The worker thread runs the sync only after the caller closed its descriptor and the
    number went to a pipe (which fdatasync refuses): the sync is still of the file."""
    executor = ThreadPoolExecutor(1, thread_name_prefix="test-sync")
    busy = threading.Event()
    executor.submit(busy.wait, 10)  # the only thread is busy until the descriptor is reused
    s = Syncer(2, executor, native=False)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    os.write(fd, b"data")
    fut = s.fdatasync(fd)
    os.close(fd)
    r, w = os.pipe()
    busy.set()
    try:
        assert r == fd or w == fd  # the number was reused
        assert await fut is None
    finally:
        os.close(r)
        os.close(w)
        s.close()
        executor.shutdown(wait=True)


async def test_a_bad_descriptor_fails_at_once_or_in_the_future(syncer):
    with pytest.raises(OSError) as info:
        # not open (the native syncer raises on submit, when it dups; Python in the future)
        await syncer.fdatasync(999_999)
    assert info.value.errno == errno.EBADF


async def test_close_completes_what_was_submitted(syncer, tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        futures = []
        for _ in range(10):
            os.write(fd, b"x")
            futures.append(syncer.fdatasync(fd))
        syncer.close()
        results = await asyncio.gather(*futures, return_exceptions=True)
    finally:
        os.close(fd)
    assert results == [None] * 10
    with pytest.raises(RuntimeError):
        syncer.fdatasync(0)


def _segment(tmp_path, content: bytes = b"") -> Segment:
    seg = Segment.create(tmp_path, 0)
    if content:
        seg.write([content], len(content))
        seg.size = len(content)  # as Segment.appended would
    return seg


async def test_an_append_writes_every_buffer_at_the_segment_size(syncer, tmp_path):
    """Many buffers (more than one pwritev takes: they are written in turns), empty ones and
    memoryview slices among them, each with or without its fdatasync."""
    seg = _segment(tmp_path, b"head|")
    try:
        data = bytearray(b"".join(b"%05d," % i for i in range(3000)))
        buffers = [memoryview(data)[i * 6 : i * 6 + 6] for i in range(3000)] + [b"", bytearray(b"end")]
        total = sum(len(b) for b in buffers)
        for sync in (False, True):
            assert await syncer.append(seg, buffers, total, sync) is None
            seg.size += total
        assert seg.path.read_bytes() == b"head|" + (bytes(data) + b"end") * 2
    finally:
        seg.close()


async def test_a_failed_append_leaves_the_file_as_it_was(syncer, tmp_path):
    """All or nothing: a write the file refuses (opened read-only here: EBADF) fails the
    future, and the file keeps its size."""
    seg = _segment(tmp_path, b"kept")
    seg.close()
    ro = Segment(tmp_path, 0)
    ro._file = open(ro.path, "rb", buffering=0)  # noqa: SIM115 - closed below
    ro.size = 4
    try:
        with pytest.raises(OSError) as info:
            await syncer.append(ro, [b"x" * 100, b"y"], 101, True)
        assert info.value.errno == errno.EBADF
    finally:
        ro.close()
    assert seg.path.read_bytes() == b"kept"
