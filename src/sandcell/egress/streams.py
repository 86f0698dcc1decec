"""Byte streams with counting and a connection-wide idle timeout.

Both sides of one proxied connection share an `Activity`, so a long download (bytes only flowing
downstream) does not look idle to the upstream-reading half and vice versa: the connection is
idle only when nothing moved in either direction for `idle_timeout_s`.
"""

import asyncio
import contextlib
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sandcell.egress.audit import Counter

CHUNK = 64 * 1024
T = TypeVar("T")


class IdleTimeout(Exception):
    """Nothing moved on the connection for the idle timeout."""


class Activity:
    def __init__(self, idle_timeout_s: float) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.last = time.monotonic()

    def touch(self) -> None:
        self.last = time.monotonic()

    def remaining(self) -> float:
        return self.last + self.idle_timeout_s - time.monotonic()

    async def bounded(self, start: Callable[[], Awaitable[T]]) -> T:
        """Run `start()`, raising IdleTimeout once the whole connection has been idle.

        When the wait times out but the other direction moved meanwhile, the operation is simply
        started again: cancelling a stream read or drain loses no data.
        """
        while True:
            try:
                async with asyncio.timeout(max(self.remaining(), 0)):
                    return await start()
            except TimeoutError:
                if self.remaining() <= 0:
                    raise IdleTimeout from None


class Side:
    """One end of a proxied connection: the sandbox's socket or the upstream's."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        activity: Activity,
        counter: Counter | None = None,
    ) -> None:
        self.reader, self.writer, self.activity = reader, writer, activity
        self.counter = counter or Counter()

    async def recv(self) -> bytes:
        """Up to CHUNK bytes; b"" at end of stream."""
        data = await self.activity.bounded(lambda: self.reader.read(CHUNK))
        self.counter.received += len(data)
        self.activity.touch()
        return data

    async def send(self, data: bytes) -> None:
        if not data:
            return
        self.writer.write(data)
        self.counter.sent += len(data)
        await self.activity.bounded(self.writer.drain)
        self.activity.touch()

    def write_eof(self) -> None:
        if self.writer.can_write_eof() and not self.writer.is_closing():
            self.writer.write_eof()

    async def start_tls(self, context: ssl.SSLContext, timeout_s: float) -> None:
        await self.writer.start_tls(context, ssl_handshake_timeout=timeout_s)

    async def close(self) -> None:
        self.writer.close()
        # A peer that vanished mid-TLS makes wait_closed raise; the socket is closed either way.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), timeout=1)


async def pipe(source: Side, sink: Side) -> None:
    """Copy bytes until end of stream, then half-close the sink."""
    while data := await source.recv():
        await sink.send(data)
    sink.write_eof()


async def splice(client: Side, upstream: Side) -> None:
    """Copy both ways until both directions ended or either failed."""
    tasks = [
        asyncio.create_task(pipe(client, upstream)),
        asyncio.create_task(pipe(upstream, client)),
    ]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()  # re-raise the first failure
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
