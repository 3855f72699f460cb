"""The websockets releases :mod:`.uvicorn` (the WebSocket protocol subclass) is tested against.

That protocol reads a few attributes of websockets' sans-I/O ``ServerProtocol`` (listed in
:mod:`.uvicorn`'s docstring); nothing else in OpenEnv relies on websockets beyond its public API.
"""

from __future__ import annotations

import websockets

TESTED_MAJORS = (15, 16, 17)


def tested() -> bool:
    """Whether the installed websockets is a major CI tests."""
    try:
        major = int(str(websockets.__version__).split(".")[0])
    except ValueError:
        return False
    return major in TESTED_MAJORS
