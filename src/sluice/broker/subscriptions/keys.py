"""Key-ordered mode: the messages of a key held behind the one of it that is out.

Per key, the offset out (in flight, retrying or being dead-lettered) and the offsets of
the same key read since, in order.  When the one out is settled the next of its key goes
out, as a retry due now (the delivery, broker/subscriptions/delivery.py, schedules it).
Only the keys with a message out are kept, so memory follows what is out and waiting
(bounded by the delivery's ``MAX_WAITING``), not the number of keys.

Event loop only.
"""

from __future__ import annotations

from collections import deque


class KeyOrder:
    """Keys with a message out, and the offsets waiting behind each."""

    def __init__(self) -> None:
        self._keys: dict[bytes | None, deque[int]] = {}  # key -> offsets waiting behind the one out
        self._key_of: dict[int, bytes | None] = {}  # offset out -> its key
        self.waiting = 0  # offsets waiting, all keys

    def busy(self, key: bytes | None) -> bool:
        return key in self._keys

    def take(self, key: bytes | None, offset: int) -> None:
        """``offset`` goes out for ``key``, which has none out: the key's next wait for it."""
        self._keys[key] = deque()
        self._key_of[offset] = key

    def hold(self, key: bytes | None, offset: int) -> bool:
        """Hold ``offset`` behind its key's message out; False if none is out."""
        waiting = self._keys.get(key)
        if waiting is None:
            return False
        waiting.append(offset)
        self.waiting += 1
        return True

    def release(self, a: int, b: int) -> list[int]:
        """Offsets in ``[a, b)`` were settled: the next offset of each of their keys, now
        out in its turn (the key stays busy), in the order they were settled."""
        key_of = self._key_of
        if not key_of:
            return []
        done = [o for o in range(a, b) if o in key_of] if b - a <= len(key_of) else [
            o for o in key_of if a <= o < b
        ]
        out = []
        for o in done:
            key = key_of.pop(o)
            waiting = self._keys.get(key)
            if waiting:
                nxt = waiting.popleft()
                self.waiting -= 1
                key_of[nxt] = key
                out.append(nxt)
            else:
                self._keys.pop(key, None)
        return out

    def clear(self) -> None:
        self._keys.clear()
        self._key_of.clear()
        self.waiting = 0
