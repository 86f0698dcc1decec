"""Notifications through PostgreSQL LISTEN/NOTIFY, for API replicas and workers on many hosts.

Each process holds one listening connection (a thread that LISTENs on every sandcell channel
and dispatches to its in-process listeners) and one connection to send `pg_notify` on. A
database outage loses notifications: the listener reconnects with a back-off and then wakes
every listener once (payload ANY), and the fallback polls cover the gap.
"""

import logging
import threading

import psycopg
from psycopg import sql

from sandcell.ports.notify import ANY, CHANNELS, Listener, LocalNotifier, Unlisten

log = logging.getLogger("sandcell.notify")
RECEIVE_TICK_S = 0.5  # how soon the listening thread notices close()
RETRY_S = 1.0


def libpq_url(url: str) -> str:
    """SQLAlchemy's `postgresql+psycopg://` URL as libpq takes it."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


class PostgresNotifier:
    def __init__(self, url: str, channels: tuple[str, ...] = CHANNELS) -> None:
        self._url = libpq_url(url)
        self._channels = channels
        self._local = LocalNotifier()
        self._send_lock = threading.Lock()
        self._sender: psycopg.Connection[tuple[object, ...]] | None = None
        self._closed = threading.Event()
        self._listening = threading.Event()
        self._thread = threading.Thread(target=self._receive, name="notify-pg", daemon=True)
        self._thread.start()

    def wait_listening(self, timeout_s: float) -> bool:
        """Whether the LISTEN is in place (so a NOTIFY sent from now on arrives)."""
        return self._listening.wait(timeout_s)

    def notify(self, channel: str, payload: str = ANY) -> None:
        with self._send_lock:
            try:
                if self._sender is None or self._sender.closed:
                    self._sender = psycopg.connect(self._url, autocommit=True, connect_timeout=5)
                self._sender.execute("SELECT pg_notify(%s, %s)", (channel, payload))
            except psycopg.Error as exc:  # a hint lost; the fallback poll covers it
                log.warning("notification on %s not sent: %s", channel, exc)
                self._drop_sender()

    def listen(self, channel: str, listener: Listener) -> Unlisten:
        return self._local.listen(channel, listener)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(RECEIVE_TICK_S * 4)
        with self._send_lock:
            self._drop_sender()
        self._local.close()

    def _drop_sender(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None

    def _receive(self) -> None:
        while not self._closed.is_set():
            try:
                self._listen_until_closed()
            except psycopg.Error as exc:
                log.warning("notification listener lost the database: %s", exc)
            self._listening.clear()
            self._closed.wait(RETRY_S)

    def _listen_until_closed(self) -> None:
        with psycopg.connect(self._url, autocommit=True, connect_timeout=5) as conn:
            for channel in self._channels:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            self._listening.set()
            for channel in self._channels:  # whatever was sent while we were not listening
                self._local.notify(channel, ANY)
            while not self._closed.is_set():
                for note in conn.notifies(timeout=RECEIVE_TICK_S):
                    self._local.notify(note.channel, note.payload)
