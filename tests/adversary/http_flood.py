"""An HTTP client at its worst, against edgeinferd's metrics listener (tests/integration/test_http_listener.py,
bench/http_abuse.py): holds 1,000 half-open connections, drips one request that never ends, and runs 32
threads scraping /metrics as fast as they can for SECONDS.

    http_flood.py HOST PORT SECONDS     prints "HELD n" once the connections are open, then
                                        "SCRAPES ok=N failed=M" at the end
"""
import errno
import resource
import select
import socket
import sys
import threading
import time
import urllib.request

host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))


def half_open(n: int, timeout: float = 2.0, retry_after: float = 0.05) -> list:
    """n connections that never send a request, one after another, each given `timeout` s. A SYN that a full
    accept queue dropped would wait for the kernel's 1 s retransmit (about one in 100 connections against an
    asyncio listener: 5-8 s of a thousand spent waiting); a connect not done within `retry_after` s is
    started again instead, the queue having drained meanwhile."""
    out = []
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(n):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setblocking(False)
            if s.connect_ex((host, port)) not in (0, errno.EINPROGRESS):
                s.close()
                break
            poll = select.poll()  # not select(): a thousand fds pass FD_SETSIZE
            poll.register(s, select.POLLOUT)
            ready = poll.poll(1000 * min(retry_after, max(0.0, deadline - time.monotonic())))
            if ready and s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                out.append(s)
                break
            s.close()
    return out


held = half_open(1000)  # half-open: connect, never send a request
slow = socket.create_connection((host, port))
slow.send(b"GET /metrics HTTP/1.1\r\n")  # ...and the rest of the request never comes
scrapes = {"ok": 0, "failed": 0}
stop = time.monotonic() + seconds


def scrape() -> None:
    while time.monotonic() < stop:
        try:
            urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read()
            scrapes["ok"] += 1
        except OSError:
            scrapes["failed"] += 1


threads = [threading.Thread(target=scrape) for _ in range(32)]
for t in threads:
    t.start()
print(f"HELD {len(held)}", flush=True)
for t in threads:
    t.join()
print(f"SCRAPES ok={scrapes['ok']} failed={scrapes['failed']}", flush=True)
