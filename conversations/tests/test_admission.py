"""Admission past capacity (conversations/admission.py): new devices get 1013, the ones already
connected keep their sessions. The watcher runs on the virtual-time loop, so "lag" is exact."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from conversations import admission as admission_module
from conversations.admission import (
    COUNT_EVERY_TICKS,
    FIRST_BUDGET,
    FREE_BUDGET,
    LAST_PLACES_FILL_SECONDS,
    LAST_PLACES_SHARE,
    MAX_HOLD_SECONDS,
    MAX_TRICKLE_TICKS,
    MAX_SETUP_SPACING,
    OVER_SAMPLES,
    RECOVER_SECONDS,
    REFUSAL_DEADLINE_S,
    REFUSALS_AT_ONCE,
    TICK_SECONDS,
    Admission,
    Limits,
    WaitingLine,
)
from conversations.consumers import DeviceConsumer
from conversations.routing import websocket_urlpatterns
from conversations.tests.test_consumer import (
    PLAIN_HELLO,
    assert_alive,
    close_of,
    headers_for,
    open_socket,
    session_of,
)
from devices.models import Device
from devices.protocol.close_codes import CloseCode
from devices.tests.factories import BoundDeviceFactory

APP = URLRouter(websocket_urlpatterns)


@pytest.fixture(autouse=True)
def fresh_admission() -> Iterator[None]:
    admission_module.reset()
    yield
    admission_module.reset()


# -- the decision ------------------------------------------------------------------------------


async def test_streaming_limit_counts_the_sockets_admitted_since_the_last_count() -> None:
    gate = Admission(Limits(max_streaming=3), count_streaming=lambda: 0)
    gate.observe_streaming(1)
    assert gate.admit() is None
    assert gate.admit() is None  # 1 streaming + 1 just admitted < 3
    assert gate.admit() == "server busy: streaming capacity reached"
    assert gate.refused == 1
    gate.observe_streaming(2)  # counted again: one of the two admitted went quiet
    assert gate.admit() is None
    gate.observe_streaming(3)
    assert gate.admit() is not None


async def test_a_withdrawn_socket_gives_its_place_back_before_the_next_count() -> None:
    gate = Admission(Limits(max_streaming=2), count_streaming=lambda: 0)
    gate.observe_streaming(1)
    assert gate.admit() is None
    gate.withdraw()  # its handshake did not authenticate
    assert gate.admit() is None
    gate.withdraw()
    gate.withdraw()  # never below nothing
    assert gate.admitted_since_count == 0


async def test_no_limits_admit_everyone_and_start_no_watcher() -> None:
    gate = Admission(Limits(), count_streaming=lambda: 10_000)
    gate.observe_lag(60_000.0, 0.0)
    assert all(gate.admit() is None for _ in range(100))
    assert gate._task is None


async def test_one_slow_sample_is_not_overload_but_a_run_of_them_is() -> None:
    gate = Admission(Limits(max_lag_ms=200), count_streaming=lambda: 0)
    now = asyncio.get_running_loop().time()
    for _ in range(OVER_SAMPLES - 1):
        gate.observe_lag(900.0, now)
    gate.observe_lag(10.0, now)  # the run is broken
    gate.observe_lag(900.0, now)
    assert gate.refusal(now) is None
    for _ in range(OVER_SAMPLES - 1):
        gate.observe_lag(900.0, now)
    assert gate.refusal(now) == "server busy: overloaded"
    gate.observe_lag(10.0, now)
    assert gate.refusal(now + RECOVER_SECONDS - 0.01) is not None  # still recovering
    assert gate.refusal(now + RECOVER_SECONDS + 0.01) is None


async def test_new_connections_wait_while_the_hearing_is_late_then_come_in_a_few_at_a_time() -> None:
    paced: list[int | None] = []
    gate = Admission(Limits(hold_lag_ms=20), count_streaming=lambda: 0, pace=paced.append)
    gate.observe_hearing(19.0, 0.0)
    assert paced == [] and gate.accept_budget is None  # on time: any number, nothing to tell
    gate.observe_hearing(35.0, 0.1)
    gate.observe_hearing(40.0, 0.2)  # still late: held already, nothing new to tell
    assert paced == [0]
    budgets = list(range(FIRST_BUDGET, FREE_BUDGET, FIRST_BUDGET))
    for tick in range(len(budgets) + 1):
        gate.observe_hearing(8.0, 0.3 + tick / 10)  # caught up: a budget that grows every tick on time
    assert paced == [0, *budgets, None]
    gate.observe_hearing(9.0, 5.0)
    assert len(paced) == len(budgets) + 2  # free again: nothing to tell
    assert gate.holds == 1


async def test_a_hearing_late_for_long_gets_a_trickle_of_new_connections_not_a_lasting_hold() -> None:
    paced: list[int | None] = []
    gate = Admission(Limits(hold_lag_ms=20), count_streaming=lambda: 0, pace=paced.append)
    held_ticks = round(MAX_HOLD_SECONDS / TICK_SECONDS)
    for tick in range(held_ticks + 3):
        gate.observe_hearing(50.0, tick * TICK_SECONDS)
    assert paced == [0, FIRST_BUDGET, FIRST_BUDGET, FIRST_BUDGET]  # the admin and the check-ins still get in
    gate.observe_hearing(5.0, 2.0)
    gate.observe_hearing(50.0, 2.05)  # one tick on time is no recovery: the trickle goes on
    assert paced[-2:] == [2 * FIRST_BUDGET, FIRST_BUDGET] and gate.holds == 1
    now = 2.05
    while gate.accept_budget is not None:  # on time until free
        now += TICK_SECONDS
        gate.observe_hearing(5.0, now)
    gate.observe_hearing(50.0, now + TICK_SECONDS)  # late again once free: a new hold
    assert paced[-1] == 0 and gate.holds == 2


async def test_a_hearing_late_again_while_recovering_is_held_on_the_same_clock() -> None:
    paced: list[int | None] = []
    gate = Admission(Limits(hold_lag_ms=20), count_streaming=lambda: 0, pace=paced.append)
    gate.observe_hearing(50.0, 0.0)  # held
    for tick in range(1, 3):
        gate.observe_hearing(5.0, tick * TICK_SECONDS)  # on time: 2, then 4
    gate.observe_hearing(50.0, 0.2)  # late again: held, not a new hold
    gate.observe_hearing(50.0, MAX_HOLD_SECONDS)  # a second since the first hold: the trickle
    assert paced[:4] == [0, FIRST_BUDGET, 2 * FIRST_BUDGET, 0] and paced[-1] > 0
    assert gate.holds == 2 and gate.refusal(MAX_HOLD_SECONDS) == "server busy: overloaded"


async def test_a_hearing_late_for_long_refuses_newcomers_and_lets_them_in_by_the_clock() -> None:
    """Past what the machine carries the watcher's ticks come late: a trickle of FIRST_BUDGET a
    tick let in a fraction of the arrivals, which were then admitted, and the rest outlived the
    firmware's 10 s in the kernel's queue instead of hearing 1013."""
    paced: list[int | None] = []
    gate = Admission(Limits(max_streaming=500, hold_lag_ms=20), count_streaming=lambda: 0, pace=paced.append)
    gate.observe_hearing(50.0, 0.0)  # held
    assert gate.refusal(0.5) is None  # a hold alone refuses nobody: the connections wait
    gate.observe_hearing(50.0, MAX_HOLD_SECONDS)  # late for long, and no sample since the hold began
    assert gate.refusal(MAX_HOLD_SECONDS) == "server busy: overloaded"  # places left, none on time
    for tick in range(1, 4):
        gate.observe_hearing(50.0, MAX_HOLD_SECONDS + tick * 4 * TICK_SECONDS)  # ticks 4 ticks apart
    gate.observe_hearing(50.0, 60.0)  # a minute since the last tick
    most = MAX_TRICKLE_TICKS * FIRST_BUDGET  # one read stays small, however long since the last
    assert paced == [0, most, 4 * FIRST_BUDGET, 4 * FIRST_BUDGET, 4 * FIRST_BUDGET, most]  # never held again
    assert gate.holds == 1
    gate.observe_hearing(5.0, 60.05)  # on time: newcomers are admitted again, the budget grows
    assert gate.refusal(60.05) is None and paced[-1] == most + FIRST_BUDGET


async def test_the_last_places_set_up_their_devices_one_spacing_apart() -> None:
    most = 200
    spacing = LAST_PLACES_FILL_SECONDS / (most * LAST_PLACES_SHARE)
    assert spacing < MAX_SETUP_SPACING
    gate = Admission(Limits(max_streaming=most), count_streaming=lambda: 0)
    gate.observe_streaming(int(most * (1 - LAST_PLACES_SHARE)) - 1)
    assert gate.admit() is None and gate.setup_delay(10.0) == 0.0  # the first 70 %: at once
    delays = []
    for _ in range(5):  # a burst into the last places, all at the same moment
        assert gate.admit() is None
        delays.append(gate.setup_delay(10.0))
    assert delays == pytest.approx([0.0, spacing, 2 * spacing, 3 * spacing, 4 * spacing])
    assert gate.admit() is None
    assert gate.setup_delay(10.0 + 4 * spacing) == pytest.approx(spacing)  # behind the burst's last
    assert gate.admit() is None
    assert gate.setup_delay(30.0) == 0.0  # a lone arrival after a quiet spell: at once


async def test_a_burst_into_the_last_places_waits_at_most_their_fill_time() -> None:
    most = 50
    gate = Admission(Limits(max_streaming=most), count_streaming=lambda: 0)
    delays = []
    while gate.admit() is None:  # every place wanted at the same moment
        delays.append(gate.setup_delay(0.0))
    assert len(delays) == most
    assert delays[: int(most * (1 - LAST_PLACES_SHARE))] == [0.0] * int(most * (1 - LAST_PLACES_SHARE))
    assert 0 < max(delays) <= LAST_PLACES_FILL_SECONDS  # within the firmware's 10 s for the hello


async def test_small_limits_space_set_ups_no_more_than_the_cap_and_no_limit_never_waits() -> None:
    gate = Admission(Limits(max_streaming=2), count_streaming=lambda: 0)
    gate.observe_streaming(1)
    assert gate.admit() is None and gate.setup_delay(0.0) == 0.0
    gate.observe_streaming(1)
    assert gate.admit() is None and gate.setup_delay(0.0) == MAX_SETUP_SPACING  # not 5 s / 0.6 places
    unlimited = Admission(Limits(), count_streaming=lambda: 10_000)
    assert [unlimited.setup_delay(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]


async def test_without_a_hold_threshold_or_a_server_to_pace_nothing_is_held() -> None:
    paced: list[int | None] = []
    Admission(Limits(hold_lag_ms=0), count_streaming=lambda: 0, pace=paced.append).observe_hearing(900.0, 0.0)
    gate = Admission(Limits(hold_lag_ms=20), count_streaming=lambda: 0)
    gate.observe_hearing(900.0, 0.0)
    assert paced == [] and gate.accept_budget is None


def test_the_waiting_line_knows_when_each_waiting_connection_came_oldest_first() -> None:
    line = WaitingLine()
    line.count(waiting=2, accepted=10, now=0.0)  # the first count: what waits came now, as far as it knows
    line.count(waiting=5, accepted=10, now=1.0)  # 3 more
    line.count(waiting=4, accepted=13, now=2.0)  # 3 taken (the oldest: both of 0.0, one of 1.0), 2 more
    assert line.waiting == 4
    # The two of 1.0 have 4 s left, all four have 5 s at most: 4 / 5 a second answers them all in time.
    assert line.rate_due(5.0, 2.0) == pytest.approx(max(2 / 4, 4 / 5))
    assert line.rate_due(5.0, 5.99) == pytest.approx(2 / TICK_SECONDS)  # past due: all at once
    line.count(waiting=1, accepted=13, now=3.0)  # three left the queue unaccepted (reset): the oldest go
    assert line.waiting == 1 and line.rate_due(5.0, 3.0) == pytest.approx(1 / 4)
    line.count(waiting=0, accepted=14, now=4.0)
    assert line.waiting == 0 and line.rate_due(5.0, 4.0) == 0.0


def _answer_burst(gate: Admission, paced: list[int | None], burst: int) -> list[float]:
    """A burst waiting in the kernel's queue of a full worker; each tick the server takes what
    the budget allows. Returns when each connection was taken."""
    waiting, accepted, taken_at, now = burst, 0, [], 0.0
    while waiting and now < 3 * REFUSAL_DEADLINE_S:
        assert gate.observe_line(waiting, accepted, now)  # full: the refusals' pacing decides
        take = min(waiting, paced[-1] or 0)
        waiting, accepted = waiting - take, accepted + take
        taken_at += [now] * take
        now += TICK_SECONDS
    return taken_at


async def test_a_full_worker_answers_a_burst_over_its_deadline_and_a_lone_device_at_once() -> None:
    paced: list[int | None] = []
    gate = Admission(Limits(max_streaming=2, hold_lag_ms=10), count_streaming=lambda: 0, pace=paced.append)
    gate.observe_streaming(2)
    assert _answer_burst(gate, paced, 1) == [0.0]  # a lone device hears its 1013 in the first tick
    taken_at = _answer_burst(gate, paced, 400)  # twice the capacity of a worker, all at once
    assert len(taken_at) == 400 and max(taken_at) <= REFUSAL_DEADLINE_S  # every one in time...
    assert sum(at < 1.0 for at in taken_at) < 400 * 0.25  # ...spread out, not all in the first tick
    assert max(taken_at.count(at) for at in set(taken_at)) < 400 / 10


async def test_a_place_freed_ends_the_refusals_pacing_and_the_hearings_takes_over() -> None:
    paced: list[int | None] = []
    gate = Admission(Limits(max_streaming=2, hold_lag_ms=10), count_streaming=lambda: 0, pace=paced.append)
    gate.observe_streaming(1)
    assert not gate.observe_line(50, 0, 0.0) and paced == []  # a place is free: nothing paced here
    gate.observe_streaming(2)
    assert gate.observe_line(50, 0, 0.05) and paced == [REFUSALS_AT_ONCE]
    gate.observe_streaming(1)  # a device left
    assert not gate.observe_line(49, 1, 0.10) and paced[-1] == FIRST_BUDGET  # a few at a time from here
    gate.observe_hearing(1.0, 0.15)  # on time: the hearing's pacing grows the budget as after a hold
    assert paced[-1] == 2 * FIRST_BUDGET
    unpaced: list[int | None] = []
    free = Admission(Limits(max_streaming=1), count_streaming=lambda: 0, pace=unpaced.append)
    free.observe_streaming(1)
    assert free.observe_line(10, 0, 0.0)
    free.observe_streaming(0)
    assert not free.observe_line(9, 1, 0.05) and unpaced[-1] is None  # no hearing pacing: free at once


async def test_a_hearing_late_for_long_takes_its_trickle_by_the_waiting_lines_deadlines() -> None:
    paced: list[int | None] = []
    gate = Admission(Limits(max_streaming=500, hold_lag_ms=20), count_streaming=lambda: 0, pace=paced.append,
                     line=lambda: (0, 0))
    assert not gate.observe_line(0, 0, 0.0)
    gate.observe_hearing(50.0, 0.0)  # held
    now = MAX_HOLD_SECONDS
    assert not gate.observe_line(3, 0, now)  # three just arrived, five seconds left each
    gate.observe_hearing(50.0, now)
    assert gate.refusal(now) == "server busy: overloaded"
    assert paced == [0, REFUSALS_AT_ONCE]  # not FIRST_BUDGET for each tick's worth of time
    now += REFUSAL_DEADLINE_S  # nobody taken since: all three are due
    gate.observe_line(3, 0, now)
    gate.observe_hearing(50.0, now)
    assert paced[-1] >= 3


async def test_without_a_streaming_limit_or_a_server_to_pace_the_line_paces_nothing() -> None:
    paced: list[int | None] = []
    unlimited = Admission(Limits(hold_lag_ms=10), count_streaming=lambda: 10_000, pace=paced.append)
    unlimited.observe_streaming(10_000)
    assert not unlimited.observe_line(500, 0, 0.0)
    no_server = Admission(Limits(max_streaming=1), count_streaming=lambda: 0)
    no_server.observe_streaming(1)
    assert not no_server.observe_line(500, 0, 0.0)
    assert paced == [] and unlimited.waiting.waiting == 500  # still counted


# -- the watcher (virtual time) --------------------------------------------------------------


@pytest.mark.virtual_time
async def test_the_watcher_holds_new_connections_while_the_hearings_mean_lag_is_over() -> None:
    paced: list[int | None] = []
    lags = iter([0.0, 0.050, 0.050, 0.002])
    gate = Admission(Limits(hold_lag_ms=20), count_streaming=lambda: 0,
                     hearing_lag=lambda: next(lags, 0.0), pace=paced.append)
    gate.ensure_watching()
    await asyncio.sleep(TICK_SECONDS * 4.5)
    assert paced == [0, FIRST_BUDGET]
    gate._task.cancel()


@pytest.mark.virtual_time
async def test_the_watcher_reads_the_line_and_paces_the_refusals_once_the_places_are_full() -> None:
    paced: list[int | None] = []
    queue = {"waiting": 0, "accepted": 0, "streaming": 0}
    gate = Admission(Limits(max_streaming=1, hold_lag_ms=10), count_streaming=lambda: queue["streaming"],
                     hearing_lag=lambda: 0.0, pace=paced.append, line=lambda: (queue["waiting"], queue["accepted"]))
    gate.ensure_watching()
    await asyncio.sleep(TICK_SECONDS * (COUNT_EVERY_TICKS + 0.5))
    assert paced == [] and gate.waiting.waiting == 0  # a place free, nobody waiting: free, nothing told
    queue["streaming"], queue["waiting"] = 1, 100
    await asyncio.sleep(TICK_SECONDS * (COUNT_EVERY_TICKS + 3.5))  # counted full, then a few ticks
    assert paced and set(paced) == {REFUSALS_AT_ONCE}  # 100 over 5 s: one a tick
    assert gate.waiting.waiting == 100
    gate._task.cancel()  # type: ignore[union-attr]


@pytest.mark.virtual_time
async def test_the_watcher_refuses_while_the_hearing_pool_lags_and_admits_again_after() -> None:
    slow = {"seconds": 0.0}

    async def pool_probe() -> None:  # the empty job waits this long behind hearing work
        await asyncio.sleep(slow["seconds"])

    streaming = {"n": 0}
    gate = Admission(Limits(max_streaming=50, max_lag_ms=300), lambda: streaming["n"], pool_probe)
    assert gate.admit() is None  # starts the watcher
    await asyncio.sleep(1.0)
    assert gate.admit() is None and gate.lag_ms < 1
    slow["seconds"] = 0.5
    await asyncio.sleep(OVER_SAMPLES * (TICK_SECONDS + 0.5) + 0.1)
    assert gate.lag_ms == pytest.approx(500, abs=1)
    assert gate.admit() == "server busy: overloaded"
    slow["seconds"] = 0.0
    await asyncio.sleep(RECOVER_SECONDS + 0.5)
    assert gate.admit() is None
    streaming["n"] = 50
    await asyncio.sleep(1.0)  # counted by the watcher
    assert gate.streaming == 50
    assert gate.admit() == "server busy: streaming capacity reached"
    gate._task.cancel()  # type: ignore[union-attr]


# -- the consumer --------------------------------------------------------------------------


@pytest.fixture
async def sockets() -> Any:
    opened: list[WebsocketCommunicator] = []
    yield opened
    for communicator in opened:
        await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_past_capacity_a_new_device_gets_1013_and_the_connected_one_keeps_talking(
        sockets: list, settings: Any, database_hops: list[object]) -> None:
    settings.XIAOZHI_MAX_STREAMING_SESSIONS = 2
    first, second = [await database_sync_to_async(BoundDeviceFactory)() for _ in range(2)]
    admitted = await session_of(first, sockets)
    gate = admission_module.admission()
    gate._task.cancel()  # type: ignore[union-attr]  # the test does the counting: no race with the watcher
    gate.observe_streaming(2)  # as the watcher would count two listening sessions
    headers = headers_for(second)
    database_hops.clear()
    refused = await open_socket(sockets, headers)
    assert await close_of(refused) == (CloseCode.TRY_AGAIN_LATER, "server busy: streaming capacity reached")
    assert database_hops == []  # refused before the authentication: nothing but the close frame
    await assert_alive(admitted)
    device = await database_sync_to_async(Device.objects.get)(pk=second.pk)
    assert not device.is_online and device.session_id == ""  # refused before the claim: no DB write
    gate.observe_streaming(1)
    await session_of(second, sockets)  # the firmware's retry gets in once there is room


@pytest.mark.django_db(transaction=True)
async def test_a_handshake_refused_after_admission_leaves_its_place_to_the_next_device(
        sockets: list, settings: Any) -> None:
    settings.XIAOZHI_MAX_STREAMING_SESSIONS = 2
    first, second = [await database_sync_to_async(BoundDeviceFactory)() for _ in range(2)]
    await session_of(first, sockets)
    gate = admission_module.admission()
    gate._task.cancel()  # type: ignore[union-attr]  # the test does the counting: no race with the watcher
    gate.observe_streaming(1)
    forged = await open_socket(sockets, headers_for(second, token="forged.1"))
    assert await close_of(forged) == (CloseCode.AUTH_FAILED, "token invalid")
    await session_of(second, sockets)  # the forged socket's place was given back before the next count



@pytest.mark.django_db(transaction=True)
async def test_a_device_in_the_last_places_is_upgraded_at_once_and_set_up_at_its_turn(
        sockets: list, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.XIAOZHI_MAX_STREAMING_SESSIONS = 10
    monkeypatch.setattr(admission_module, "MAX_SETUP_SPACING", 3.0)
    monkeypatch.setattr(admission_module, "LAST_PLACES_FILL_SECONDS", 100.0)  # the cap decides: 3 s apart
    first, second = [await database_sync_to_async(BoundDeviceFactory)() for _ in range(2)]
    gate = admission_module.admission()
    await session_of(first, sockets)  # starts the watcher; the test does the counting instead
    gate._task.cancel()  # type: ignore[union-attr]
    gate.observe_streaming(8)  # 8 of 10 places held: the last 30 %
    assert gate.setup_delay(asyncio.get_running_loop().time()) == 0.0  # a set-up just went: the next waits
    waiting = await open_socket(sockets, headers_for(second))  # the upgrade is not held
    row = await database_sync_to_async(Device.objects.get)(pk=second.pk)
    assert row.session_id == ""  # not claimed yet: its set-up waits its turn
    monkeypatch.setattr(admission_module, "ARRIVING_SECONDS", 0.0)  # the first device's grace is over
    assert admission_module.streaming_places(gate._sockets, asyncio.get_running_loop().time()) == 1  # the waiting one's
    await waiting.send_to(text_data=PLAIN_HELLO)
    reply = json.loads(await waiting.receive_from(timeout=10))
    assert reply["type"] == "hello"  # answered once set up, within the firmware's 10 s
    row = await database_sync_to_async(Device.objects.get)(pk=second.pk)
    assert row.session_id == reply["session_id"]


@pytest.mark.django_db(transaction=True)
async def test_a_device_that_talks_junk_and_leaves_while_it_waits_leaves_nothing_behind(
        sockets: list, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.XIAOZHI_MAX_STREAMING_SESSIONS = 10
    monkeypatch.setattr(admission_module, "MAX_SETUP_SPACING", 1.0)
    monkeypatch.setattr(admission_module, "LAST_PLACES_FILL_SECONDS", 100.0)
    first, second = [await database_sync_to_async(BoundDeviceFactory)() for _ in range(2)]
    gate = admission_module.admission()
    await session_of(first, sockets)
    gate._task.cancel()  # type: ignore[union-attr]
    gate.observe_streaming(8)
    gate.setup_delay(asyncio.get_running_loop().time())  # a set-up just went: the next waits 1 s
    before = DeviceConsumer.active_connections
    leaving = WebsocketCommunicator(APP, "/xiaozhi/v1/", headers=headers_for(second))
    connected, _ = await leaving.connect()
    assert connected and DeviceConsumer.active_connections == before + 1
    await leaving.send_to(text_data="{not json")
    await leaving.send_to(bytes_data=b"\xff" * 4096)
    await leaving.send_input({"type": "websocket.disconnect", "code": 1006})  # gone before its turn
    await leaving.wait(timeout=10)  # set up at its turn, then closed: the consumer ends
    assert DeviceConsumer.active_connections == before  # its slot given back
    row = await database_sync_to_async(Device.objects.get)(pk=second.pk)
    assert not row.is_online  # claimed at its set-up, then marked offline
    await assert_alive(sockets[0])


@pytest.mark.django_db(transaction=True)
async def test_a_device_admitted_but_not_listening_yet_holds_its_place_when_counted(
        sockets: list, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.XIAOZHI_MAX_STREAMING_SESSIONS = 2
    first, second, third = [await database_sync_to_async(BoundDeviceFactory)() for _ in range(3)]
    talking = await session_of(first, sockets)  # hello answered, no `listen start` yet
    gate = admission_module.admission()
    gate._task.cancel()  # type: ignore[union-attr]  # the test does the counting: no race with the watcher
    count = gate._count_streaming
    gate.observe_streaming(count())
    assert gate.streaming == 1  # counting only "listening" gave 0 here, and let a third device in
    await session_of(second, sockets)
    gate.observe_streaming(count())
    assert gate.streaming == 2
    refused = await open_socket(sockets, headers_for(third))
    assert await close_of(refused) == (CloseCode.TRY_AGAIN_LATER, "server busy: streaming capacity reached")

    await talking.send_to(text_data='{"session_id":"","type":"listen","state":"start","mode":"auto"}')
    monkeypatch.setattr(admission_module, "ARRIVING_SECONDS", 0.0)  # the arrivals' grace is over
    for _ in range(100):  # the `listen start` is handled on the consumer's own task
        if count() == 1:
            break
        await asyncio.sleep(0.01)
    gate.observe_streaming(count())
    assert gate.streaming == 1  # the listening device; the one that never listened gave its place back
    await session_of(third, sockets)


async def test_the_servers_gate_refuses_device_sockets_past_capacity_and_nothing_else(settings: Any) -> None:
    settings.XIAOZHI_MAX_STREAMING_SESSIONS = 1
    gate = admission_module.admission()
    device, gateway = {"type": "websocket", "path": "/xiaozhi/v1/"}, {"type": "websocket", "path": "/llm/v1"}
    assert admission_module.refusal_before_application(device) is None  # room: the consumer admits it
    assert gate.admit() is None
    for path in admission_module.DEVICE_PATHS:
        assert admission_module.refusal_before_application({**device, "path": path}) == (
            CloseCode.TRY_AGAIN_LATER, "server busy: streaming capacity reached")
    assert admission_module.refusal_before_application(gateway) is None  # the gateway has limits of its own
    assert gate.refused == 2 and gate.admitted_since_count == 1


def test_the_gates_paths_are_the_device_routes() -> None:
    device_route = next(route for route in websocket_urlpatterns if getattr(route, "name", "") == "device-ws")
    for path in admission_module.DEVICE_PATHS:
        assert device_route.pattern.match(path.lstrip("/"))  # type: ignore[union-attr]
