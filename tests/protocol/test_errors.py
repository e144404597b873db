"""The error tree: wire codes, names, retriable flags, OSError translation."""

from __future__ import annotations

import errno
import pickle
import re

import pytest

from sluice import errors
from sluice.errors import (
    BrokerError,
    DiskFull,
    ReadOnlyStorage,
    StorageError,
    UnknownServerError,
    all_codes,
    error_for_code,
    raise_for_code,
    storage_error_from_os,
)

CODES = sorted(all_codes().items())


def test_codes_are_unique_and_dense():
    codes = [code for code, _ in CODES]
    assert len(set(codes)) == len(codes)
    assert codes == list(range(1, len(codes) + 1))
    assert errors.NONE not in all_codes()
    classes = [cls for _, cls in CODES]
    assert len(set(classes)) == len(classes), "one class registered under two codes"


def test_every_broker_error_class_has_a_code():
    defined = {
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, BrokerError) and cls is not BrokerError
    }
    assert defined == set(all_codes().values())


@pytest.mark.parametrize(("code", "cls"), CODES, ids=[cls.__name__ for _, cls in CODES])
def test_code_maps_back_to_its_class(code, cls):
    assert cls.code == code
    exc = error_for_code(code, "details")
    assert type(exc) is cls
    assert (exc.code, exc.message) == (code, "details")
    assert str(exc) == f"{cls.name} ({code}): details"
    assert re.fullmatch(r"[A-Z][A-Z_]+", cls.name)
    assert isinstance(cls.retriable, bool)
    assert isinstance(exc, BrokerError) and isinstance(exc, errors.SluiceError)
    with pytest.raises(cls):
        raise_for_code(code, "details")
    assert str(cls()) == f"{cls.name} ({code}): {cls.name}"  # no message: the name


def test_names_are_unique():
    names = [cls.name for _, cls in CODES]
    assert len(set(names)) == len(names)


def _documented() -> dict[int, tuple[str, bool]]:
    """(class name, retriable) per code, from the tree drawn in errors.py's docstring."""
    out = {}
    for line in errors.__doc__.splitlines():
        m = re.search(r"(\w+)\s+code (\d+)\s*(retriable)?", line)
        if m:
            out[int(m.group(2))] = (m.group(1), bool(m.group(3)))
    return out


def test_registry_matches_the_documented_tree():
    assert {code: (cls.__name__, cls.retriable) for code, cls in CODES} == _documented()


@pytest.mark.parametrize(
    ("cls", "parent"),
    [
        (errors.FrameTooLarge, errors.ProtocolError),
        (errors.CorruptRecord, errors.ProtocolError),
        (errors.DiskFull, StorageError),
        (errors.ReadOnlyStorage, StorageError),
        (errors.ClientClosed, errors.ClientError),
        (errors.BufferExhausted, errors.ClientError),
        (errors.DeliveryTimeout, errors.ClientError),
        (errors.ConfigError, ValueError),
    ],
)
def test_tree_shape(cls, parent):
    assert issubclass(cls, parent) and issubclass(cls, errors.SluiceError)


def test_local_errors_retriable_flags():
    assert errors.ConnectionClosed.retriable is True
    assert errors.BufferExhausted.retriable is True
    assert errors.DeliveryTimeout.retriable is True
    assert errors.ProtocolError.retriable is False
    assert errors.ClientClosed.retriable is False
    assert errors.ConfigError.retriable is False


@pytest.mark.parametrize("code", [-1, max(all_codes()) + 1, 999, 2**31])
def test_unknown_code_is_unknown_server_error(code):
    exc = error_for_code(code, "boom")
    assert type(exc) is UnknownServerError
    assert exc.code == 1
    assert str(code) in exc.message and "boom" in exc.message
    with pytest.raises(UnknownServerError):
        raise_for_code(code)


def test_none_code_does_not_raise():
    assert raise_for_code(errors.NONE, "ignored") is None


@pytest.mark.parametrize(("code", "cls"), CODES, ids=[cls.__name__ for _, cls in CODES])
def test_errors_pickle(code, cls):
    exc = pickle.loads(pickle.dumps(error_for_code(code, "m")))
    assert type(exc) is cls and exc.message == "m" and str(exc) == f"{cls.name} ({code}): m"


@pytest.mark.parametrize(
    ("err", "cls"),
    [
        (errno.ENOSPC, DiskFull),
        (errno.EDQUOT, DiskFull),
        (errno.EROFS, ReadOnlyStorage),
        (errno.EACCES, ReadOnlyStorage),
        (errno.EPERM, ReadOnlyStorage),
        (errno.EIO, StorageError),
        (None, StorageError),
    ],
)
def test_storage_error_from_os(err, cls):
    exc = OSError(err, "some strerror") if err is not None else OSError("no errno")
    out = storage_error_from_os(exc, "segment 00000000000000000042.log")
    assert type(out) is cls
    assert out.retriable is True
    assert "segment 00000000000000000042.log" in out.message


def test_storage_error_messages():
    full = storage_error_from_os(OSError(errno.ENOSPC, "No space left on device"), "append")
    assert full.message == "append: no space left on device" and full.code == 14
    ro = storage_error_from_os(OSError(errno.EROFS, "Read-only file system"), "flush")
    assert ro.message == "flush: Read-only file system" and ro.code == 15
    io = storage_error_from_os(OSError(errno.EIO, "Input/output error"), "read")
    assert io.message == "read: Input/output error" and io.code == 13


# ---------------------------------------------------------------- local codes

LOCAL = sorted(errors.local_codes().items())


def test_every_local_class_has_a_local_code_and_name():
    """Each SluiceError that is not a broker error has its own code >= 1000 and NAME."""
    defined = {
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.SluiceError)
        and not issubclass(cls, BrokerError)
    }
    assert defined == {cls for _, cls in LOCAL}
    for code, cls in LOCAL:
        assert code >= errors.LOCAL_CODES_START and vars(cls)["code"] == code
        assert re.fullmatch(r"[A-Z][A-Z_]+", vars(cls)["name"])
    names = [cls.name for _, cls in LOCAL + CODES]
    assert len(set(names)) == len(names)


def test_local_codes_never_collide_with_wire_codes():
    assert not set(errors.local_codes()) & set(all_codes())
    assert max(all_codes()) < errors.LOCAL_CODES_START
    for code in errors.local_codes():
        assert type(error_for_code(code)) is UnknownServerError  # never read off the wire


def test_local_codes_are_documented():
    documented = {}
    for line in errors.__doc__.splitlines():
        m = re.search(r"(\w+)\s+([A-Z_]+)\s+local (\d+)\s*(retriable)?", line)
        if m:
            documented[int(m.group(3))] = (m.group(1), m.group(2), bool(m.group(4)))
    assert documented == {code: (cls.__name__, cls.name, cls.retriable) for code, cls in LOCAL}


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (errors.BrokerUnreachable("cannot connect to h:1"), "BROKER_UNREACHABLE (1007): cannot connect to h:1"),
        (errors.ConfigError("bad"), "CONFIG_ERROR (1001): bad"),
        (errors.ClientClosed(), "CLIENT_CLOSED (1010): CLIENT_CLOSED"),
        (errors.UnknownTopic("topic 'x'"), "UNKNOWN_TOPIC (4): topic 'x'"),
    ],
)
def test_describe_is_name_code_message(exc, line):
    assert errors.describe(exc) == line


def test_new_connection_errors_are_retriable_connection_closed():
    for cls in (errors.BrokerUnreachable, errors.HandshakeTimeout):
        assert issubclass(cls, errors.ConnectionClosed) and cls.retriable
    assert issubclass(errors.UsageError, errors.ConfigError)
