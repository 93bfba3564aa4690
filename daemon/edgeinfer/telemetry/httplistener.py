"""A small, bounded HTTP/1.1 GET listener for /metrics, /healthz and /readyz.

Why not http.server.ThreadingHTTPServer (what 0.1 used, and what
prometheus_client's start_http_server uses): it spawns a thread per
connection with no cap and no timeout, so ~1,000 half-open connections gave
the daemon 1,000 threads, exhausted its fds, and /healthz stopped answering.

Here two threads do all of it, however many clients come:
- one runs an asyncio loop that accepts, reads requests and writes answers. An
  idle connection costs a socket and a few hundred bytes, never a thread. At
  most `max_connections` are open: over the cap, the oldest connection that has
  not sent a request is closed for the new one (half-open floods evict each
  other, while an honest client, which sends its request at once, gets
  answered; one whose request is already in its socket, unread, is not
  evicted). Each connection must send its request and take its answer within
  `timeout_s`. Only GET/HEAD of the configured paths is served, one request per
  connection (Connection: close), headers <= 8 KiB. Cheap routes (/healthz,
  /readyz) are answered on the loop itself, fresh every time.
- one renders the costly routes (a `SharedRender`: /metrics), one at a time,
  so the loop goes on answering /healthz while a render runs. A render is
  shared: a request is given the latest render if that started at most
  `ttl_s` before the request arrived (or has not started yet) and the route's
  `key` (for /metrics: liveness - each stream connected or not, healthy,
  ready, the model) is what it was then; otherwise a new one is queued. So
  renders start at least `ttl_s` apart however many scrapers there are (at
  least `min_gap_s` where the key changed), no answer describes the daemon as
  it was more than `ttl_s` before its request, and none shows a liveness that
  has changed since.
"""
from __future__ import annotations

import array
import asyncio
import fcntl
import logging
import queue
import socket
import termios
import threading
import time
from collections import OrderedDict
from typing import Callable

log = logging.getLogger("edgeinfer.http")

Response = tuple[int, str, bytes]  # status, content type, body
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error",
            503: "Service Unavailable"}
MAX_HEADER_BYTES = 8192
RENDER_FAILED: Response = (500, "text/plain", b"render failed (see the daemon's log)\n")
FAILURE_LOG_EVERY_S = 60.0  # a render that keeps failing is logged once a minute, not once per scrape


class _Job:
    """One render of a SharedRender; every request given it shares its result."""
    __slots__ = ("route", "future", "key", "started")

    def __init__(self, route: "SharedRender", future: asyncio.Future, key):
        self.route, self.future, self.key = route, future, key
        self.started: float | None = None  # monotonic, set by the render thread as it begins


class SharedRender:
    """A costly route, rendered on the listener's render thread and shared (see the module's docstring).
    key: a cheap callable, called on the loop for each request; a cached render is given only to requests
    that see the same key. `renders` counts the renders done, `failures` those that raised."""

    def __init__(self, render: Callable[[], Response], ttl_s: float, key: Callable[[], object] | None = None,
                 min_gap_s: float | None = None):
        self.render, self.ttl_s, self.key = render, ttl_s, key
        self.min_gap_s = ttl_s / 4 if min_gap_s is None else min_gap_s
        self.renders = 0
        self.failures = 0
        self._latest: _Job | None = None  # only the loop's thread touches it
        self._last_start = -1e18          # only the render thread touches it
        self._logged_at = -1e18

    def job_for(self, arrived: float, loop: asyncio.AbstractEventLoop, jobs: queue.SimpleQueue) -> _Job:
        """The render a request that arrived at `arrived` (monotonic) is given: the latest one if it has not
        started yet (it will see the state as it is then), or if it started at most ttl_s before the request
        with the same key; else a new one (queued)."""
        try:
            key = self.key() if self.key is not None else None
        except Exception:  # the state is mid-change: render afresh
            key = object()
        job = self._latest
        started = job.started if job is not None else None  # read once: the render thread may set it now
        if job is None or (started is not None and (started < arrived - self.ttl_s or job.key != key)):
            job = self._latest = _Job(self, loop.create_future(), key)
            jobs.put(job)
        elif started is None:
            job.key = key  # it starts after this read: it renders this state or a newer one
        return job

    def run(self, job: _Job) -> tuple[Response | None, bool]:
        """Renders `job` (on the render thread), no sooner than min_gap_s after the previous render began;
        (response, ok)."""
        wait = self._last_start + self.min_gap_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        job.started = self._last_start = time.monotonic()
        try:
            response = self.render()
        except Exception:
            self.failures += 1
            now = time.monotonic()
            if now - self._logged_at >= FAILURE_LOG_EVERY_S:
                self._logged_at = now
                log.exception("rendering an HTTP route failed (%d failures so far; logged at most once a minute)",
                              self.failures)
            return None, False
        self.renders += 1
        return response, True


def _pending_bytes(transport: asyncio.BaseTransport) -> int:
    """Bytes the client sent that the loop has not read yet (0 when unknown)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    buf = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, buf, True)
    except OSError:
        return 0
    return buf[0]


class HttpListener:
    def __init__(self, host: str, port: int, routes: dict[str, Callable[[], Response] | SharedRender],
                 max_connections: int = 64, timeout_s: float = 5.0):
        self.routes = routes
        self.max_connections, self.timeout_s = max_connections, timeout_s
        self.open_connections = 0
        self.refused_connections = 0  # over the cap, nothing evictable: closed at accept
        self.evicted_connections = 0  # over the cap: the oldest connection without a request yet, closed
        self.timed_out_connections = 0
        self._waiting: OrderedDict[int, asyncio.Transport] = OrderedDict()  # open, no whole request yet, oldest first
        # Bound here, in the caller's thread, so a taken port fails the daemon's start with the reason.
        family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self.sock = socket.create_server((host, port), family=family, backlog=128)
        self.address = "%s:%d" % self.sock.getsockname()[:2]
        self._loop = asyncio.new_event_loop()
        self._server = None
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="edgeinfer-http", daemon=True)
        self._renderer = threading.Thread(target=self._render_forever, name="edgeinfer-http-render", daemon=True)
        self._started = threading.Event()

    def start(self) -> None:
        self._renderer.start()
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the HTTP listener did not start within 10 s")

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
            self._thread.join(10)
        self._jobs.put(None)
        if self._renderer.is_alive():
            self._renderer.join(10)
        self.sock.close()

    async def _shutdown(self) -> None:
        """Closes the listener and every open connection, then ends the loop (no task left pending)."""
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loop.stop()

    # ------------------------------------------------------------------ the render thread

    def _render_forever(self) -> None:
        while (job := self._jobs.get()) is not None:
            response, ok = job.route.run(job)
            try:
                self._loop.call_soon_threadsafe(_settle, job.future, response if ok else RENDER_FAILED)
            except RuntimeError:  # the loop is closed: stopping
                return

    # ------------------------------------------------------------------ the loop's thread

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.set_exception_handler(_quiet_cancelled)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, sock=self.sock, limit=MAX_HEADER_BYTES))
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            self._loop.close()

    def _evictable(self) -> asyncio.Transport | None:
        """Takes the oldest connection without a request whose socket holds no unread bytes either: a client
        whose request is there but not read yet (a burst of accepts runs before any read) is not evicted."""
        for key, transport in self._waiting.items():
            if transport.is_closing() or _pending_bytes(transport) == 0:
                del self._waiting[key]
                return transport
        return None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open_connections >= self.max_connections:
            victim = self._evictable()
            if victim is None:  # every slot answers, or holds a request not read yet: this one waits for none
                self.refused_connections += 1
                writer.transport.abort()  # the fd is freed now; the client sees a reset
                return
            # Half-open floods evict each other: an honest client sends its request at once.
            victim.abort()
            self.evicted_connections += 1
        self.open_connections += 1
        key = id(writer)
        self._waiting[key] = writer.transport
        try:
            await asyncio.wait_for(self._serve_one(reader, writer, key), self.timeout_s)
        except asyncio.TimeoutError:
            self.timed_out_connections += 1
        except asyncio.CancelledError:
            pass  # stop(): end quietly (asyncio.streams' callback raises on a cancelled task in 3.11)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # the client went away or sent something unreadable: nothing to answer
        except Exception:  # a route failed: that request gets nothing, the listener serves on
            log.exception("HTTP request failed")
        finally:
            self._waiting.pop(key, None)
            self.open_connections -= 1
            if not writer.transport.is_closing():  # not answered (timeout, error, stop): drop it now
                writer.transport.abort()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: int) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        arrived = time.monotonic()
        self._waiting.pop(key, None)  # a whole request: no longer evictable
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            status, ctype, body = 400, "text/plain", b"bad request\n"
        elif parts[0] not in ("GET", "HEAD"):
            status, ctype, body = 405, "text/plain", b"only GET\n"
        else:
            route = self.routes.get(parts[1].split("?", 1)[0])
            if route is None:
                status, ctype, body = 404, "text/plain", b"not found\n"
            elif isinstance(route, SharedRender):
                # shield: a scraper that times out must not cancel the render others wait for
                status, ctype, body = await asyncio.shield(route.job_for(arrived, self._loop, self._jobs).future)
            else:
                status, ctype, body = route()
        header = (f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: {ctype}\r\n"
                  f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("latin-1")
        writer.write(header if parts[0] == "HEAD" else header + body)
        writer.close()  # a graceful close sends every byte first (drain() alone stops at the high-water mark)
        await writer.wait_closed()


def _quiet_cancelled(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """stop() cancels connections that may not have run yet (asyncio.streams in 3.11 reports each as an error
    in its done-callback), or whose read failed as it was cancelled (reported as never retrieved): neither is
    news. Anything else goes to the default handler (a log line)."""
    if not isinstance(context.get("exception"), (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError,
                                                 asyncio.LimitOverrunError)):
        loop.default_exception_handler(context)


def _settle(future: asyncio.Future, response: Response) -> None:
    if not future.done():
        future.set_result(response)
