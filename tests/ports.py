"""What several test suites share: a free TCP port on loopback.

The port is picked *below* the kernel's ephemeral range (``ip_local_port_range``). A port the
kernel hands out for ``bind(0)`` is also one it hands out as the source port of outgoing
connections: while ``make test`` installs the client venvs and the npm CLIs beside the tests,
pip and npm open many of those, and a test that lets its port go for a moment (an engine killed
and restarted) could find it taken by one of them. Below the range, only a listener could
take it, and the pick is random so that parallel suites do not race for the same one.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A port nothing listens on right now, outside the ephemeral range when there is room."""
    low = min(_ephemeral_low(), 65536)
    if low > 12000:
        for _ in range(200):
            port = random.randint(10000, low - 1)
            if _bindable(port):
                return port
    with socket.socket() as s:  # no room below the range: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
