"""The dashboard's pages and data calls over HTTP (Django test client): who may see them, what
they accept, and that every figure's link leads to the rows behind it."""
from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from conversations.pipeline.phrases import PHRASES
from dashboard.tests.data import conversation, tool_call, turn
from conversations.tests.factories import PersonaFactory
from devices.tests.factories import DeviceFactory, UserFactory

pytestmark = pytest.mark.django_db

PAGES = ["/dashboard/", "/dashboard/now.json", "/dashboard/figures.json", "/dashboard/breakdown/",
         "/dashboard/turns/"]


@pytest.fixture
def staff(client: Client) -> Client:
    user = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


def links(html: str) -> list[str]:
    return [unescape(href) for href in re.findall(r'href="([^"]+)"', html)]


def cell(html: str, stage: str, figure: str) -> str:
    row = re.search(rf'<tr data-stage="{stage}">(.*?)</tr>', html, re.S)
    assert row, stage
    match = re.search(rf'data-figure="{figure}"[^>]*>([^<]*)<', row.group(1))
    assert match, (stage, figure)
    return match.group(1)


@pytest.mark.parametrize("url", [*PAGES, "/dashboard/devices/1/live.json"])
def test_anonymous_visitors_are_sent_to_the_admin_login(client: Client, url: str) -> None:
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=")


@pytest.mark.parametrize("url", PAGES)
def test_signed_in_users_who_are_not_staff_are_refused(client: Client, url: str) -> None:
    client.force_login(UserFactory(is_staff=False))
    assert client.get(url).status_code == 403


def test_staff_need_the_turn_view_permission_to_read_transcripts_and_error_texts(client: Client) -> None:
    user = UserFactory(is_staff=True)
    client.force_login(user)
    turn(conversation(), at=timezone.now(), error="llm: upstream said something private")
    assert client.get("/dashboard/").status_code == 200
    assert "something private" not in client.get("/dashboard/").content.decode()
    assert "something private" not in client.get("/dashboard/figures.json").content.decode()
    assert client.get("/dashboard/turns/").status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_turn"))
    user = type(user).objects.get(pk=user.pk)  # permissions are cached per user object
    client.force_login(user)
    assert client.get("/dashboard/turns/").status_code == 200
    assert "something private" in client.get("/dashboard/").content.decode()
    assert "something private" in client.get("/dashboard/figures.json").content.decode()


def test_the_device_presence_call_needs_the_device_view_permission(client: Client) -> None:
    device = DeviceFactory(is_online=True)
    user = UserFactory(is_staff=True)
    client.force_login(user)
    assert client.get(f"/dashboard/devices/{device.pk}/live.json").status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_device"))
    assert client.get(f"/dashboard/devices/{device.pk}/live.json").json()["online"] is True


@pytest.mark.parametrize("url", PAGES)
def test_an_empty_database_shows_zeros_not_errors(staff: Client, url: str) -> None:
    response = staff.get(url)
    assert response.status_code == 200
    if url == "/dashboard/now.json":
        assert response.json()["devices_online"] == 0 and response.json()["turns_last_hour"] == 0
    if url == "/dashboard/figures.json":
        assert response.json()["totals"]["device"]["turns"] == 0 and response.json()["fleet"]["devices"] == 0


def test_only_get_is_allowed(staff: Client) -> None:
    assert staff.post("/dashboard/").status_code == 405
    assert staff.post("/dashboard/now.json").status_code == 405


@pytest.mark.parametrize("query", [
    "range=2y", "range=" + "x" * 5000, "persona=abc", "persona=-1", "persona=99999999", "persona=1e3",
    "persona=99999999999999999999999",
])
def test_the_dashboard_rejects_bad_parameters(staff: Client, query: str) -> None:
    assert staff.get(f"/dashboard/?{query}").status_code == 400
    response = staff.get(f"/dashboard/figures.json?{query}")
    assert response.status_code == 400 and response.json()["error"] == "invalid_query"


@pytest.mark.parametrize("query", [
    "min_ms=10", "stage=first_frame_sent&min_ms=-1", "stage=first_frame_sent&min_ms=nan",
    "stage=first_frame_sent&min_ms=1e99", "stage=bogus", "provider=tts", "provider=tts:", "provider=xyz:edge",
    "provider=tts:edge;drop", "fallback=tts:edge,espeak", "failed=everything", "page=0", "page=100000",
    "tool_failed=1", "tool=" + "t" * 201, "device=abc", "device=424242", "source=cloud",
])
def test_the_turn_list_rejects_bad_filters(staff: Client, query: str) -> None:
    response = staff.get(f"/dashboard/turns/?{query}")
    assert response.status_code == 400
    assert "cannot use" in response.content.decode()


@pytest.mark.parametrize("query", ["by=device", "stage=speech_end", "source=x", "range=1d"])
def test_the_breakdown_rejects_bad_parameters(staff: Client, query: str) -> None:
    assert staff.get(f"/dashboard/breakdown/?{query}").status_code == 400


def test_unknown_parameters_are_ignored(staff: Client) -> None:
    assert staff.get("/dashboard/?utm_source=mail&range=7d").status_code == 200


def _latency_history() -> list[float]:
    now = timezone.now()
    conv = conversation(persona=PersonaFactory())
    values = [float(v) for v in (120, 80, 300, 95, 210, 640, 150, 99, 400, 1800)]
    for minute, ms in enumerate(values):
        turn(conv, at=now - timedelta(minutes=minute + 1), timings={"speech_end": 0.0, "first_frame_sent": ms})
    return values


def test_the_page_shows_exact_last_hour_percentiles_linked_to_the_slowest_turns(staff: Client) -> None:
    values = _latency_history()  # sorted: 80 95 99 120 150 210 300 400 640 1800
    html = staff.get("/dashboard/?range=1h").content.decode()
    assert cell(html, "first_frame_sent", "p50") == "150 ms"  # rank ceil(5) = 5th
    assert cell(html, "first_frame_sent", "p95") == "1800 ms"  # rank ceil(9.5) = 10th
    assert cell(html, "first_frame_sent", "n") == "10"
    p50_link = next(href for href in links(html) if "min_ms=150.0" in href)
    listed = staff.get(p50_link).content.decode()
    shown = [unescape(v) for v in re.findall(r'data-figure="stage">([^<]*)<', listed)]
    assert sorted(shown) == sorted(f"{v:.0f} ms" if v >= 100 else f"{v:.1f} ms" for v in values if v >= 150)


def test_the_data_endpoint_gives_the_same_figures(staff: Client) -> None:
    _latency_history()
    data = staff.get("/dashboard/figures.json?range=1h").json()
    stage = {s["stage"]: s for s in data["latency"]["device"]}["first_frame_sent"]
    assert (stage["n"], stage["p50"], stage["p95"], stage["p99"], stage["exact"]) == (10, 150.0, 1800.0, 1800.0, True)
    assert data["series"]["stages"]["device.first_frame_sent"]["n"][-3:] != [0, 0, 0]


def test_failure_figures_link_to_the_turns_behind_them(staff: Client) -> None:
    now = timezone.now()
    persona = PersonaFactory(tts_providers=["edge", "espeak"])
    conv = conversation(persona=persona)
    turn(conv, at=now - timedelta(minutes=5), error="asr: all providers failed", reply_text=PHRASES["apology"]["en"],
         providers={"tts": "espeak"}, user_text="apology one")
    turn(conv, at=now - timedelta(minutes=4), interrupted=True,
         providers={"asr": "a", "llm": "l", "tts": "edge,espeak"},
         tool_calls=[tool_call("lamp", success=False, error="timeout")], user_text="lamp please")
    turn(conv, at=now - timedelta(minutes=3), providers={"asr": "a", "llm": "l", "tts": "edge"}, user_text="fine")
    html = staff.get("/dashboard/").content.decode()
    expected = {
        "failed=any": {"apology one"}, "apology=1": {"apology one"}, "interrupted=1": {"lamp please"},
        "failed=asr": {"apology one"}, "tool=lamp&tool_failed=1": {"lamp please"},
        "provider=tts%3Aespeak": {"apology one", "lamp please"}, "fallback=tts%3Aedge": {"apology one", "lamp please"},
        "provider=tts%3Aedge": {"lamp please", "fine"},
    }
    hrefs = [href for href in links(html) if href.startswith("/dashboard/turns/")]
    for marker, said in expected.items():
        href = next((h for h in hrefs if marker in h and "range=24h" in h), None)
        assert href is not None, marker
        listed = staff.get(href).content.decode()
        assert {text for text in ("apology one", "lamp please", "fine") if text in listed} == said, marker


def test_fleet_links_open_admin_lists_that_accept_their_filters(staff: Client) -> None:
    now = timezone.now()
    DeviceFactory(last_seen_at=now - timedelta(days=9), board_type="bread", firmware_version="2.4.2")
    DeviceFactory(last_seen_at=now, is_online=True, board_type="bread", firmware_version="2.5.0")
    html = staff.get("/dashboard/").content.decode()
    admin_links = [href for href in links(html) if href.startswith("/admin/devices/device/?")]
    assert any("last_seen_at__lt" in href for href in admin_links)
    assert any("firmware_version=2.4.2" in href for href in admin_links)
    for href in admin_links:
        response = staff.get(href)
        assert response.status_code == 200, href  # an unusable lookup would redirect to ?e=1
    quiet = next(href for href in admin_links if "last_seen_at__lt" in href)
    assert "1 device" in staff.get(quiet).content.decode()


def test_the_now_figures_count_devices_online_and_the_last_hour(staff: Client) -> None:
    DeviceFactory(is_online=True)
    DeviceFactory(is_online=False)
    conv = conversation()
    turn(conv, at=timezone.now() - timedelta(minutes=2), error="llm: down")
    turn(conv, at=timezone.now() - timedelta(minutes=3))
    turn(conv, at=timezone.now() - timedelta(minutes=90))
    data = staff.get("/dashboard/now.json").json()
    figures = (data["devices_online"], data["turns_last_hour"], data["errors_last_hour"], data["error_rate"])
    assert figures == (1, 2, 1, 0.5)
    assert set(data["sessions"]) == {"connecting", "idle", "listening", "thinking", "speaking"}


def test_the_device_page_shows_its_live_state_latency_and_last_turns(staff: Client) -> None:
    device = DeviceFactory(is_online=True)
    other = DeviceFactory()
    now = timezone.now()
    mine = conversation(device=device)
    for minute, ms in enumerate((100.0, 200.0, 300.0, 400.0)):
        turn(mine, at=now - timedelta(minutes=minute), timings={"first_frame_sent": ms}, user_text=f"mine {minute}")
    turn(conversation(device=other), at=now, timings={"first_frame_sent": 9999.0}, user_text="not mine")
    html = staff.get(f"/admin/devices/device/{device.pk}/change/").content.decode()
    assert 'id="dash-device-panel"' in html
    assert cell(html, "first_frame_sent", "p50") == "200 ms" and cell(html, "first_frame_sent", "p95") == "400 ms"
    assert "mine 0" in html and "not mine" not in html
    live = staff.get(f"/dashboard/devices/{device.pk}/live.json").json()
    assert live["online"] is True
    assert staff.get("/dashboard/devices/424242/live.json").status_code == 404


def test_view_site_the_admin_home_and_the_site_root_lead_to_the_dashboard(staff: Client) -> None:
    index = staff.get("/admin/").content.decode()
    assert 'href="/dashboard/">View site' in index.replace("\n", "")  # the admin's user tools
    assert '<a class="button" href="/dashboard/">Fleet dashboard</a>' in index
    assert "Devices" in index  # the model list is still there
    response = staff.get("/")
    assert response.status_code == 302 and response["Location"] == "/dashboard/"


def test_the_breakdown_links_each_row_to_its_turns(staff: Client) -> None:
    now = timezone.now()
    alice = PersonaFactory(name="Alice")
    turn(conversation(persona=alice), at=now, timings={"first_frame_sent": 123.0})
    html = staff.get("/dashboard/breakdown/?range=1h&by=persona").content.decode()
    assert "Alice" in html and "123 ms" in html
    href = next(h for h in links(html) if h.startswith("/dashboard/turns/") and f"persona={alice.pk}" in h)
    assert staff.get(href).status_code == 200
    html = staff.get("/dashboard/breakdown/?range=1h&by=provider&stage=tts_first_audio").content.decode()
    assert "edge" in html


