"""The sandbox's way to the egress proxy: a loopback TCP port bridged to the job's unix socket.

This file runs INSIDE the sandbox (the runtime passes its source to the image's interpreter with
`-I -S -c`), as the job's own uid, before the program starts:

    python -I -S -c <this source> 127.0.0.1 3128 /run/sandcell/egress/proxy.sock

It binds and listens, then forks: the parent exits 0, so "the command returned" means "the port
accepts connections" and the wrapper can print the ready line without polling. The child serves
every connection from one thread with epoll, so it holds exactly one task of the job's process
budget however many connections are open (a forking relay such as socat would take one per
connection). Only C modules are imported (`_socket`, not `socket`, which pulls in enum and
selectors): under gVisor's ptrace platform every imported file costs, and this way the bridge
starts about as fast as exec'ing socat.

Nothing here is trusted: the program can kill or replace the bridge, and gains nothing by it;
the only thing behind the unix socket is the job's own proxy.
"""

import _socket
import os
import select
import sys

CHUNK = 64 * 1024
BACKLOG = 128
READ, WRITE = select.EPOLLIN | select.EPOLLRDHUP, select.EPOLLOUT


class Pipe:
    """One direction of a connection: bytes read from `src`, written to `dst`."""

    def __init__(self, src: _socket.socket, dst: _socket.socket) -> None:
        self.src, self.dst = src, dst
        self.pending = b""  # read from src, not yet accepted by dst
        self.eof = False  # src sent FIN (or is gone); passed on once pending is written


class Bridge:
    def __init__(self, listener: _socket.socket, target: str) -> None:
        self.listener, self.target = listener, target
        self.poll = select.epoll()
        self.pipes: dict[int, Pipe] = {}  # by src fd: the pipe that reads from that socket
        self.watched: set[int] = set()
        self.poll.register(listener.fileno(), select.EPOLLIN)

    def serve(self) -> None:
        while True:
            events = self.poll.poll()
            for fd, mask in events:
                if fd in self.pipes:
                    self.on_event(fd, mask)
            # Accept last: a socket closed above may free an fd number that a stale event of
            # this same batch still names.
            if any(fd == self.listener.fileno() for fd, _ in events):
                self.accept()

    def accept(self) -> None:
        try:
            fd, _ = self.listener._accept()  # type: ignore[attr-defined]  # no accept() here
        except OSError:
            return
        client = _socket.socket(fileno=fd)
        upstream = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            upstream.connect(self.target)  # local and immediate: no need to do it async
        except OSError:
            client.close()
            upstream.close()
            return
        for sock in (client, upstream):
            sock.setblocking(False)
            self.poll.register(sock.fileno(), READ)
            self.watched.add(sock.fileno())
        self.pipes[client.fileno()] = Pipe(client, upstream)
        self.pipes[upstream.fileno()] = Pipe(upstream, client)

    def on_event(self, fd: int, mask: int) -> None:
        pipe = self.pipes[fd]
        back = self.pipes[pipe.dst.fileno()]  # the pipe that writes to this socket
        try:
            if mask & select.EPOLLHUP:
                self.hang_up(pipe, back)
                return
            if mask & WRITE:
                self.flush(back)
            if fd not in self.pipes:  # that was the end of the connection
                return
            if mask & (READ | select.EPOLLERR) and not pipe.pending and not pipe.eof:
                self.pump(pipe)
        except BlockingIOError:
            pass  # a spurious wakeup: nothing to do until the next one
        except OSError:
            self.close(pipe)

    def pump(self, pipe: Pipe) -> None:
        pipe.pending = pipe.src.recv(CHUNK)
        pipe.eof = not pipe.pending
        self.flush(pipe)

    def hang_up(self, pipe: Pipe, back: Pipe) -> None:
        """src's peer closed both ways: deliver what is left to read from it, then close.

        epoll reports HUP until the socket is closed, whatever it is registered for, so src
        leaves the poll set now; nothing can be written to it any more either.
        """
        self.unwatch(pipe.src)
        back.pending, back.eof = b"", True
        while not pipe.eof:
            data = pipe.src.recv(CHUNK)
            pipe.pending += data
            pipe.eof = not data
        self.flush(pipe)

    def flush(self, pipe: Pipe) -> None:
        """Write what `pipe` holds; back-pressure: src is not read until dst took it all."""
        if pipe.pending:
            try:
                sent = pipe.dst.send(pipe.pending)
            except BlockingIOError:
                sent = 0
            pipe.pending = pipe.pending[sent:]
        if pipe.pending or not pipe.eof:
            self.watch(pipe)
        elif self.pipes[pipe.dst.fileno()].eof:  # both directions are done
            self.close(pipe)
        else:
            pipe.dst.shutdown(_socket.SHUT_WR)  # pass the FIN on
            self.watch(pipe)

    def watch(self, pipe: Pipe) -> None:
        """Read a socket only while its pipe holds nothing; ask for WRITE while one waits."""
        back = self.pipes[pipe.dst.fileno()]
        for reading, writing in ((pipe, back), (back, pipe)):
            fd = reading.src.fileno()
            if fd in self.watched:
                wants_read = not reading.pending and not reading.eof
                self.poll.modify(
                    fd, (READ if wants_read else 0) | (WRITE if writing.pending else 0)
                )

    def unwatch(self, sock: _socket.socket) -> None:
        fd = sock.fileno()
        if fd in self.watched:
            self.watched.discard(fd)
            self.poll.unregister(fd)

    def close(self, pipe: Pipe) -> None:
        for sock in (pipe.src, pipe.dst):
            self.unwatch(sock)
            self.pipes.pop(sock.fileno(), None)
            sock.close()


def listen(host: str, port: int) -> _socket.socket:
    listener = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    listener.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(BACKLOG)
    listener.setblocking(False)
    return listener


def detach() -> None:
    """Parent: say the child's pid and exit 0 (the port is listening). Child: let go of stdio."""
    child = os.fork()
    if child:
        os.write(1, b"%d\n" % child)  # for tests on the host; the runtime discards it
        os._exit(0)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):  # stdout and stderr are the program's: never write to them
        os.dup2(null, fd)
    os.close(null)


def main(argv: list[str]) -> None:
    host, port, target = argv[1], int(argv[2]), argv[3]
    listener = listen(host, port)
    detach()
    Bridge(listener, target).serve()


if __name__ == "__main__":
    main(sys.argv)
