"""Every WebSocket close code the device endpoint sends, in one place.

The firmware ignores codes (it just sees the socket die), so they are for logs, browser test
pages, the simulator and tests. 4xxx codes are application codes: 4000 + the HTTP status that
says the same thing where one exists.
"""
from __future__ import annotations

import enum


class CloseCode(enum.IntEnum):
    """| code | name              | when                                                        |
    |------|-------------------|-------------------------------------------------------------|
    | 1000 | NORMAL            | device `goodbye`, exit phrase / end_conversation tool        |
    | 1011 | INTERNAL_ERROR    | a server bug while handling a frame (logged with traceback) |
    | 1013 | TRY_AGAIN_LATER   | over XIAOZHI_MAX_DEVICE_CONNECTIONS in this process, or an  |
    |      |                   | unbound device over XIAOZHI_MAX_UNBOUND_DEVICE_CONNECTIONS, |
    |      |                   | or the worker is past capacity (admission: "server busy: …" |
    |      |                   | streaming sessions or sustained lag; the firmware retries)  |
    | 4000 | HELLO_TIMEOUT     | no device hello within hello_timeout (10 s)                 |
    | 4001 | AUTH_FAILED       | missing/invalid token, unknown device, MAC not allowed,     |
    |      |                   | Client-Id other than the one the device was bound with      |
    | 4003 | NOT_ACTIVATED     | device not bound and XIAOZHI_UNBOUND_POLICY=refuse          |
    | 4400 | PROTOCOL_ERROR    | binary before hello; MAX_PROTOCOL_ERRORS bad frames         |
    | 4408 | TIMEOUT           | no voice for idle_timeout (after the farewell), or nothing  |
    |      |                   | at all for hard_timeout (reason says which)                 |
    | 4409 | REPLACED          | the same device opened a newer connection (any process)     |
    | 4413 | MESSAGE_TOO_LARGE | text over max_text_bytes or binary over max_binary_bytes    |
    | 4429 | FLOOD             | more frames than the max_messages_per_second token bucket   |

    4001/4003 are chosen by `devices.auth.device_authenticate` (run by the consumer before
    it accepts) and passed through by the consumer; 1013 and 4409 by the consumer; the
    others by the session. Every close is logged with its reason, and the reason goes into
    the close frame (daphne is patched so it reaches the client).
    """

    NORMAL = 1000
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013
    HELLO_TIMEOUT = 4000
    AUTH_FAILED = 4001
    NOT_ACTIVATED = 4003
    PROTOCOL_ERROR = 4400
    TIMEOUT = 4408
    REPLACED = 4409
    MESSAGE_TOO_LARGE = 4413
    FLOOD = 4429
