"""Presence services: online state and last-seen, without a DB write per audio frame.

A connecting socket claims the device (`device_connection_claim`: its session id and
channel name, handing back the previous connection's channel so the consumer can replace
it) and marks it online in the same UPDATE: the socket is authenticated by then, and a
second write at hello cost every device of a reboot storm another UPDATE and thread hop
(~0.5 ms of CPU on the interpreter lock the other devices need; docs/performance.md,
session 40). The session calls `device_touch` at most once a minute, and the consumer's
offline writer (presence_writer.py) calls `devices_mark_offline` in batches when sockets
close. A crash leaves rows online; `device_mark_all_offline` at start-up (single machine)
and `device_mark_stale_offline` from Celery beat (several machines) clean them up.

A row belongs to the session whose id it holds: writes of an older session (a socket
closing late) change nothing.
"""
from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from devices.models import Device

# A live session touches its row at least this often; rows older than 3x are stale.
TOUCH_INTERVAL_SECONDS = 60
_CLAIM_ATTEMPTS = 5


def device_connection_claim(*, device_id: int, session_id: str, channel_name: str, expected: str | None = None) -> str:
    """Make `session_id` / `channel_name` the device's live connection, online from now;
    returns the channel of the connection it replaces ("" if none).

    Compare-and-set on the channel name, so of two sockets connecting at once (in any
    processes) each learns the channel of the one before it and exactly one ends up live.
    `expected` is the channel the caller just read on the row (the authentication's read):
    tried first, it saves the SELECT when nothing changed in between (one UPDATE per connect).
    """
    now = timezone.now()
    claim = dict(zip(_CLAIM_FIELDS, (channel_name, session_id, True, now, now), strict=True))
    if expected is not None and _claim_if(device_id, expected, claim):
        return expected
    rows = Device.objects.filter(pk=device_id)
    for _ in range(_CLAIM_ATTEMPTS):
        # [:1] without ORDER BY: .first() would sort by the model's ordering for one row.
        found = list(rows.order_by().values_list("channel_name", flat=True)[:1])
        if not found:
            return ""
        previous = found[0]
        if rows.filter(channel_name=previous).update(**claim):
            return previous
    rows.update(**claim)  # lost every race: still take it
    return ""


# What a claim writes: the live connection, and the device online from now.
_CLAIM_FIELDS = ("channel_name", "session_id", "is_online", "online_since", "last_seen_at")
_CLAIM_SQL: dict[str, str] = {}  # per database vendor


def _claim_if(device_id: int, expected: str, claim: dict[str, object]) -> bool:
    """`Device.objects.filter(pk=…, channel_name=expected).update(**claim)` as plain SQL: every
    connecting device runs it, and the ORM's building of the UPDATE cost more than the
    statement itself (a reboot storm)."""
    connection = connections[router.db_for_write(Device)]
    meta = Device._meta
    values = [meta.get_field(name).get_db_prep_save(claim[name], connection)  # type: ignore[union-attr]
              for name in _CLAIM_FIELDS]
    with connection.cursor() as cursor:
        cursor.execute(_claim_sql(connection), (*values, device_id, expected))
        return bool(cursor.rowcount)


def _claim_sql(connection: BaseDatabaseWrapper) -> str:
    """The claim's UPDATE for the connection's database, built once (the columns never change)."""
    sql = _CLAIM_SQL.get(connection.vendor)
    if sql is None:
        quote, meta = connection.ops.quote_name, Device._meta

        def column(name: str) -> str:
            return quote(meta.get_field(name).column or name)  # type: ignore[union-attr]

        assignments = ", ".join(f"{column(name)} = %s" for name in _CLAIM_FIELDS)
        where = f"{column('id')} = %s AND {column('channel_name')} = %s"
        sql = _CLAIM_SQL[connection.vendor] = f"UPDATE {quote(meta.db_table)} SET {assignments} WHERE {where}"
    return sql


def device_touch(*, device_id: int) -> None:
    Device.objects.filter(pk=device_id).update(last_seen_at=timezone.now())


def devices_mark_offline(*, session_ids: Iterable[str]) -> int:
    """Closed sessions' devices offline, in one UPDATE. Only the session that claimed a row may
    take it offline: a device that reconnected quickly is not marked offline by its previous
    socket closing late."""
    return Device.objects.filter(session_id__in=list(session_ids)).update(
        is_online=False, last_seen_at=timezone.now(), channel_name="",
    )


def device_mark_all_offline() -> int:
    return Device.objects.filter(is_online=True).update(is_online=False, channel_name="")


def device_mark_stale_offline() -> int:
    cutoff = timezone.now() - timedelta(seconds=3 * TOUCH_INTERVAL_SECONDS)
    return Device.objects.filter(is_online=True, last_seen_at__lt=cutoff).update(is_online=False, channel_name="")
