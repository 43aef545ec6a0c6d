"""JSON codec: golden wire samples (docs/protocol-reference.md), rejects, and properties."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.protocol.codec import decode_json, encode_json
from devices.protocol.errors import ProtocolError
from devices.protocol.messages import (
    EMOTIONS,
    LISTEN_MODES,
    Abort,
    Alert,
    AudioParams,
    Custom,
    Goodbye,
    Hello,
    ListenDetect,
    ListenStart,
    ListenStop,
    Llm,
    Mcp,
    Message,
    ServerHello,
    Stt,
    System,
    TtsSentenceEnd,
    TtsSentenceStart,
    TtsStart,
    TtsStop,
)

SID = "f3b5c1de-9a43-4d2e-8f37-5a6c2b1e0d9a"
DEVICE_AUDIO = AudioParams(format="opus", sample_rate=16000, channels=1, frame_duration=60)
SERVER_AUDIO = AudioParams(format="opus", sample_rate=24000, channels=1, frame_duration=60)
DEVICE_AUDIO_JSON = '{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}'
SERVER_AUDIO_JSON = '{"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60}'
MCP_INIT = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {
        "protocolVersion": "2024-11-05",
        "capabilities": {"vision": {"url": "http://host:8003/mcp/vision/explain", "token": "t"}},
        "clientInfo": {"name": "XiaozhiClient", "version": "1.0.0"},
    },
}
MCP_INIT_JSON = (
    '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05",'
    '"capabilities":{"vision":{"url":"http://host:8003/mcp/vision/explain","token":"t"}},'
    '"clientInfo":{"name":"XiaozhiClient","version":"1.0.0"}}}'
)
MCP_RESULT = {
    "jsonrpc": "2.0", "id": 1,
    "result": {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
               "serverInfo": {"name": "esp-box-3", "version": "2.4.2"}},
}
MCP_RESULT_JSON = (
    '{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2024-11-05",'
    '"capabilities":{"tools":{}},"serverInfo":{"name":"esp-box-3","version":"2.4.2"}}}'
)

# Exact wire text ⇄ message, both directions: encode(message) == wire and decode(wire) == message.
GOLDEN: list[tuple[str, str, Message]] = [
    # device → server (firmware shapes: session_id first)
    ("hello_with_text_font",
     '{"type":"hello","version":1,"features":{"aec":true,"mcp":true,"glyph_push":true},'
     '"text_font":{"bundle":"noto-v1","charset":"common","size":20,"bpp":4},'
     f'"transport":"websocket","audio_params":{DEVICE_AUDIO_JSON}}}',
     Hello(version=1, features={"aec": True, "mcp": True, "glyph_push": True},
           transport="websocket", audio_params=DEVICE_AUDIO,
           extra={"text_font": {"bundle": "noto-v1", "charset": "common", "size": 20,
                                "bpp": 4}})),
    ("hello_v3_mcp_only",
     '{"type":"hello","version":3,"features":{"mcp":true},"transport":"websocket",'
     f'"audio_params":{DEVICE_AUDIO_JSON}}}',
     Hello(version=3, features={"mcp": True}, audio_params=DEVICE_AUDIO)),
    ("hello_without_mcp",
     f'{{"type":"hello","version":2,"features":{{}},"transport":"websocket",'
     f'"audio_params":{DEVICE_AUDIO_JSON}}}',
     Hello(version=2, audio_params=DEVICE_AUDIO)),
    ("listen_start_auto", '{"session_id":"S","type":"listen","state":"start","mode":"auto"}',
     ListenStart(mode="auto", session_id="S")),
    ("listen_start_manual", '{"session_id":"S","type":"listen","state":"start","mode":"manual"}',
     ListenStart(mode="manual", session_id="S")),
    ("listen_start_realtime",
     '{"session_id":"S","type":"listen","state":"start","mode":"realtime"}',
     ListenStart(mode="realtime", session_id="S")),
    ("listen_start_before_server_hello",
     '{"session_id":"","type":"listen","state":"start","mode":"auto"}',
     ListenStart(mode="auto", session_id="")),
    ("listen_stop", '{"session_id":"S","type":"listen","state":"stop"}',
     ListenStop(session_id="S")),
    ("listen_detect", '{"session_id":"S","type":"listen","state":"detect","text":"你好小智"}',
     ListenDetect(text="你好小智", session_id="S")),
    ("abort_by_button", '{"session_id":"S","type":"abort"}', Abort(session_id="S")),
    ("abort_by_wake_word", '{"session_id":"S","type":"abort","reason":"wake_word_detected"}',
     Abort(reason="wake_word_detected", session_id="S")),
    ("mcp_from_device", f'{{"session_id":"S","type":"mcp","payload":{MCP_RESULT_JSON}}}',
     Mcp(payload=MCP_RESULT, session_id="S")),
    ("goodbye", '{"session_id":"S","type":"goodbye"}', Goodbye(session_id="S")),
    # server → device (reference-server shapes: session_id last, except in hello)
    ("server_hello",
     f'{{"type":"hello","transport":"websocket","session_id":"{SID}",'
     f'"audio_params":{SERVER_AUDIO_JSON}}}',
     ServerHello(session_id=SID, transport="websocket", audio_params=SERVER_AUDIO)),
    ("stt", '{"type":"stt","text":"今天天气怎么样","session_id":"S"}',
     Stt(text="今天天气怎么样", session_id="S")),
    ("tts_start", '{"type":"tts","state":"start","session_id":"S"}', TtsStart(session_id="S")),
    ("llm", '{"type":"llm","text":"🙂","emotion":"happy","session_id":"S"}',
     Llm(emotion="happy", text="🙂", session_id="S")),
    ("tts_sentence_start", '{"type":"tts","state":"sentence_start","text":"今天晴","session_id":"S"}',
     TtsSentenceStart(text="今天晴", session_id="S")),
    ("tts_sentence_end", '{"type":"tts","state":"sentence_end","text":"今天晴","session_id":"S"}',
     TtsSentenceEnd(text="今天晴", session_id="S")),
    ("tts_stop", '{"type":"tts","state":"stop","session_id":"S"}', TtsStop(session_id="S")),
    ("mcp_from_server_without_session", f'{{"type":"mcp","payload":{MCP_INIT_JSON}}}',
     Mcp(payload=MCP_INIT)),
    ("system_reboot", '{"type":"system","command":"reboot","session_id":"S"}',
     System(command="reboot", session_id="S")),
    ("alert",
     '{"type":"alert","status":"错误","message":"服务器连接失败","emotion":"sad","session_id":"S"}',
     Alert(status="错误", message="服务器连接失败", emotion="sad", session_id="S")),
    ("custom", '{"type":"custom","payload":{"action":"show","n":1.5},"session_id":"S"}',
     Custom(payload={"action": "show", "n": 1.5}, session_id="S")),
]


@pytest.mark.parametrize(("wire", "message"), [g[1:] for g in GOLDEN], ids=[g[0] for g in GOLDEN])
def test_it_encodes_each_message_to_the_exact_wire_text(wire: str, message: Message) -> None:
    assert encode_json(message) == wire


@pytest.mark.parametrize(("wire", "message"), [g[1:] for g in GOLDEN], ids=[g[0] for g in GOLDEN])
def test_it_decodes_the_wire_text_of_each_message(wire: str, message: Message) -> None:
    assert decode_json(wire) == message
    assert decode_json(wire.encode("utf-8")) == message


# Other senders' variants: decoded leniently, but not byte-identical on re-encode.
LENIENT: list[tuple[str, str, Message]] = [
    ("mqtt_hello_key_order",
     '{"type":"hello","version":3,"transport":"udp","features":{"mcp":true},'
     f'"audio_params":{DEVICE_AUDIO_JSON}}}',
     Hello(version=3, transport="udp", features={"mcp": True}, audio_params=DEVICE_AUDIO)),
    ("hello_from_a_browser_test_page",
     '{"type":"hello","device_id":"aa:bb","token":"x","features":{"mcp":true}}',
     Hello(features={"mcp": True}, extra={"device_id": "aa:bb", "token": "x"})),
    ("hello_with_partial_audio_params",
     '{"type":"hello","version":1,"features":{},"audio_params":{"sample_rate":16000}}',
     Hello(audio_params=DEVICE_AUDIO)),
    ("hello_with_nulls",
     '{"type":"hello","version":null,"features":null,"transport":null,"audio_params":null}',
     Hello()),
    ("reference_python_server_hello",
     '{"type":"hello","version":1,"transport":"websocket",'
     f'"audio_params":{DEVICE_AUDIO_JSON},"session_id":"S"}}',
     ServerHello(session_id="S", audio_params=DEVICE_AUDIO)),
    ("server_hello_without_audio_params_means_24k",
     '{"type":"hello","transport":"websocket","session_id":"S"}',
     ServerHello(session_id="S", audio_params=SERVER_AUDIO)),
    ("server_hello_with_frame_duration_only",
     '{"type":"hello","transport":"websocket","audio_params":{"frame_duration":20}}',
     ServerHello(audio_params=AudioParams(sample_rate=24000, frame_duration=20))),
    ("stt_with_glyph_push", '{"type":"stt","text":"hi","glyph_push":{"g":1},"session_id":"S"}',
     Stt(text="hi", session_id="S")),
    ("go_server_tts_with_index",
     '{"type":"tts","state":"sentence_start","text":"a","index":2,"audio_codec":"opus"}',
     TtsSentenceStart(text="a")),
    ("llm_without_text", '{"type":"llm","emotion":"sleepy"}', Llm(emotion="sleepy")),
    ("llm_with_unknown_emotion", '{"type":"llm","emotion":"grumpy","text":""}',
     Llm(emotion="grumpy")),
    ("listen_stop_with_a_mode", '{"session_id":"S","type":"listen","state":"stop","mode":"x"}',
     ListenStop(session_id="S")),
    ("null_session_id", '{"session_id":null,"type":"abort","reason":null}', Abort()),
    ("whitespace_and_key_order",
     ' { "mode" : "manual" , "state" : "start" , "type" : "listen" } \n',
     ListenStart(mode="manual")),
    ("escaped_unicode", '{"type":"stt","text":"\\u4f60\\ud83d\\ude42"}', Stt(text="你🙂")),
]


@pytest.mark.parametrize(("wire", "message"), [x[1:] for x in LENIENT], ids=[x[0] for x in LENIENT])
def test_it_decodes_variants_other_senders_produce(wire: str, message: Message) -> None:
    assert decode_json(wire) == message


def _deep(depth: int) -> str:
    return '{"type":"mcp","payload":{"a":' + "[" * depth + "]" * depth + "}}"


REJECTS: list[tuple[str, str | bytes, str]] = [
    ("invalid_utf8", b'{"type":"stt","text":"\xff"}', "malformed"),
    ("utf8_bom", '\ufeff{"type":"goodbye"}', "malformed"),
    ("empty", "", "malformed"),
    ("not_json", "hello", "malformed"),
    ("truncated", '{"type":"stt","text":"a"', "malformed"),
    ("json_list", '[{"type":"goodbye"}]', "malformed"),
    ("json_number", "5", "malformed"),
    ("json_string", '"goodbye"', "malformed"),
    ("json_null", "null", "malformed"),
    ("nan", '{"type":"mcp","payload":{"x":NaN}}', "malformed"),
    ("infinity", '{"type":"mcp","payload":{"x":-Infinity}}', "malformed"),
    ("float_overflow", '{"type":"mcp","payload":{"x":1e400}}', "malformed"),
    ("huge_integer", '{"type":"mcp","payload":{"x":' + "9" * 5000 + "}}", "malformed"),
    ("lone_surrogate", '{"type":"stt","text":"\\ud800"}', "malformed"),
    ("lone_surrogate_in_key", '{"type":"mcp","payload":{"\\udfff":1}}', "malformed"),
    ("nested_past_the_limit", _deep(100), "too_large"),
    ("nested_past_the_recursion_limit", _deep(100_000), "too_large"),
    ("no_type", '{"state":"start"}', "malformed"),
    ("numeric_type", '{"type":5}', "malformed"),
    ("null_type", '{"type":null}', "malformed"),
    ("unknown_type", '{"type":"iot","descriptors":[]}', "unknown_type"),
    ("ping_is_not_a_device_message", '{"type":"ping"}', "unknown_type"),
    ("type_is_case_sensitive", '{"type":"Hello","features":{}}', "unknown_type"),
    ("listen_without_state", '{"type":"listen","mode":"auto"}', "invalid_field"),
    ("listen_numeric_state", '{"type":"listen","state":1}', "invalid_field"),
    ("listen_unknown_state", '{"type":"listen","state":"pause"}', "invalid_field"),
    ("listen_start_without_mode", '{"type":"listen","state":"start"}', "invalid_field"),
    ("listen_start_numeric_mode", '{"type":"listen","state":"start","mode":5}', "invalid_field"),
    ("listen_start_unknown_mode", '{"type":"listen","state":"start","mode":"ptt"}',
     "invalid_field"),
    ("listen_detect_without_text", '{"type":"listen","state":"detect"}', "invalid_field"),
    ("tts_without_state", '{"type":"tts"}', "invalid_field"),
    ("tts_unknown_state", '{"type":"tts","state":"paused"}', "invalid_field"),
    ("tts_sentence_start_without_text", '{"type":"tts","state":"sentence_start"}',
     "invalid_field"),
    ("tts_sentence_end_numeric_text", '{"type":"tts","state":"sentence_end","text":1}',
     "invalid_field"),
    ("mcp_string_payload", '{"type":"mcp","payload":"x"}', "invalid_field"),
    ("mcp_list_payload", '{"type":"mcp","payload":[]}', "invalid_field"),
    ("mcp_without_payload", '{"type":"mcp"}', "invalid_field"),
    ("custom_null_payload", '{"type":"custom","payload":null}', "invalid_field"),
    ("abort_numeric_reason", '{"type":"abort","reason":5}', "invalid_field"),
    ("stt_null_text", '{"type":"stt","text":null}', "invalid_field"),
    ("llm_without_emotion", '{"type":"llm","text":"🙂"}', "invalid_field"),
    ("llm_numeric_text", '{"type":"llm","emotion":"happy","text":1}', "invalid_field"),
    ("system_without_command", '{"type":"system"}', "invalid_field"),
    ("alert_without_emotion", '{"type":"alert","status":"a","message":"b"}', "invalid_field"),
    ("alert_numeric_status", '{"type":"alert","status":1,"message":"b","emotion":"sad"}',
     "invalid_field"),
    ("numeric_session_id", '{"type":"goodbye","session_id":5}', "invalid_field"),
    ("hello_bool_version", '{"type":"hello","version":true,"features":{}}', "invalid_field"),
    ("hello_string_version", '{"type":"hello","version":"1","features":{}}', "invalid_field"),
    ("hello_float_version", '{"type":"hello","version":1.0,"features":{}}', "invalid_field"),
    ("hello_version_0", '{"type":"hello","version":0,"features":{}}', "invalid_field"),
    ("hello_version_4", '{"type":"hello","version":4,"features":{}}', "invalid_field"),
    ("hello_list_features", '{"type":"hello","features":["mcp"]}', "invalid_field"),
    ("hello_numeric_transport", '{"type":"hello","features":{},"transport":1}', "invalid_field"),
    ("hello_string_audio_params", '{"type":"hello","features":{},"audio_params":"opus"}',
     "invalid_field"),
    ("hello_bool_sample_rate",
     '{"type":"hello","features":{},"audio_params":{"sample_rate":true}}', "invalid_field"),
    ("hello_zero_sample_rate",
     '{"type":"hello","features":{},"audio_params":{"sample_rate":0}}', "invalid_field"),
    ("hello_huge_sample_rate",
     '{"type":"hello","features":{},"audio_params":{"sample_rate":' + "9" * 40 + "}}",
     "invalid_field"),
    ("hello_string_channels",
     '{"type":"hello","features":{},"audio_params":{"channels":"1"}}', "invalid_field"),
    ("hello_numeric_format",
     '{"type":"hello","features":{},"audio_params":{"format":1}}', "invalid_field"),
    ("server_hello_without_transport", '{"type":"hello","session_id":"S"}', "invalid_field"),
    ("server_hello_null_transport", '{"type":"hello","transport":null}', "invalid_field"),
]


@pytest.mark.parametrize(("data", "kind"), [r[1:] for r in REJECTS], ids=[r[0] for r in REJECTS])
def test_it_rejects_bad_input_with_a_typed_error(data: str | bytes, kind: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_json(data)
    assert caught.value.kind == kind
    assert caught.value.reason and str(caught.value) == caught.value.reason


@pytest.mark.parametrize("data", [None, 5, 1.5, ["x"], {"type": "goodbye"}, object()])
def test_it_rejects_input_that_is_neither_text_nor_bytes(data: Any) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_json(data)
    assert caught.value.kind == "malformed"


def test_it_accepts_bytearray_and_memoryview() -> None:
    wire = b'{"session_id":"S","type":"goodbye"}'
    assert decode_json(bytearray(wire)) == Goodbye(session_id="S")  # type: ignore[arg-type]
    assert decode_json(memoryview(wire)) == Goodbye(session_id="S")  # type: ignore[arg-type]


def test_it_accepts_nesting_up_to_the_limit() -> None:
    # payload object (depth 2) + key "a" whose list nests 62 more levels = 64.
    assert isinstance(decode_json(_deep(62)), Mcp)
    with pytest.raises(ProtocolError):
        decode_json(_deep(63))


def test_it_keeps_the_reason_free_of_input_values() -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_json('{"type":"listen","state":"start","mode":"<script>"}')
    assert "<script>" not in caught.value.reason


# --- max_bytes -------------------------------------------------------------------------

STT_WIRE = '{"type":"stt","text":"你好"}'  # 26 characters, 30 UTF-8 bytes


@pytest.mark.parametrize("data", [STT_WIRE, STT_WIRE.encode("utf-8")])
def test_it_accepts_a_message_exactly_at_max_bytes(data: str | bytes) -> None:
    assert decode_json(data, max_bytes=30) == Stt(text="你好")


@pytest.mark.parametrize("data", [STT_WIRE, STT_WIRE.encode("utf-8")])
def test_it_measures_max_bytes_in_utf8_bytes_not_characters(data: str | bytes) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_json(data, max_bytes=29)
    assert caught.value.kind == "too_large"


def test_it_refuses_a_huge_message_before_parsing_it() -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_json("x" * 1_000_000, max_bytes=65_535)
    assert caught.value.kind == "too_large"


# --- encoding details ------------------------------------------------------------------


def test_it_omits_session_id_when_none_for_every_message_type() -> None:
    for message in (m for _, _, m in GOLDEN):
        cleared = type(message)(**{**_fields(message), "session_id": None})
        assert "session_id" not in json.loads(encode_json(cleared))


def test_it_writes_server_hello_in_the_firmware_order_with_24k_by_default() -> None:
    assert encode_json(ServerHello(session_id=SID)) == (
        f'{{"type":"hello","transport":"websocket","session_id":"{SID}",'
        f'"audio_params":{SERVER_AUDIO_JSON}}}'
    )


def test_it_puts_session_id_first_in_a_device_hello_that_has_one() -> None:
    assert encode_json(Hello(session_id="S")).startswith('{"session_id":"S","type":"hello"')


def test_it_refuses_to_encode_something_that_is_not_a_message() -> None:
    with pytest.raises(TypeError):
        encode_json({"type": "goodbye"})  # type: ignore[arg-type]


def test_it_refuses_hello_extra_keys_that_shadow_modelled_keys() -> None:
    with pytest.raises(ValueError):
        encode_json(Hello(extra={"transport": "udp"}))


def test_protocol_error_pickles_and_validates_its_kind() -> None:
    error = pickle.loads(pickle.dumps(ProtocolError("bad", "too_large")))
    assert (error.reason, error.kind) == ("bad", "too_large")
    with pytest.raises(ValueError):
        ProtocolError("bad", "oops")  # type: ignore[arg-type]


def test_the_vocabularies_match_the_reference() -> None:
    assert LISTEN_MODES == ("auto", "manual", "realtime")
    assert len(EMOTIONS) == 21 and len(set(EMOTIONS)) == 21
    assert EMOTIONS[0] == "neutral" and "confused" in EMOTIONS


def test_the_protocol_package_imports_without_django() -> None:
    code = (
        "import sys, devices.protocol.codec, devices.protocol.binary\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'django'], 'django imported'"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=30)


def _fields(message: Message) -> dict[str, Any]:
    return {name: getattr(message, name) for name in message.__dataclass_fields__}


# --- properties ------------------------------------------------------------------------

json_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=10,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
session_ids = st.none() | st.just("") | st.uuids().map(str) | st.text(max_size=20)
texts = st.text(max_size=40)
audio_params = st.builds(
    AudioParams, format=st.sampled_from(["opus", "pcm"]) | texts,
    sample_rate=st.integers(1, 384_000), channels=st.integers(1, 8),
    frame_duration=st.integers(1, 10_000),
)
hello_extra = st.dictionaries(
    st.text(max_size=10).filter(
        lambda k: k not in {"type", "version", "features", "transport", "audio_params",
                            "session_id"}),
    json_values, max_size=3,
)

MESSAGE_STRATEGIES: dict[str, st.SearchStrategy[Message]] = {
    "Hello": st.builds(Hello, version=st.sampled_from([1, 2, 3]), features=json_objects,
                       transport=texts, audio_params=st.none() | audio_params,
                       extra=hello_extra, session_id=session_ids),
    "ListenStart": st.builds(ListenStart, mode=st.sampled_from(LISTEN_MODES),
                             session_id=session_ids),
    "ListenStop": st.builds(ListenStop, session_id=session_ids),
    "ListenDetect": st.builds(ListenDetect, text=texts, session_id=session_ids),
    "Abort": st.builds(Abort, reason=st.none() | texts, session_id=session_ids),
    "Mcp": st.builds(Mcp, payload=json_objects, session_id=session_ids),
    "Goodbye": st.builds(Goodbye, session_id=session_ids),
    "ServerHello": st.builds(ServerHello, session_id=session_ids, transport=texts,
                             audio_params=audio_params),
    "Stt": st.builds(Stt, text=texts, session_id=session_ids),
    "Llm": st.builds(Llm, emotion=st.sampled_from(EMOTIONS) | texts, text=texts,
                     session_id=session_ids),
    "TtsStart": st.builds(TtsStart, session_id=session_ids),
    "TtsSentenceStart": st.builds(TtsSentenceStart, text=texts, session_id=session_ids),
    "TtsSentenceEnd": st.builds(TtsSentenceEnd, text=texts, session_id=session_ids),
    "TtsStop": st.builds(TtsStop, session_id=session_ids),
    "System": st.builds(System, command=st.just("reboot") | texts, session_id=session_ids),
    "Alert": st.builds(Alert, status=texts, message=texts, emotion=texts,
                       session_id=session_ids),
    "Custom": st.builds(Custom, payload=json_objects, session_id=session_ids),
}


def test_every_message_class_has_a_strategy() -> None:
    from typing import get_args

    assert {cls.__name__ for cls in get_args(Message)} == set(MESSAGE_STRATEGIES)


@pytest.mark.parametrize("name", sorted(MESSAGE_STRATEGIES))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_decode_inverts_encode_for_every_message_type(name: str, data: st.DataObject) -> None:
    message = data.draw(MESSAGE_STRATEGIES[name])
    wire = encode_json(message)
    assert decode_json(wire) == message
    assert decode_json(wire.encode("utf-8")) == message


@settings(max_examples=300, deadline=None)
@given(st.text() | st.text(alphabet=st.characters(categories=["Cs"]) | st.characters()))
def test_arbitrary_text_raises_nothing_but_protocol_error(text: str) -> None:
    _decode_or_protocol_error(text)


@settings(max_examples=300, deadline=None)
@given(st.binary())
def test_arbitrary_bytes_raise_nothing_but_protocol_error(data: bytes) -> None:
    _decode_or_protocol_error(data)


FIELD_NAMES = ["state", "mode", "text", "payload", "session_id", "version", "features",
               "transport", "audio_params", "emotion", "status", "message", "command",
               "reason"]
PLAUSIBLE = {
    "state": st.sampled_from(["start", "stop", "detect", "sentence_start", "sentence_end"]),
    "mode": st.sampled_from(LISTEN_MODES), "version": st.sampled_from([1, 2, 3]),
    "audio_params": st.dictionaries(
        st.sampled_from(["format", "sample_rate", "channels", "frame_duration"]),
        st.integers(-5, 100_000) | json_scalars),
}


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries(
    {"type": st.sampled_from(["hello", "listen", "abort", "mcp", "goodbye", "stt", "llm",
                              "tts", "system", "alert", "custom"])},
    optional={k: PLAUSIBLE.get(k, texts) | json_values for k in FIELD_NAMES},
))
def test_near_valid_objects_decode_to_a_stable_message_or_a_protocol_error(
    obj: dict[str, Any],
) -> None:
    message = _decode_or_protocol_error(json.dumps(obj, ensure_ascii=False))
    if message is not None:
        # Whatever is accepted has a canonical form that decodes to the same message.
        assert decode_json(encode_json(message)) == message


def _decode_or_protocol_error(data: str | bytes) -> Message | None:
    try:
        return decode_json(data, max_bytes=65_535)
    except ProtocolError as error:
        assert error.kind in ("malformed", "unknown_type", "invalid_field", "too_large")
        return None
