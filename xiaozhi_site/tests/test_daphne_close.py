"""Close codes and reasons chosen by a consumer reach the client through the real daphne."""
from __future__ import annotations

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]


async def _close_of(url: str) -> tuple[int, str]:
    async with connect(url, open_timeout=5) as ws:
        try:
            while True:
                await ws.recv()
        except ConnectionClosed as closed:
            return closed.rcvd.code, closed.rcvd.reason
    raise AssertionError("not closed")


async def test_a_refused_device_hears_the_code_and_the_reason(asgi_server) -> None:  # noqa: ANN001
    code, reason = await _close_of(f"{asgi_server.ws_url}/xiaozhi/v1/")
    assert code == 4001 and reason == "device id missing"


async def test_a_registered_code_like_1013_goes_out_unchanged(
    asgi_server_factory, gateway_key: str  # noqa: ANN001
) -> None:
    server = asgi_server_factory(CLOUD_MAX_CONNECTIONS="1")
    async with connect(f"{server.ws_url}/llm/v1/?token={gateway_key}", open_timeout=5) as first:
        await first.recv()  # status: connected
        code, reason = await _close_of(f"{server.ws_url}/llm/v1/?token={gateway_key}")
    assert code == 1013 and reason
