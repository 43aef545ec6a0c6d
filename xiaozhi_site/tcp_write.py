"""Twisted's TCP writes, sent at once when nothing is queued (issue 17, P1).

Twisted never writes from `transport.write`: it queues the bytes, registers the socket for
writability (`epoll_ctl`), and sends them on the next turn of the loop, then unregisters
(`epoll_ctl` again). Every downlink Opus frame (one `write` each) paid two extra system calls,
a loop turn of delay and the writable-socket dispatch: py-spy at P1 with 200 devices talking
found a quarter of the event loop's samples in that path (`add_writer` → `selector.modify`
and `doWrite`). Here a write whose connection has nothing queued goes to the socket at once,
as asyncio's own transports do; whatever the kernel does not take (a slow reader, a full
buffer) is queued in Twisted's buffers and sent in order by its usual path, and a failed send
is left to that path too, which reports the lost connection as before. TLS connections keep
Twisted's write (the TLS layer owns the bytes).

`install()` is idempotent; xiaozhi_site.asgi applies it with the other daphne patches.
"""
from __future__ import annotations

from typing import Any

_queued_write: Any = None  # Twisted's own write, for what cannot be sent at once


def write(self: Any, data: bytes) -> None:
    if (type(data) is bytes and data and not self.TLS and self.connected and not self._writeDisconnected
            and not self.dataBuffer and not self._tempDataBuffer):  # nothing queued: order is kept
        sent = self.writeSomeData(data)  # bytes taken, 0 when the socket is full, or an error
        if isinstance(sent, int):
            if sent == len(data):
                return
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
