from __future__ import annotations

import pytest
from django.test import override_settings

pytestmark = pytest.mark.django_db(transaction=True)


async def test_it_reports_every_part_up(async_client) -> None:  # noqa: ANN001
    response = await async_client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["down"] == []
    assert set(body["components"]) == {"database", "channel_layer", "celery_broker"}
    assert all(part["ok"] for part in body["components"].values())


@override_settings(CELERY_BROKER_URL="redis://127.0.0.1:1/0")
async def test_it_says_503_when_the_broker_is_down(async_client) -> None:  # noqa: ANN001
    from xiaozhi_site.celery import app

    app.conf.broker_url = "redis://127.0.0.1:1/0"
    try:
        response = await async_client.get("/healthz")
    finally:
        app.conf.broker_url = None
        app.config_from_object("django.conf:settings", namespace="CELERY")
    assert response.status_code == 503
    assert response.json()["down"] == ["celery_broker"]


async def test_it_says_503_when_the_channel_layer_is_down(async_client) -> None:  # noqa: ANN001
    from channels.layers import channel_layers

    broken = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                          "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]}}}
    with override_settings(CHANNEL_LAYERS=broken):
        channel_layers.backends.clear()
        try:
            response = await async_client.get("/healthz")
        finally:
            channel_layers.backends.clear()
    assert response.status_code == 503
    assert "channel_layer" in response.json()["down"]


def test_the_admin_carries_the_product_name(client) -> None:  # noqa: ANN001
    response = client.get("/admin/login/")
    assert response.status_code == 200
    assert "Xiaozhi Server" in response.content.decode()
