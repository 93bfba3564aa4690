"""An HTTP client at its worst, against edgeinferd's metrics listener (tests/integration/test_http_listener.py,
bench/http_abuse.py): holds 1,000 half-open connections, drips one request that never ends, and runs 32
threads scraping /metrics as fast as they can for SECONDS.

    http_flood.py HOST PORT SECONDS     prints "HELD n" once the connections are open, then
                                        "SCRAPES ok=N failed=M" at the end
"""
import resource
import socket
import sys
import threading
import time
import urllib.request

host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
held = []
for _ in range(1000):  # half-open: connect, never send a request
    try:
        held.append(socket.create_connection((host, port), timeout=2))
    except OSError:
        pass
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
