"""Twisted's TCP reads and writes on plain sockets, made cheaper for the event loop (issue 17, P1).

Writes sent at once. Twisted never writes from `transport.write`: it queues the bytes,
registers the socket for writability (`epoll_ctl`), and sends them on the next turn of the
loop, then unregisters (`epoll_ctl` again). Every downlink Opus frame (one `write` each) paid
two extra system calls, a loop turn of delay and the writable-socket dispatch: py-spy at P1
with 200 devices talking found a quarter of the event loop's samples in that path
(`add_writer` → `selector.modify` and `doWrite`). Here a write whose connection has nothing
queued goes to the socket at once, as asyncio's own transports do; whatever the kernel does
not take (a slow reader, a full buffer) is queued in Twisted's buffers and sent in order by
its usual path, and a failed send is left to that path too, which reports the lost connection
as before.

Reads and writes that keep the interpreter lock. CPython's `socket.recv` and `socket.send`
give the lock up around the system call. The loop's thread makes one per frame read and one
per frame sent, and in a worker whose hearing and encoding threads are busy each give-up
hands the lock to one of them: the loop then waits for that thread's next release, up to the
switch interval (5 ms), before it can go on (py-spy at P1 with 200 devices talking: a fifth of
the loop's busy samples were the sends alone, nearly all of it waiting for the lock, and the
turns' tails were loop turns of 10-30 ms). A non-blocking call on a socket epoll reported
ready takes microseconds; here both call libc through `ctypes.PyDLL` (which keeps the lock)
with `MSG_DONTWAIT`, so neither can block whatever the socket's state. Measured on the
2-core Intel machine (docs/performance.md, session 38): P1 200 devices p99 24.6-52.3 ms
against 50.8-86.9 ms, interleaved, with P2 and the overload no worse.

TLS connections keep Twisted's own read and write (the TLS layer owns the bytes). On platforms
other than Linux, whose flags and libc these calls assume, reads are Twisted's and writes use
Python's `send`. Both run on the reactor's
thread only, which is what lets one read buffer serve every connection.

`install()` is idempotent; xiaozhi_site.asgi applies it with the other daphne patches.
"""
from __future__ import annotations

import ctypes
import errno
import socket
import sys
from typing import Any

NATIVE = sys.platform.startswith("linux")  # libc's recv/send with Linux's flags
_AGAIN = (errno.EAGAIN, errno.EWOULDBLOCK)
_READ_SIZE = 65536  # Twisted's own `bufferSize`
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_SEND_FLAGS = _DONTWAIT | getattr(socket, "MSG_NOSIGNAL", 0)  # a closed peer is an error, not a signal


def _libc_call(name: str, buffer_type: Any) -> Any:
    function = getattr(ctypes.PyDLL(None, use_errno=True), name)  # PyDLL: the call keeps the lock
    function.argtypes = (ctypes.c_int, buffer_type, ctypes.c_size_t, ctypes.c_int)
    function.restype = ctypes.c_ssize_t
    return function


if NATIVE:
    _recv, _send = _libc_call("recv", ctypes.c_void_p), _libc_call("send", ctypes.c_char_p)
    _read_buffer = ctypes.create_string_buffer(_READ_SIZE)  # the reactor's thread only

_queued_write: Any = None  # Twisted's own write, for what cannot be sent at once
_twisted_read: Any = None  # Twisted's own read, for TLS


def _send_now(connection: Any, data: bytes) -> int | None:
    """Bytes the kernel took (0 when its buffer is full), None on an error: Twisted's path
    meets the error again and reports the lost connection."""
    if not NATIVE:
        sent = connection.writeSomeData(data)  # Python's send: gives the lock up
        return sent if isinstance(sent, int) else None
    size = min(len(data), connection.SEND_LIMIT)
    while True:
        sent = _send(connection.fileno(), data, size, _SEND_FLAGS)
        if sent >= 0:
            return sent
        code = ctypes.get_errno()
        if code != errno.EINTR:
            return 0 if code in _AGAIN or code == errno.ENOBUFS else None


def write(self: Any, data: bytes) -> None:
    if (type(data) is bytes and data and not self.TLS and self.connected and not self._writeDisconnected
            and not self.dataBuffer and not self._tempDataBuffer):  # nothing queued: order is kept
        sent = _send_now(self, data)
        if sent == len(data):
            return
        if sent:
            data = data[sent:]
    _queued_write(self, data)


def read(self: Any) -> Any:
    """Twisted's `doRead`: the protocol gets what one read brings; None, or why the
    connection ended (the peer closed it, or it failed)."""
    if not NATIVE or self.TLS:
        return _twisted_read(self)
    from twisted.internet import main  # noqa: PLC0415 - the reactor's module, imported by daphne anyway

    while True:
        got = _recv(self.fileno(), _read_buffer, min(self.bufferSize, _READ_SIZE), _DONTWAIT)
        if got > 0:
            return self._dataReceived(ctypes.string_at(_read_buffer, got))
        if got == 0:
            return main.CONNECTION_DONE
        code = ctypes.get_errno()
        if code != errno.EINTR:
            return None if code in _AGAIN else main.CONNECTION_LOST


def install() -> None:
    global _queued_write, _twisted_read
    from twisted.internet import tcp  # noqa: PLC0415

    if tcp.Connection.write is write:
        return
    _queued_write, _twisted_read = tcp.Connection.write, tcp.Connection.doRead
    tcp.Connection.write = write  # type: ignore[method-assign]
    tcp.Connection.doRead = read  # type: ignore[method-assign]


def installed() -> bool:
    from twisted.internet import tcp  # noqa: PLC0415

    return tcp.Connection.write is write and tcp.Connection.doRead is read
