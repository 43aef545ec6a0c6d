"""The device session's state machine and the close codes it uses.

States mirror what the firmware believes (protocol-reference §2.4) plus two server-only
ones (CONNECTING before hello, THINKING while ASR/LLM run). Transitions are checked against
one table so that a pipeline bug shows up as an `IllegalTransition` at the place it
happens, instead of as a device that silently drops audio later.
"""
from __future__ import annotations

import enum


class SessionState(enum.Enum):
    CONNECTING = "connecting"  # socket accepted, no device hello yet
    IDLE = "idle"  # hello done; device idle (or after `listen stop` in manual mode)
    LISTENING = "listening"  # after `listen start`: uplink audio is the user's voice
    THINKING = "thinking"  # utterance ended: ASR / LLM running, `stt` sent
    SPEAKING = "speaking"  # `tts start` sent: downlink audio allowed until `tts stop`
    CLOSING = "closing"  # terminal: close sent or the socket is gone


class IllegalTransition(RuntimeError):
    """A transition the table does not allow: a bug in the server, never bad device input."""

    def __init__(self, current: SessionState, target: SessionState) -> None:
        super().__init__(f"illegal session transition {current.value} -> {target.value}")
        self.current = current
        self.target = target


_S = SessionState

# Same-state "transitions" are no-ops and always allowed (auto mode repeats `listen start`
# every turn). Why each edge exists:
#   IDLE -> THINKING        manual mode: `listen stop` leaves the device idle, ASR runs now
#   IDLE -> SPEAKING        a command or greeting speaks to an idle device (firmware allows it)
#   LISTENING -> IDLE       `listen stop`
#   LISTENING -> SPEAKING   wake-word greeting, `device.say`, unbound activation code
#   THINKING -> LISTENING   nothing recognised / interrupted (auto, realtime)
#   THINKING -> IDLE        nothing recognised / interrupted (manual)
#   SPEAKING -> LISTENING   `tts stop` in auto/realtime, or `listen start` barge-in
#   SPEAKING -> IDLE        `tts stop` in manual mode
# SPEAKING -> THINKING is deliberately missing: a barge-in must end the reply with
# `tts stop` first, otherwise the device keeps playing the old answer's late frames.
TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    _S.CONNECTING: frozenset({_S.IDLE, _S.CLOSING}),
    _S.IDLE: frozenset({_S.LISTENING, _S.THINKING, _S.SPEAKING, _S.CLOSING}),
    _S.LISTENING: frozenset({_S.IDLE, _S.THINKING, _S.SPEAKING, _S.CLOSING}),
    _S.THINKING: frozenset({_S.IDLE, _S.LISTENING, _S.SPEAKING, _S.CLOSING}),
    _S.SPEAKING: frozenset({_S.IDLE, _S.LISTENING, _S.CLOSING}),
    _S.CLOSING: frozenset(),
}


def check_transition(current: SessionState, target: SessionState) -> bool:
    """True if the state changes, False for a no-op; IllegalTransition if not allowed."""
    if current is target:
        return False
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(current, target)
    return True


class CloseCode(enum.IntEnum):
    """Every WebSocket close code the device endpoint sends, in one place.

    The firmware ignores codes (it just sees the socket die), so they are for logs, browser
    test pages and tests. 4xxx codes are application codes: 4000 + the HTTP status that
    says the same thing where one exists.

    | code | name              | when                                                        |
    |------|-------------------|-------------------------------------------------------------|
    | 1000 | NORMAL            | device `goodbye`, exit phrase / end_conversation tool        |
    | 1011 | INTERNAL_ERROR    | a server bug while handling a frame (logged with traceback) |
    | 1013 | TRY_AGAIN_LATER   | over XIAOZHI_MAX_DEVICE_CONNECTIONS in this process         |
    | 4000 | HELLO_TIMEOUT     | no device hello within hello_timeout (10 s)                 |
    | 4001 | AUTH_FAILED       | missing/invalid token, unknown device, MAC not allowed      |
    | 4003 | NOT_ACTIVATED     | device not bound and XIAOZHI_UNBOUND_POLICY=refuse          |
    | 4400 | PROTOCOL_ERROR    | binary before hello; MAX_PROTOCOL_ERRORS bad frames         |
    | 4408 | TIMEOUT           | no voice for idle_timeout (after the farewell), or nothing  |
    |      |                   | at all for hard_timeout (reason says which)                 |
    | 4413 | MESSAGE_TOO_LARGE | text over max_text_bytes or binary over max_binary_bytes    |
    | 4429 | FLOOD             | more frames than the max_messages_per_second token bucket   |

    4001/4003 are chosen by `devices.auth.device_authenticate` and passed through by the
    consumer; they are listed here so the table is complete. Every close is logged with its
    reason. The reason also goes into the close frame, but daphne 4.2 forwards only the code
    (`WebSocketProtocol.serverClose`), so behind daphne clients see the code alone.
    """

    NORMAL = 1000
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013
    HELLO_TIMEOUT = 4000
    AUTH_FAILED = 4001
    NOT_ACTIVATED = 4003
    PROTOCOL_ERROR = 4400
    TIMEOUT = 4408
    MESSAGE_TOO_LARGE = 4413
    FLOOD = 4429


# Malformed JSON, unknown types and wrong field types are logged and counted, not answered:
# the device protocol has no error message (the firmware logs unknown types and moves on).
# A client that keeps sending garbage is broken or hostile, so the session closes with 4400
# after this many such frames over its lifetime.
MAX_PROTOCOL_ERRORS = 20
