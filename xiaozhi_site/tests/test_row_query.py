"""OneRow: the device row by its MAC with the SQL built once, the same instance as the ORM's."""
from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from conversations.tests.factories import PersonaFactory
from devices.models import Device
from devices.selectors import device_for_checkin
from devices.tests.factories import BoundDeviceFactory, DeviceFactory
from xiaozhi_site.row_query import OneRow

pytestmark = pytest.mark.django_db


def fields(device: Device) -> dict[str, object]:
    return {field.attname: getattr(device, field.attname) for field in Device._meta.concrete_fields}


def test_the_row_is_the_orms_with_every_field_and_type() -> None:
    device = BoundDeviceFactory(
        persona=PersonaFactory(), is_online=True, online_since=timezone.now(), last_seen_at=timezone.now(),
        mcp_server_info={"name": "board", "version": "1.0"}, mcp_tools=[{"name": "self.lamp", "inputSchema": {}}],
        mcp_tools_updated_at=timezone.now(),
    )
    ours = device_for_checkin(mac=device.mac)
    orm = Device.objects.get(mac=device.mac)
    assert ours is not None and ours.pk == orm.pk
    assert fields(ours) == fields(orm)
    assert {k: type(v) for k, v in fields(ours).items()} == {k: type(v) for k, v in fields(orm).items()}
    assert ours.online_since is not None and timezone.is_aware(ours.online_since)
    assert ours._state.db == orm._state.db and not ours._state.adding
    assert model_to_dict(ours) == model_to_dict(orm)


def test_unknown_and_hostile_values_find_nothing() -> None:
    DeviceFactory(mac="aa:bb:cc:dd:ee:01")
    assert device_for_checkin(mac="aa:bb:cc:dd:ee:02") is None
    assert device_for_checkin(mac="' OR 1=1 --") is None  # a parameter, never SQL


def test_one_query_per_call_once_prepared() -> None:
    device = DeviceFactory()
    device_for_checkin(mac=device.mac)
    with CaptureQueriesContext(connection) as queries:
        assert device_for_checkin(mac=device.mac) == device
    assert len(queries) == 1


def test_an_update_is_seen_at_once() -> None:
    device = DeviceFactory(name="kitchen")
    assert device_for_checkin(mac=device.mac).name == "kitchen"  # type: ignore[union-attr]
    Device.objects.filter(pk=device.pk).update(name="hall")
    assert device_for_checkin(mac=device.mac).name == "hall"  # type: ignore[union-attr]


@pytest.mark.django_db(transaction=True)
def test_other_threads_run_the_plan_on_their_own_connections() -> None:
    device = DeviceFactory()
    rows = OneRow(Device, "mac")
    found: list[Device | None] = [rows.get(device.mac)]

    def other() -> None:
        try:
            found.append(rows.get(device.mac))
        finally:
            connection.close()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert found == [device, device]
