"""Server lifecycle: start the broker, listen, stop cleanly on SIGTERM / SIGINT.

``run(config)`` is what ``sluice serve`` calls.  Start order: lock the data directory, bind
the port, recover the logs, then accept connections, so a second broker on the same
directory or port is refused before it reads a byte of data.  Shutdown order: stop
accepting, take no new leadership, answer waiting fetches at once, hand each partition led
here to a live in-sync follower (broker/replication/handoff.py: writes still waiting for replicas here
fail over to it at once), refuse new requests (but the followers'), let in-flight ones
finish (bounded), close the followers' connections, then flush and close every partition,
so a SIGTERM never loses an acknowledged write, leaves indexes saved, and exits at once
even with consumers waiting for records.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from sluice.broker.broker import Broker
from sluice.config import ServerConfig
from sluice.errors import ConfigError, SluiceError
from sluice.server.connection import Connection
from sluice.storage.dirlock import DataDirLock

log = logging.getLogger("sluice.server")

SHUTDOWN_GRACE_S = 10.0
HAND_OFF_S = 3.0  # the longest the leadership hand-off may take (metadata store writes)


class Server:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.broker = Broker(config)
        self.handlers = self.broker.handlers()
        self.connections: set[Connection] = set()
        self.stopping = False
        self._listener: asyncio.AbstractServer | None = None
        self._lock = DataDirLock(config.data_dir)
        self._stopped = asyncio.Event()
        self.failure: BaseException | None = None  # why the broker stopped itself
        self.broker.on_fatal = self._fatal

    def register(self, conn: Connection) -> bool:
        """Admit a connection unless the limit is reached or the server is stopping."""
        if self.stopping or len(self.connections) >= self.config.max_connections:
            return False
        self.connections.add(conn)
        return True

    def unregister(self, conn: Connection) -> None:
        self.connections.discard(conn)

    @property
    def address(self) -> tuple[str, int]:
        sock = self._listener.sockets[0]
        return sock.getsockname()[:2]

    async def start(self) -> None:
        """Lock, bind, recover, serve (module docstring).  Raises ``DataDirInUse``, or
        ``ConfigError`` (also for an address that cannot be listened on), with nothing of
        the data touched."""
        cfg = self.config
        self._lock.acquire()
        try:
            loop = asyncio.get_running_loop()
            self._listener = await self._listen(loop)
            host, port = self.address
            self.broker.host = cfg.advertised_host or host
            self.broker.port = cfg.advertised_port or port
            await self.broker.start()
            await self._listener.start_serving()
        except BaseException:
            if self._listener is not None:
                self._listener.close()
            self._lock.release()
            raise
        log.info("sluice broker listening on %s:%d (data: %s)", host, port, cfg.data_dir)
        if (self.broker.host, self.broker.port) != (host, port):
            log.info("advertised to clients as %s:%d", self.broker.host, self.broker.port)

    async def _listen(self, loop) -> asyncio.AbstractServer:
        """Bind (not yet serving); ``ConfigError`` naming the address when it cannot be."""
        cfg = self.config
        try:
            return await loop.create_server(
                lambda: Connection(self), cfg.host, cfg.port,
                reuse_address=True, backlog=512, start_serving=False,
            )
        except OSError as exc:
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            raise ConfigError(f"cannot listen on {cfg.host}:{cfg.port}: {why}") from exc

    async def stop(self) -> None:
        if self.stopping:
            await self._stopped.wait()
            return
        self.stopping = True
        log.info("shutting down")
        try:
            if self._listener is not None:
                self._listener.close()
            self.broker.drain()  # long polls answer now, not after their max_wait_ms
            await self._hand_off()
            # Clients' requests first, while followers still fetch: an acks=all write in
            # flight completes only once they have it (their connections are served on,
            # server/connection.py), and it completes at once then, not after the grace.
            conns = list(self.connections)
            await asyncio.gather(
                *(c.drain_and_close(SHUTDOWN_GRACE_S) for c in conns if not c.replica),
                return_exceptions=True,
            )
            await asyncio.gather(
                *(c.drain_and_close(0) for c in list(self.connections) if c.replica), return_exceptions=True
            )
            await self.broker.close()
        finally:
            self._lock.release()
            self._stopped.set()  # the process exits even if a close step failed (it is logged)
        log.info("stopped")

    async def _hand_off(self) -> None:
        """Give the partitions led here to in-sync followers (broker/replication/handoff.py): their
        ``acks=all`` writes waiting here end at once (retried by producers on the new
        leader) instead of holding the shutdown for a follower that may never fetch.
        Bounded: with the metadata store out, the controller elects after this broker left."""
        if self.config.cluster is None:
            return
        if self.broker.store_unreachable is not None:
            log.warning("leadership not handed off: the metadata store does not answer")
            return
        try:
            moved = await asyncio.wait_for(self.broker.hand_off_leadership(), HAND_OFF_S)
        except (TimeoutError, SluiceError) as exc:
            log.warning("leadership not handed off before stopping: %r", exc)
            return
        if moved:
            log.info("handed %d partition leadership(s) to in-sync followers", moved)

    def _fatal(self, exc: BaseException) -> None:
        """The broker must stop (``Broker.on_fatal``): stop, then ``serve_forever`` raises."""
        if self.failure is None:
            self.failure = exc
            asyncio.ensure_future(self.stop())

    async def serve_forever(self) -> None:
        """Wait until stopped; raise what stopped the broker, if it stopped itself."""
        await self._stopped.wait()
        if self.failure is not None:
            raise self.failure


def install_uvloop() -> str:
    """Use uvloop when installed; returns the loop's name."""
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


def run(config: ServerConfig) -> None:
    """Run a broker until SIGTERM / SIGINT."""
    loop_name = install_uvloop()

    async def main() -> None:
        server = Server(config)
        await server.start()
        log.info("event loop: %s", loop_name)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(server.stop()))
        await server.serve_forever()

    asyncio.run(main())
