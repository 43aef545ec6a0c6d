"""The device session's state machine (close codes: devices/protocol/close_codes.py).

States mirror what the firmware believes (protocol-reference §2.4) plus two server-only
ones (CONNECTING before hello, THINKING while ASR/LLM run). Transitions are checked against
one table so that a pipeline bug shows up as an `IllegalTransition` at the place it
happens, instead of as a device that silently drops audio later.
"""
from __future__ import annotations

import enum

# Close codes live in devices/protocol/ (one home for the wire); re-exported here.
from devices.protocol.close_codes import CloseCode  # noqa: F401


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


# Malformed JSON, unknown types and wrong field types are logged and counted, not answered:
# the device protocol has no error message (the firmware logs unknown types and moves on).
# A client that keeps sending garbage is broken or hostile, so the session closes with 4400
# after this many such frames over its lifetime.
MAX_PROTOCOL_ERRORS = 20
