"""Compression of record batch bodies: the codecs, their names, and the limits a reader
puts on what a compressed body may grow to.

A batch's codec is in bits 0-2 of its attributes (protocol/records.py: ``COMPRESSION_MASK``)
and covers all its records as one body; the header stays uncompressed, so the broker
reads and patches it without decompressing.  The codec libraries (``lz4``, ``zstandard``)
are imported on first use: a process that never meets a compressed batch never loads
them.  Pure functions over bytes.
"""

from __future__ import annotations

from sluice.errors import CorruptRecord, ProtocolError

NO_COMPRESSION, LZ4, ZSTD = 0, 3, 4
COMPRESSION_CODES = {"none": NO_COMPRESSION, "lz4": LZ4, "zstd": ZSTD}  # client option -> codec

MAX_COMPRESSED_RECORDS = 1 << 24  # records one compressed batch may claim
MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024  # a compressed batch that grows past this is refused


def compress(codec: int, data: bytes) -> bytes:
    if codec == NO_COMPRESSION:
        return data
    if codec == LZ4:
        import lz4.frame

        return lz4.frame.compress(data)
    if codec == ZSTD:
        import zstandard

        return zstandard.ZstdCompressor().compress(data)
    raise ProtocolError(f"unsupported compression codec {codec}")


def decompress(codec: int, data, limit: int | None = None) -> bytes:
    """A batch body decompressed; with ``limit``, a body that would grow past ``limit``
    bytes is refused (``CorruptRecord``) before it is all in memory."""
    try:
        if codec == LZ4:
            import lz4.frame

            if limit is None:
                return lz4.frame.decompress(data)
            d = lz4.frame.LZ4FrameDecompressor()
            out = d.decompress(data, max_length=limit + 1)
            if len(out) <= limit and not d.eof:
                raise CorruptRecord("truncated LZ4 frame")
        elif codec == ZSTD:
            import zstandard

            if limit is None:
                return zstandard.ZstdDecompressor().decompressobj().decompress(bytes(data))
            parts, n = [], 0
            with zstandard.ZstdDecompressor().stream_reader(bytes(data)) as reader:
                while n <= limit and (chunk := reader.read(limit + 1 - n)):
                    parts.append(chunk)
                    n += len(chunk)
            out = b"".join(parts)
        else:
            raise CorruptRecord(f"unsupported compression codec {codec}")
    except CorruptRecord:
        raise
    except Exception as exc:  # the codecs raise their own error types
        raise CorruptRecord(f"cannot decompress batch: {exc}") from exc
    if len(out) > limit:
        raise CorruptRecord(f"batch decompresses to more than {limit} bytes")
    return out
