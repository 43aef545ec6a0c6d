"""ws_fastpath: the integer XOR masker gives autobahn's own maskers' bytes, whole or in pieces;
received bytes reach autobahn's frame parser as before."""
from __future__ import annotations

import os

import pytest
from autobahn.websocket import protocol
from autobahn.websocket.xormasker import create_xor_masker as autobahn_masker

from autobahn.twisted.websocket import WebSocketAdapterProtocol

from xiaozhi_site import ws_fastpath
from xiaozhi_site.ws_fastpath import IntXorMasker


@pytest.mark.parametrize("size", [0, 1, 3, 4, 5, 127, 128, 136, 1000, 65536 + 3])
def test_it_unmasks_like_autobahn(size: int) -> None:
    mask, data = os.urandom(4), os.urandom(size)
    ours, theirs = IntXorMasker(mask), autobahn_masker(mask, size)
    assert ours.process(data) == theirs.process(data)
    assert ours.pointer() == theirs.pointer() == size


def test_a_payload_in_pieces_keeps_the_keys_phase() -> None:
    mask, data = os.urandom(4), os.urandom(1001)
    whole = autobahn_masker(mask, len(data)).process(data)
    ours = IntXorMasker(mask)
    pieces = [ours.process(data[a:b]) for a, b in ((0, 1), (1, 6), (6, 6), (6, 503), (503, 1001))]
    assert b"".join(pieces) == whole
    assert ours.pointer() == 1001
    ours.reset()
    assert ours.pointer() == 0 and ours.process(data[:9]) == whole[:9]


def test_masking_twice_gives_the_data_back() -> None:
    mask, data = b"\x01\x02\x03\x04", b"hello, device"
    assert IntXorMasker(mask).process(IntXorMasker(mask).process(data)) == data


def test_install_swaps_autobahns_factory_and_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "create_xor_masker", autobahn_masker)
    monkeypatch.setattr(WebSocketAdapterProtocol, "dataReceived", WebSocketAdapterProtocol.dataReceived)
    ws_fastpath.install()
    assert ws_fastpath.installed()
    assert isinstance(protocol.create_xor_masker(b"abcd", 10), IntXorMasker)


def test_received_bytes_go_to_the_frame_parser() -> None:
    class Adapter(WebSocketAdapterProtocol):
        def __init__(self) -> None:
            self.got: list[bytes] = []

        def _dataReceived(self, data: bytes) -> None:
            self.got.append(data)

    adapter = Adapter()
    ws_fastpath.data_received(adapter, b"\x82\x81abcd!")
    assert adapter.got == [b"\x82\x81abcd!"]
