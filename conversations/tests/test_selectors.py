"""Selectors the consumers use to read their WebSocket scope."""
from __future__ import annotations


def test_websocket_client_addresses_follow_the_same_proxy_rules_as_http(settings) -> None:  # noqa: ANN001
    from conversations.selectors import scope_client_address

    scope = {"client": ("10.0.0.1", 5555), "headers": [(b"x-forwarded-for", b"6.6.6.6, 203.0.113.7")]}
    settings.XIAOZHI_TRUSTED_PROXY_COUNT = 0
    assert scope_client_address(scope) == "10.0.0.1"
    settings.XIAOZHI_TRUSTED_PROXY_COUNT = 1
    assert scope_client_address(scope) == "203.0.113.7"
    assert scope_client_address({"client": None, "headers": []}) == ""
