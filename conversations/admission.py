"""Admission: past its capacity a web process refuses *new* device sockets (1013, the firmware
retries) so the devices it already holds stay real time.

Without it, overload is shared by everyone: every session's hearing falls behind, queues drop
packets of every device and the event loop stops answering pings (docs/performance.md,
"Overload"). Two signals, both per process (each worker admits for itself):

- **Sessions streaming**: sessions whose microphone is open (state "listening"), plus the
  sockets admitted in the last `ARRIVING_SECONDS` that have not opened it yet (a device that
  connects is about to talk: its authentication, hello and `listen start` take a moment, longer
  under load, and a count that missed them let 10 % more devices in than the limit in the
  overload benchmark). At `XIAOZHI_MAX_STREAMING_SESSIONS` (0: no limit) new devices are refused.
- **Lag**: how late a 50 ms timer on the event loop fires, and how long an empty job waits
  in the hearing's CPU pool (conversations/pipeline/cpu_pool.py) behind the decode + VAD
  groups of every session: the larger of the two is the delay a new packet would see. When
  `OVER_SAMPLES` samples in a row (0.3 s) are over `XIAOZHI_ADMISSION_MAX_LAG_MS` (0: off),
  new devices are refused, and keep being refused until the lag has stayed under it for
  `RECOVER_SECONDS`. One slow moment (a model loading, a full garbage collection) is not
  overload.

A refusal touches no database and makes no session. Under daphne it is decided before any
consumer is made (`refusal_before_application`, the server's gate in xiaozhi_site/
ws_fastpath.py), and for a request whole in the connection's first read before daphne parses
it (`upgrade_refusal`): what is left is the TCP accept, one write and the close, ~1.6 ms of the
server's CPU per refused device arriving on session 42's machine (2.2 with daphne's parsing
and autobahn's handshake, 4.0-4.4 through a consumer on session 32's; docs/performance.md). An
admitted device costs more while it arrives (~5-8.5 ms for its connect, hello and MCP
handshake, by machine).

**Pacing.** Those costs fall on the same interpreter lock as the hearing: twice the capacity
arriving in 10 s kept the admitted devices' hearing late for the whole arrival (P2 overload,
p99 519 ms on session 33's machine, although the same devices streaming alone were at 12 ms).
So the watcher also reads the hearing's own lag every tick (the mean over the batches
delivered, each batch's oldest packet: `CpuMill.take_lag`) and tells the server how many new
connections it may take (`pace`, set by the server with `set_pace`; xiaozhi_site/listening.py
under daphne): none while that lag is over `XIAOZHI_ADMISSION_HOLD_LAG_MS` (10 ms; 0: off), so
new connections wait in the kernel's queue at no cost (the firmware allows 10 s for the TCP
connection and the upgrade); then `FIRST_BUDGET` in one read once the hearing is on time,
`FIRST_BUDGET` more every tick on time, until `FREE_BUDGET` ends the pacing. A hold lasts at
most `MAX_HOLD_SECONDS`. A hearing late for longer is overload whatever the streaming count
says (a limit set above what the machine carries): the new devices are refused with 1013 until
it is on time again, and the server takes the waiting connections by their deadlines (below,
"Refusals"; `FIRST_BUDGET` for every tick's worth of time where it cannot count its queue:
the ticks themselves come late then), so the admin and the check-ins still get in and the
devices waiting in the kernel's queue hear their 1013 within the firmware's 10 s (at 2 × 650
on a machine that carries 300-400, 622 of 650 refusals used to time out there instead).

**Set-ups.** Pacing reads a lag that is already there, and at twice the capacity arriving in
10 s the last admissions still made it: a worker near its streaming limit spent the CPU it had
left on the newcomers' authentication, session set-up, hello and MCP handshake (~5 ms each on
top of the ~3 ms the upgrade costs), and the admitted devices' hearing fell 100-150 ms behind
(docs/performance.md, session 37). So the last `LAST_PLACES_SHARE` of the places fill at a
measured pace: a device admitted into them gets its upgrade at once, then waits
`setup_delay` (one set-up every `LAST_PLACES_FILL_SECONDS` / their number, at most
`MAX_SETUP_SPACING` apart; 83 ms at a limit of 200) before its session is set up and its hello
answered. A lone arrival waits at most one spacing, a burst at most ~5 s, within the
firmware's 10 s for the server's hello; a device that leaves while it waits is set up and
closed at its turn.

**Refusals.** Once a worker's places are full, everyone who arrives is refused, and at twice the
capacity arriving in 10 s those refusals came at the rate the devices arrived, each an accept, a
read, a write and a close on the interpreter lock the full worker's hearing needs, plus the
generator's half of the loopback TCP in the benchmark (~0.7 + ~1.3 ms a refused device on session
45's machine) at the moment the machine had least to spare. The firmware gives the TCP connection
and the upgrade 10 s. So while the worker is full, the connections waiting in its listening
socket's queue (`WaitingLine`: the kernel's count, read every tick, and when each was first seen)
are taken at the rate that answers each within `REFUSAL_DEADLINE_S` of its arrival if no more
came, and at least `REFUSALS_AT_ONCE` a tick: a lone device hears its 1013 at once, a burst is
answered over the deadline instead of as it comes. A place freed meanwhile goes to the oldest
waiting. The trickle of a hearing late for long is taken the same way. Meanwhile everything
else arriving on the port (a check-in, the admin) waits in the same queue, up to the same
deadline.

The watcher is one timer per process, started by the first device socket.
"""
from __future__ import annotations

import asyncio
import logging
import math
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from devices.protocol.close_codes import CloseCode

logger = logging.getLogger(__name__)

TICK_SECONDS = 0.05
COUNT_EVERY_TICKS = 6  # sessions are counted every 0.3 s (O(sessions)); lag is sampled every tick
RECOVER_SECONDS = 2.0
OVER_SAMPLES = 6  # 0.3 s of lag in a row
ARRIVING_SECONDS = 5.0  # an admitted socket holds its place this long before it must be listening
MAX_HOLD_SECONDS = 1.0  # new connections wait at most this long in a row, then a few are taken
FIRST_BUDGET = 2  # new connections taken in the first tick after a hold, and more in every tick on time
FREE_BUDGET = 32  # the budget at which pacing ends (0.8 s on time after a hold)
MAX_TRICKLE_TICKS = 8  # a late loop's trickle: at most this many ticks' worth in one read
LAST_PLACES_SHARE = 0.3  # the last 30 % of the streaming places...
LAST_PLACES_FILL_SECONDS = 5.0  # ...take this long to fill when all are wanted at once...
MAX_SETUP_SPACING = 0.25  # ...with set-ups never spaced more than this (small limits)
REFUSAL_DEADLINE_S = 5.0  # full: a waiting connection hears its 1013 within this (the firmware waits 10 s)
REFUSALS_AT_ONCE = 1  # full: connections taken every tick whatever the deadlines say


@dataclass(frozen=True)
class Limits:
    max_streaming: int = 0  # 0: no limit
    max_lag_ms: float = 0.0  # 0: not watched
    hold_lag_ms: float = 0.0  # 0: new connections are never held


# How many new connections the server may accept until told again: 0 (they wait in the kernel's
# queue), n (in one read), None (any number).
Pace = Callable[[int | None], None]


# This process's listening sockets as the kernel counts them: (connections waiting in their
# queues, connections accepted from them so far).
Line = Callable[[], tuple[int, int]]


class WaitingLine:
    """The connections waiting in the kernel's queue, oldest first, by the tick at which each
    was first counted (the queue is first in, first out). Fed the kernel's two counts every
    tick: what arrived is what was accepted plus what waits."""

    def __init__(self) -> None:
        self._groups: deque[list[float]] = deque()  # [first counted at, how many], oldest first
        self._arrived: int | None = None  # accepted + waiting at the last count
        self._accepted = 0

    @property
    def waiting(self) -> int:
        return int(sum(count for _, count in self._groups))

    def count(self, waiting: int, accepted: int, now: float) -> None:
        arrived = accepted + waiting
        if self._arrived is None:  # the first count: whatever waits arrived now, as far as we know
            self._arrived, self._accepted = accepted, accepted
        if arrived > self._arrived:
            self._groups.append([now, arrived - self._arrived])
        self._arrived = max(self._arrived, arrived)
        self._drop(accepted - self._accepted)
        self._accepted = accepted
        self._drop(self.waiting - waiting)  # gone from the queue unaccepted (reset), or miscounted

    def _drop(self, count: int) -> None:
        """The oldest `count` leave the line."""
        while count > 0 and self._groups:
            taken = min(count, int(self._groups[0][1]))
            self._groups[0][1] -= taken
            count -= taken
            if not self._groups[0][1]:
                self._groups.popleft()

    def rate_due(self, deadline_s: float, now: float) -> float:
        """Connections a second to take so that every one waiting is taken within `deadline_s`
        of being counted, if no more came: for the oldest k, k over the time the k-th has left."""
        rate, ahead = 0.0, 0.0
        for seen, count in self._groups:
            ahead += count
            rate = max(rate, ahead / max(TICK_SECONDS, deadline_s - (now - seen)))
        return rate


class HoldsPlace(Protocol):
    def holds_streaming_place(self, now: float, arriving_s: float) -> bool: ...


def streaming_places(sockets: Iterable[HoldsPlace], now: float) -> int:
    """How many of this process's device sockets count against the streaming limit: listening,
    or admitted less than `ARRIVING_SECONDS` ago and not listening yet."""
    return sum(1 for socket in sockets if socket.holds_streaming_place(now, ARRIVING_SECONDS))


class Admission:
    """The decision for one process. `admit()` on every new device socket; the watcher (or a
    test) feeds it `observe_lag` and `observe_streaming`."""

    def __init__(self, limits: Limits, count_streaming: Callable[[], int] | None = None,
                 pool_probe: Callable[[], Awaitable[object]] | None = None,
                 hearing_lag: Callable[[], float] | None = None, pace: Pace | None = None,
                 line: Line | None = None) -> None:
        self.limits = limits
        self._sockets: weakref.WeakSet[HoldsPlace] = weakref.WeakSet()  # admitted, still open or not yet collected
        self._count_streaming = count_streaming or (lambda: streaming_places(self._sockets, _loop_time()))
        self._pool_probe = pool_probe
        self._hearing_lag = hearing_lag
        self._pace = pace
        self._line = line  # the listening sockets' counts, where the server has them
        self.waiting = WaitingLine()
        self._refusal_credit = 0.0  # connections due to be taken, not yet whole
        self._due_this_tick = 0.0  # connections the waiting line's deadlines ask for, this tick
        self._line_seen_at: float | None = None  # loop time of the last count of the line
        self._pacing_refusals = False
        self.full_spells = 0  # times the places filled with the refusals' pacing on
        self.accept_budget: int | None = None  # new connections the server may take next tick (None: any)
        self._held_since = 0.0
        self._trickling = False  # late for longer than a hold: newcomers are refused
        self._hearing_seen_at: float | None = None  # loop time of the last hearing sample
        self.holds = 0  # times new connections were held
        self.streaming = 0  # at the last count
        self.admitted_since_count = 0
        self.lag_ms = 0.0  # the last sample
        self._lagging_until = 0.0  # loop time until which the lag keeps refusing
        self._over = 0  # samples in a row over the limit
        self.refused = 0
        self._next_setup = 0.0  # loop time before which no device of the last places is set up
        self._task: asyncio.Task[None] | None = None

    # -- the decision -------------------------------------------------------------------------

    def refusal(self, now: float) -> str | None:
        """Why a new device must wait right now, or None."""
        limits = self.limits
        if limits.max_streaming and self._places_held() >= limits.max_streaming:
            return "server busy: streaming capacity reached"
        if limits.max_lag_ms and now < self._lagging_until:
            return "server busy: overloaded"
        if self._trickling:  # the hearing late for longer than a hold: no newcomer is on time
            return "server busy: overloaded"
        return None

    def _places_held(self) -> int:
        """Streaming places taken: at the last count, and admitted since."""
        return self.streaming + self.admitted_since_count

    def turn_away(self) -> str | None:
        """Why a new device socket is refused right now (counted, and logged once per burst),
        or None: it may go on to `admit`."""
        self.ensure_watching()
        reason = self.refusal(_loop_time())
        if reason is not None:
            self.refused += 1
            if self.refused == 1 or self.refused % 100 == 0:  # one line per burst, not per device
                logger.warning("device refused: over capacity", extra={
                    "reason": reason, "refused": self.refused, "streaming": self.streaming,
                    "lag_ms": round(self.lag_ms, 1)})
        return reason

    def admit(self, socket: HoldsPlace | None = None) -> str | None:
        """Take a place for a new device socket; returns the refusal reason instead if full.
        The socket, once admitted, is counted until it says it holds no place."""
        reason = self.turn_away()
        if reason is not None:
            return reason
        self.admitted_since_count += 1
        if socket is not None and self.limits.max_streaming:  # only a streaming limit counts them
            self._sockets.add(socket)
        return None

    def setup_delay(self, now: float) -> float:
        """Seconds a device just admitted waits before its session is set up (module docstring,
        "Set-ups"): 0, except in the last places, whose set-ups are spaced out."""
        most = self.limits.max_streaming
        if not most or self._places_held() <= most * (1 - LAST_PLACES_SHARE):
            return 0.0
        start = max(self._next_setup, now)
        self._next_setup = start + min(MAX_SETUP_SPACING, LAST_PLACES_FILL_SECONDS / (most * LAST_PLACES_SHARE))
        return start - now

    def withdraw(self) -> None:
        """A socket admitted a moment ago was then refused (its handshake did not authenticate):
        it will not stream, so it does not hold a place until the next count."""
        self.admitted_since_count = max(0, self.admitted_since_count - 1)

    # -- what the watcher sees ----------------------------------------------------------------

    def observe_lag(self, lag_ms: float, now: float) -> None:
        self.lag_ms = lag_ms
        over = bool(self.limits.max_lag_ms) and lag_ms > self.limits.max_lag_ms
        self._over = self._over + 1 if over else 0
        if self._over >= OVER_SAMPLES:
            self._lagging_until = now + RECOVER_SECONDS

    def observe_hearing(self, lag_ms: float, now: float) -> None:
        """The hearing's mean lag over the last tick sets how many new connections the server
        may take until the next (module docstring, "Pacing")."""
        if self._pace is None or not self.limits.hold_lag_ms:
            return
        budget = self.accept_budget
        ticks = self._ticks_since(now)
        if lag_ms > self.limits.hold_lag_ms:
            if budget is None:  # free until now: a hold begins
                self._held_since = now
                self._count_hold(lag_ms)
                budget = 0
            elif now - self._held_since >= MAX_HOLD_SECONDS:
                # Late for long, on time for a tick or two at most since the hold began:
                # overload. Newcomers are refused (`refusal`) and let in to hear it by the
                # clock, not by the tick: a loop whose ticks came 0.3 s apart took 2 connections
                # in 0.3 s, and the devices waiting in the kernel's queue outlived the firmware's
                # 10 s instead of hearing 1013. Where the server counts its queue, by the
                # waiting connections' deadlines instead ("Refusals").
                budget = self._deadline_budget() if self._line is not None else FIRST_BUDGET * ticks
                self._trickling = True
            elif budget > FIRST_BUDGET:  # late again while recovering: held, the hold's clock running on
                self._count_hold(lag_ms)
                budget = 0
        elif budget is not None:
            budget += FIRST_BUDGET  # added, not doubled: 64 or 128 refusals in one read were a 100 ms stall
            self._trickling, self._refusal_credit = False, 0.0
            if budget >= FREE_BUDGET:
                budget = None
        self._set_budget(budget)

    def _set_budget(self, budget: int | None) -> None:
        if self._pace is None or (budget == self.accept_budget and budget in (0, None)):
            return  # still held, or still free: nothing to tell the server
        self.accept_budget = budget
        try:
            self._pace(budget)
        except Exception:  # a server without listening ports, or one that is closing
            logger.exception("pacing new connections failed")

    def observe_line(self, waiting: int, accepted: int, now: float) -> bool:
        """The kernel's counts for the listening sockets (module docstring, "Refusals"). While
        the places are full the budget answers the waiting connections by their deadlines, and
        True is returned: the hearing's pacing resumes once a place is free."""
        last, self._line_seen_at = self._line_seen_at, now
        self.waiting.count(waiting, accepted, now)
        elapsed = TICK_SECONDS if last is None else min(now - last, MAX_TRICKLE_TICKS * TICK_SECONDS)
        self._due_this_tick = self.waiting.rate_due(REFUSAL_DEADLINE_S, now) * elapsed
        most = self.limits.max_streaming
        if self._pace is None or not most or self._places_held() < most:
            if self._pacing_refusals:  # a place is free: a few at a time from here (or free without hearing pacing)
                self._pacing_refusals, self._held_since, self._refusal_credit = False, now, 0.0
                self._set_budget(FIRST_BUDGET if self.limits.hold_lag_ms else None)
            return False
        if not self._pacing_refusals:
            self._pacing_refusals = True
            self.full_spells += 1
            if self.full_spells == 1 or self.full_spells % 50 == 0:  # one line per burst, not per tick
                logger.warning("places full: waiting connections are refused by their deadline", extra={
                    "waiting": waiting, "full_spells": self.full_spells, "deadline_s": REFUSAL_DEADLINE_S})
        self._set_budget(self._deadline_budget())
        return True

    def _deadline_budget(self) -> int:
        """Connections to take this tick so that each one waiting is answered within
        `REFUSAL_DEADLINE_S` of its arrival (`observe_line` counted them), at least
        `REFUSALS_AT_ONCE`."""
        self._refusal_credit += self._due_this_tick
        due = math.floor(self._refusal_credit)
        self._refusal_credit -= due
        return max(REFUSALS_AT_ONCE, due)

    def _ticks_since(self, now: float) -> int:
        """Ticks' worth of time since the last hearing sample (1 at the first), at most
        `MAX_TRICKLE_TICKS`."""
        last, self._hearing_seen_at = self._hearing_seen_at, now
        if last is None:
            return 1
        return max(1, min(MAX_TRICKLE_TICKS, round((now - last) / TICK_SECONDS)))

    def _count_hold(self, lag_ms: float) -> None:
        self.holds += 1
        if self.holds == 1 or self.holds % 50 == 0:  # one line per burst, not per tick
            logger.warning("new connections held: the hearing is late", extra={
                "hearing_lag_ms": round(lag_ms, 1), "holds": self.holds, "streaming": self.streaming})

    def observe_streaming(self, count: int) -> None:
        self.streaming = count
        self.admitted_since_count = 0

    # -- the watcher --------------------------------------------------------------------------

    def ensure_watching(self) -> None:
        if not (self.limits.max_streaming or self.limits.max_lag_ms or self.limits.hold_lag_ms):
            return
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._watch(), name="admission-watcher")

    async def _watch(self) -> None:
        """Runs as long as the loop: a timer every TICK_SECONDS, its lateness (plus the pool
        probe's wait) is the lag."""
        loop = asyncio.get_running_loop()
        tick = 0
        while True:
            due = loop.time() + TICK_SECONDS
            await asyncio.sleep(TICK_SECONDS)
            now = loop.time()
            lag = max(0.0, now - due)
            if self._pool_probe is not None and self.limits.max_lag_ms:
                await self._pool_probe()  # an empty job queued behind the pending hearing work
                lag = max(lag, loop.time() - now)
                now = loop.time()
            self.observe_lag(lag * 1000, now)
            paced = self._line is not None and self.observe_line(*self._line(), now)
            if self._hearing_lag is not None and not paced:
                self.observe_hearing(self._hearing_lag() * 1000, now)
            tick += 1
            if self.limits.max_streaming and tick % COUNT_EVERY_TICKS == 0:
                self.observe_streaming(self._count_streaming())


# The device route's paths (conversations/routing.py serves both, gotcha 13).
DEVICE_PATHS = frozenset({"/xiaozhi/v1/", "/xiaozhi/v1"})


def refusal_before_application(scope: Mapping[str, Any]) -> tuple[int, str] | None:
    """The server's gate (xiaozhi_site/ws_fastpath.py `set_gate`): a device socket arriving past
    capacity is closed with 1013 before any consumer is made for it (~15 % of what a refusal
    cost, docs/performance.md, session 32). The consumer asks `admit` again: under another
    server, and for the sockets let through here."""
    if scope.get("path") not in DEVICE_PATHS:
        return None
    reason = admission().turn_away()
    return None if reason is None else (CloseCode.TRY_AGAIN_LATER, reason)


def _nothing() -> None:
    return None


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


_admission: Admission | None = None
_pace: Pace | None = None
_line: Line | None = None


def set_pace(pace: Pace | None, line: Line | None = None) -> None:
    """How this process paces the connections it accepts, and counts those waiting (the web
    server's; xiaozhi_site.asgi sets daphne's listening ports). Without them, admission only
    refuses."""
    global _pace, _line
    _pace, _line = pace, line


def admission() -> Admission:
    """This process's admission, with the limits from the settings."""
    global _admission
    if _admission is None:
        from django.conf import settings

        from conversations.pipeline.cpu_pool import CpuMill, shared_executor

        limits = Limits(max_streaming=settings.XIAOZHI_MAX_STREAMING_SESSIONS,
                        max_lag_ms=settings.XIAOZHI_ADMISSION_MAX_LAG_MS,
                        hold_lag_ms=settings.XIAOZHI_ADMISSION_HOLD_LAG_MS)
        mill = CpuMill.for_executor(shared_executor())
        _admission = Admission(limits, pool_probe=lambda: mill.run(_nothing), hearing_lag=mill.take_lag,
                               pace=_pace, line=_line)
    return _admission


def reset() -> None:
    """Forget the process's admission (tests change the settings)."""
    global _admission
    if _admission is not None and _admission._task is not None:
        _admission._task.cancel()
    _admission = None
