"""The storage fault injector (storage/faults.py): armed only by its environment variable,
it makes segment writes, fsyncs and rolls fail or hang as its control file says."""

from __future__ import annotations

import errno
import json
import threading
import time

import pytest

from sluice.storage import faults
from sluice.storage.segment import Segment


@pytest.fixture
def disarmed():
    yield
    faults.injector = None


def _rules(data, **rules) -> None:
    (data / faults.CONTROL_FILE).write_text(json.dumps(rules))
    time.sleep(faults.POLL_S * 2)  # past the injector's re-read interval


def test_a_control_file_does_nothing_unless_armed(tmp_path, monkeypatch, disarmed):
    monkeypatch.delenv(faults.ENV, raising=False)
    assert faults.arm_from_env(tmp_path) is None
    _rules(tmp_path, write="EIO", roll="EIO")
    seg = Segment.create(tmp_path, 0)
    seg.write([b"abc"], 3)
    seg.flush()
    monkeypatch.setenv(faults.ENV, "1")  # only the exact value arms it
    assert faults.arm_from_env(tmp_path) is None
    assert faults.injector is None


def test_armed_write_fsync_and_roll_fail_as_told(tmp_path, monkeypatch, disarmed):
    monkeypatch.setenv(faults.ENV, faults.ARMED)
    assert faults.arm_from_env(tmp_path) is not None
    seg = Segment.create(tmp_path, 0)
    seg.write([b"abc"], 3)  # no control file: no fault
    _rules(tmp_path, write="EIO", fsync="EROFS", roll="ENOSPC")
    with pytest.raises(OSError) as exc:
        seg.write([b"def"], 3)
    assert exc.value.errno == errno.EIO
    assert seg.path.stat().st_size == 3  # nothing of the failed write
    with pytest.raises(OSError) as exc:
        seg.flush()
    assert exc.value.errno == errno.EROFS
    with pytest.raises(OSError) as exc:
        Segment.create(tmp_path, 100)
    assert exc.value.errno == errno.ENOSPC
    _rules(tmp_path, write="EIO", only="other-0")  # limited to other files
    seg.write([b"def"], 3)
    (tmp_path / faults.CONTROL_FILE).unlink()
    time.sleep(faults.POLL_S * 2)
    Segment.create(tmp_path, 100)


def test_a_hang_lasts_until_the_rule_is_removed(tmp_path, monkeypatch, disarmed):
    monkeypatch.setenv(faults.ENV, faults.ARMED)
    faults.arm_from_env(tmp_path)
    seg = Segment.create(tmp_path, 0)
    _rules(tmp_path, write="hang")
    done = threading.Event()
    t = threading.Thread(target=lambda: (seg.write([b"abc"], 3), done.set()))
    t.start()
    assert not done.wait(0.3)
    (tmp_path / faults.CONTROL_FILE).unlink()
    assert done.wait(2)
    t.join()
    assert seg.path.stat().st_size == 3
