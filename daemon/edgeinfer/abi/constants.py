"""ring.h's names that pure-Python code needs without the native core: the sockets' default paths, the
stream-name rule, and how many rings one wait sleeps on (which bounds the streams: config/schema.py). `edgeinferd --check-config` and `edgeinferctl --help` run on these alone (a host whose
extension is missing or broken can still check its configuration and read the help).

Each restates ring.h; tests/unit/test_abi_constants.py holds every one equal to the native module's."""
from __future__ import annotations

INGRESS_SOCKET = "/run/edgeinfer/ingress.sock"  # EI_INGRESS_SOCKET: where cameras hand over their rings
RESULTS_SOCKET = "/run/edgeinfer/results.sock"  # EI_RESULTS_SOCKET: where readers ask for result rings
STREAM_NAME_MAX = 64                            # EI_STREAM_NAME_MAX
MAX_WAIT = 64                                   # EI_MAX_WAIT: rings one ei_wait_any call sleeps on


def stream_name_ok(name: str) -> bool:
    """ring.h's ei_stream_name_ok on the name's UTF-8 bytes: 1..STREAM_NAME_MAX of [A-Za-z0-9_-], the first
    a letter or digit."""
    b = name.encode("utf-8", "replace")  # as the native module: a surrogate is a "?", refused
    if not 0 < len(b) <= STREAM_NAME_MAX:
        return False
    for i, c in enumerate(b):
        alnum = 0x61 <= c <= 0x7a or 0x41 <= c <= 0x5a or 0x30 <= c <= 0x39
        if not alnum and (i == 0 or c not in (0x5f, 0x2d)):
            return False
    return True
