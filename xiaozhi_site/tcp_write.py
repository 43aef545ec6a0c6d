"""Twisted's TCP writes, sent at once when nothing is queued, keeping the interpreter lock
(issue 17, P1).

Sent at once. Twisted never writes from `transport.write`: it queues the bytes, registers the
socket for writability (`epoll_ctl`), and sends them on the next turn of the loop, then
unregisters (`epoll_ctl` again). Every downlink Opus frame (one `write` each) paid two extra
system calls, a loop turn of delay and the writable-socket dispatch: py-spy at P1 with 200
devices talking found a quarter of the event loop's samples in that path (`add_writer` →
`selector.modify` and `doWrite`). Here a write whose connection has nothing queued goes to
the socket at once, as asyncio's own transports do; whatever the kernel does not take (a slow
reader, a full buffer) is queued in Twisted's buffers and sent in order by its usual path,
and a failed send is left to that path too, which reports the lost connection as before.

Keeping the lock. Python's `socket.send` gives the interpreter lock up around the system
call. In a worker whose hearing and encoding threads are busy, each give-up can hand the lock
to one of them, and the loop then waits for that thread's next release, up to the switch
interval (5 ms), before it goes on: py-spy at P1 with 200 devices talking found a fifth of the
loop's samples in the sends, nearly all of it waiting for the lock, with replies sending ~10
frames each. A non-blocking send takes microseconds, so here it calls libc's `send` through
`ctypes.PyDLL` (which keeps the lock) with `MSG_DONTWAIT`: it cannot block whatever the
socket's state. Measured on the 2-core Intel machine (docs/performance.md, session 38): P1 at
200 devices p99 17.7-25.3 ms against 23.5-32.4 ms, better in 6 interleaved pairs of 6 (in 4 of
them the reads kept the lock too; in the slower hour 24.6-52.3 against 50.8-86.9). Reads keep
Python's `recv`: the loop keeping the lock there too made the hearing later at 400-600
streaming devices (there the loop's reads are most of its work, and the hearing thread
waits for them instead).

TLS connections keep Twisted's write (the TLS layer owns the bytes). Platforms other than
Linux, whose flags this call assumes, send with Python's `send`.

`install()` is idempotent; xiaozhi_site.asgi applies it with the other daphne patches.
"""
from __future__ import annotations

import ctypes
import errno
import socket
import sys
from typing import Any

NATIVE = sys.platform.startswith("linux")  # libc's send with Linux's flags
_FULL = (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS)

if NATIVE:
    _FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL  # never block; a closed peer is an error, not a signal
    _send = ctypes.PyDLL(None, use_errno=True).send  # PyDLL: the call keeps the lock
    _send.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int)
    _send.restype = ctypes.c_ssize_t

_queued_write: Any = None  # Twisted's own write, for what cannot be sent at once


def _send_now(connection: Any, data: bytes) -> int | None:
    """Bytes the kernel took (0 when its buffer is full), None on an error: Twisted's path
    meets the error again and reports the lost connection."""
    if not NATIVE:
        sent = connection.writeSomeData(data)  # Python's send: gives the lock up
        return sent if isinstance(sent, int) else None
    size = min(len(data), connection.SEND_LIMIT)  # as Twisted's own send: a bounded copy under the lock
    while True:
        sent = _send(connection.fileno(), data, size, _FLAGS)
        if sent >= 0:
            return sent
        code = ctypes.get_errno()
        if code != errno.EINTR:
            return 0 if code in _FULL else None


def write(self: Any, data: bytes) -> None:
    if (type(data) is bytes and data and not self.TLS and self.connected and not self._writeDisconnected
            and not self.dataBuffer and not self._tempDataBuffer):  # nothing queued: order is kept
        sent = _send_now(self, data)
        if sent == len(data):
            return
        if sent:
            data = data[sent:]
    _queued_write(self, data)


def install() -> None:
    global _queued_write
    from twisted.internet import tcp  # noqa: PLC0415 - the reactor's module, imported by daphne anyway

    if tcp.Connection.write is write:
        return
    _queued_write = tcp.Connection.write
    tcp.Connection.write = write  # type: ignore[method-assign]


def installed() -> bool:
    from twisted.internet import tcp  # noqa: PLC0415

    return tcp.Connection.write is write
