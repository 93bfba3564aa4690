"""The metrics listener (issue #13, item 4).

In-process rows drive daemon/edgeinfer/telemetry/httplistener.py directly: a /metrics answer is never older than the render
interval and concurrent scrapes share one render, a liveness change is never served from that cache,
/healthz answers while /metrics renders, a burst of half-open connections does not evict a request already
sent, silent clients time out, a failed render is answered 500, a large body is sent whole, and stop()
leaves no thread behind.

The last row is the abuse of the real thing: a local user who is nobody to edgeinfer (not in its group; the
listener is on loopback, which every local user reaches) holds 1,000 half-open connections, drips a slow
request, and runs 32 parallel /metrics scrapers, against the real daemon serving a camera. /healthz must keep
answering, the daemon must not grow a thread per connection nor run out of fds, /metrics must be rendered
once per interval and shared, and the camera must go on being served."""
from __future__ import annotations

import http.client
import os
import socket
import sys
import threading
import time
import urllib.request

import pytest

from conftest import ROOT, read_line
from daemon_helpers import read_stats, start_daemon, stop_daemon, wait_for, write_config
from edgeinfer.telemetry.httplistener import HttpListener, SharedRender

FLOOD = (ROOT / "tests/adversary/http_flood.py").read_text()  # run with -c: the clone may be 0700 to others


# ------------------------------------------------------------------ the listener alone

TTL = 0.1


@pytest.fixture
def listener():
    """Starts HttpListener(routes, **options) on a free loopback port; stops every one at the end."""
    made = []

    def make(routes, **options):
        lst = HttpListener("127.0.0.1", 0, routes, **options)
        made.append(lst)
        lst.start()
        return lst

    yield make
    for lst in made:
        lst.stop()


def ask(lst: HttpListener, path: str, timeout: float = 5.0, method: str = "GET") -> tuple[int, bytes]:
    host, port = lst.address.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        c.request(method, path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def ok(body: bytes = b"ok\n"):
    return lambda: (200, "text/plain", body)


def test_a_metrics_answer_is_never_older_than_the_interval_and_scrapes_share_renders(listener):
    """The freshness rule: an answer comes from a render that started at most TTL before the request was sent
    (here measured from the client's side, before it even connects); renders start at least TTL apart."""
    starts = []

    def render():
        t = time.monotonic()
        starts.append(t)
        time.sleep(0.02)  # a render takes a while: requests arrive while one is in flight
        return 200, "text/plain", repr(t).encode()

    route = SharedRender(render, TTL)
    lst = listener({"/metrics": route})
    stale, statuses, lock = [], [], threading.Lock()

    def scraper(n: int, pause: float) -> None:
        for _ in range(n):
            sent = time.monotonic()
            status, body = ask(lst, "/metrics")
            with lock:
                statuses.append(status)
                if status == 200 and float(body) < sent - TTL:
                    stale.append(sent - float(body))
            time.sleep(pause)

    threads = [threading.Thread(target=scraper, args=(40, 0.003 * (i % 7))) for i in range(16)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    elapsed = time.monotonic() - t0
    assert statuses.count(200) == 16 * 40, set(statuses)
    assert not stale, f"{len(stale)} answers older than {TTL} s, the worst by {max(stale):.3f} s"
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert min(gaps) >= TTL - 0.02, min(gaps)  # at most one render per interval (less scheduling noise)...
    assert route.renders == len(starts) <= elapsed / TTL + 2, (route.renders, elapsed)
    assert route.renders < 16 * 40 / 4  # ...shared by the scrapes in it


def test_a_liveness_change_is_never_served_from_the_cache(listener):
    """The route's key (for /metrics: each stream connected or not, healthy, ready, the model): a render is
    shared only by requests that see the key it was queued with. A camera that is gone shows as gone in the
    very next scrape, not up to an interval later; and a key that flips on every scrape still cannot make
    renders start closer than min_gap_s."""
    state = {"up": True, "flips": False}
    starts = []

    def render():
        starts.append(time.monotonic())
        return 200, "text/plain", b"up\n" if state["up"] else b"gone\n"

    def key():
        if state["flips"]:
            state["up"] = not state["up"]
        return state["up"]

    route = SharedRender(render, 10.0, key=key, min_gap_s=0.05)  # an interval far longer than this test
    lst = listener({"/metrics": route})
    assert ask(lst, "/metrics") == (200, b"up\n")
    assert ask(lst, "/metrics") == (200, b"up\n") and route.renders == 1  # same key: shared
    state["up"] = False
    assert ask(lst, "/metrics") == (200, b"gone\n") and route.renders == 2  # changed: rendered at once
    state["flips"] = True
    for _ in range(20):
        ask(lst, "/metrics")
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert route.renders >= 10 and min(gaps) >= 0.05 - 0.015, gaps


def test_healthz_answers_while_metrics_renders(listener):
    """/metrics renders on its own thread: the loop answers /healthz meanwhile, even when the render holds
    the interpreter (a pure-Python render that runs until the test has had its answers)."""
    rendering, release, finished = threading.Event(), threading.Event(), threading.Event()

    def render():
        rendering.set()
        end = time.monotonic() + 30  # the test's bound: released long before
        n = 0
        while not release.is_set() and time.monotonic() < end:
            n += 1
        finished.set()
        return 200, "text/plain", b"%d\n" % n

    lst = listener({"/metrics": SharedRender(render, TTL), "/healthz": ok()})
    scrape = threading.Thread(target=ask, args=(lst, "/metrics"))
    scrape.start()
    try:
        assert rendering.wait(5)
        for _ in range(5):
            assert ask(lst, "/healthz", timeout=10) == (200, b"ok\n")
            assert not finished.is_set(), "/healthz was held behind the render"
    finally:
        release.set()
        scrape.join(10)


def test_a_burst_of_half_open_connections_does_not_evict_a_request_already_sent(listener):
    """Over the cap the oldest connection without a request is closed for the new one; in a burst, the loop
    accepts every queued connection before it reads any, so 'no request yet' must mean none in the socket
    either: an honest request queued between half-open ones is answered."""
    lst = listener({"/healthz": ok()}, max_connections=16)
    host, port = lst.address.rsplit(":", 1)
    held = []
    try:
        lst._loop.call_soon_threadsafe(time.sleep, 0.5)  # the loop busy: everything below queues in the backlog
        time.sleep(0.05)
        held += [socket.create_connection((host, int(port)), timeout=2) for _ in range(10)]
        honest = socket.create_connection((host, int(port)), timeout=5)
        honest.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        held += [socket.create_connection((host, int(port)), timeout=2) for _ in range(60)]
        answer = b""
        while chunk := honest.recv(4096):
            answer += chunk
        honest.close()
    finally:
        for s in held:
            s.close()
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"ok\n"), answer
    assert lst.evicted_connections >= 50, lst.evicted_connections


def test_silent_and_slow_clients_time_out(listener):
    lst = listener({"/healthz": ok()}, timeout_s=0.5)
    host, port = lst.address.rsplit(":", 1)
    silent = socket.create_connection((host, int(port)), timeout=5)
    slow = socket.create_connection((host, int(port)), timeout=5)
    slow.sendall(b"GET /healthz HTTP/1.1\r\n")  # the rest never comes
    t = time.monotonic()
    for s in (silent, slow):
        try:
            assert s.recv(100) == b""
        except ConnectionResetError:
            pass  # aborted: a reset is as closed as a FIN
        s.close()
    assert time.monotonic() - t < 2.5
    assert lst.timed_out_connections == 2
    assert ask(lst, "/healthz") == (200, b"ok\n")


def test_a_failing_render_is_answered_500_and_the_listener_serves_on(listener):
    def render():
        raise RuntimeError("collector broke")

    route = SharedRender(render, TTL)
    lst = listener({"/metrics": route, "/healthz": ok()})
    assert ask(lst, "/metrics")[0] == 500
    assert route.failures == 1
    assert ask(lst, "/healthz") == (200, b"ok\n")
    assert ask(lst, "/nope")[0] == 404 and ask(lst, "/healthz", method="POST")[0] == 405


def test_a_large_metrics_body_is_sent_whole(listener):
    """A body far past the socket's high-water mark arrives whole (an abort after drain() cut it short)."""
    body = bytes(range(256)) * (8 << 10)  # 2 MiB
    lst = listener({"/metrics": SharedRender(ok(body), TTL)})
    assert ask(lst, "/metrics") == (200, body)
    status, head_body = ask(lst, "/metrics", method="HEAD")
    assert status == 200 and head_body == b""


def test_stop_leaves_no_thread_and_frees_the_port():
    before = threading.active_count()
    lst = HttpListener("127.0.0.1", 0, {"/metrics": SharedRender(ok(), TTL), "/healthz": ok()})
    lst.start()
    assert threading.active_count() == before + 2  # the loop and the render thread, however many clients
    ask(lst, "/metrics")
    port = int(lst.address.rsplit(":", 1)[1])
    idle = socket.create_connection(("127.0.0.1", port), timeout=5)  # open across stop()
    lst.stop()
    idle.close()
    assert threading.active_count() == before
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1)


# ------------------------------------------------------------------ the real daemon, abused by an outsider


def process_sample(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    return {"threads": threads, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            r.read()
            return r.status
    except OSError:
        return 0


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return float("nan")


def closed(url: str, reason: str) -> float:
    return metric(url, f'edgeinfer_http_connections_closed_total{{reason="{reason}"}}')


def test_half_open_flood_and_32_scrapers_cannot_silence_health_or_the_camera(children, tmp_path, stream, bundles,
                                                                             c_producer, users):
    seconds = 8.0
    cfg = write_config(tmp_path, bundles("orientation"), [{"name": stream, "width": 224, "height": 224}])
    stats = str(tmp_path / "stats.json")
    proc = start_daemon(children, cfg, stats_file=stats)
    cam = children.spawn([c_producer, stream, "224", "224", "--fps", "30", "--socket", proc.ingress])
    assert read_line(cam) == "CONNECTED accepted=1"
    url = proc.metrics_url
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    before = process_sample(proc.pid)
    served_before = wait_for(lambda: read_stats(stats).get("streams", {}).get(stream, {}).get("processed"), 30,
                             "the camera to be served")
    renders_before = metric(url, "edgeinfer_http_metrics_renders_total")

    flood = children.spawn([*users.run_as(users.outsider), sys.executable, "-c", FLOOD, host, port,
                            str(seconds)], cwd="/")
    held = read_line(flood, timeout=60)
    assert held.startswith("HELD "), held
    answers, worst = [], {"threads": 0, "fds": 0}
    end = time.monotonic() + seconds - 1
    while time.monotonic() < end:
        answers.append(get(url + "/healthz"))
        s = process_sample(proc.pid)
        worst = {k: max(worst[k], s[k]) for k in worst}
        time.sleep(0.2)
    scrapes = read_line(flood, timeout=60)
    flood.wait(30)
    renders = metric(url, "edgeinfer_http_metrics_renders_total") - renders_before
    ok_scrapes = int(scrapes.split("ok=")[1].split()[0])
    served = read_stats(stats)["streams"][stream]["processed"] - served_before

    assert int(held.split()[1]) >= 900, held  # the flood really held its connections (client-side fd limit)
    assert answers and all(a == 200 for a in answers), answers  # /healthz answered throughout
    assert worst["threads"] <= before["threads"] + 1, (before, worst)  # no thread per connection
    assert worst["fds"] <= before["fds"] + 80, (before, worst)  # the connection cap (64), not 1,000 sockets
    assert closed(url, "evicted") >= 900  # half-open connections made room for honest ones
    assert ok_scrapes > 0 and renders < ok_scrapes, (ok_scrapes, renders)  # one render shared by many scrapes
    assert served >= 30 * (seconds - 2) * 0.5, served  # the camera was served meanwhile
    assert stop_daemon(proc) == 0
