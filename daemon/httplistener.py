"""A small, bounded HTTP/1.1 GET listener for /metrics, /healthz and /readyz.

Why not http.server.ThreadingHTTPServer (what 0.1 used, and what
prometheus_client's start_http_server uses): it spawns a thread per
connection with no cap and no timeout, so ~1,000 half-open connections gave
the daemon 1,000 threads, exhausted its fds, and /healthz stopped answering.
Here one thread runs an asyncio loop: an idle connection costs a socket and a
few hundred bytes, never a thread; at most `max_connections` are open (over
the cap, the oldest connection that has not sent a request yet is closed for
the new one: half-open floods evict each other, while an honest client, which
sends its request at once, gets answered); each must send its request and
take its answer within `timeout_s`. Only GET of the configured paths is
served, one request per connection (Connection: close), headers ≤ 8 KiB.
A route may be cached: /metrics is rendered at most once per
`cache_s` and the same bytes go to every scraper in that interval.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections import OrderedDict
from typing import Callable

log = logging.getLogger("edgeinfer.http")

Response = tuple[int, str, bytes]  # status, content type, body
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
MAX_HEADER_BYTES = 8192


class CachedRoute:
    """A route whose response is rebuilt at most once per `ttl_s`; concurrent requests share it.
    Only the listener's thread calls it, so no lock is needed."""

    def __init__(self, render: Callable[[], Response], ttl_s: float):
        self.render, self.ttl_s = render, ttl_s
        self._at, self._response = -1e18, None
        self.renders = 0

    def __call__(self) -> Response:
        now = time.monotonic()
        if self._response is None or now - self._at >= self.ttl_s:
            self._response, self._at = self.render(), now
            self.renders += 1
        return self._response


class HttpListener:
    def __init__(self, host: str, port: int, routes: dict[str, Callable[[], Response]],
                 max_connections: int = 64, timeout_s: float = 5.0):
        self.routes = routes
        self.max_connections, self.timeout_s = max_connections, timeout_s
        self.open_connections = 0
        self.refused_connections = 0  # over the cap with every slot answering: closed at accept
        self.evicted_connections = 0  # over the cap: the oldest connection without a request yet, closed
        self._waiting: OrderedDict[int, asyncio.Transport] = OrderedDict()  # open, no whole request yet, oldest first
        self.timed_out_connections = 0
        # Bound here, in the caller's thread, so a taken port fails the daemon's start with the reason.
        family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self.sock = socket.create_server((host, port), family=family, backlog=128)
        self.address = "%s:%d" % self.sock.getsockname()[:2]
        self._loop = asyncio.new_event_loop()
        self._server = None
        self._thread = threading.Thread(target=self._run, name="edgeinfer-http", daemon=True)
        self._started = threading.Event()

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the HTTP listener did not start within 10 s")

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
            self._thread.join(10)
        self.sock.close()

    async def _shutdown(self) -> None:
        """Closes the listener and every open connection, then ends the loop (no task left pending)."""
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loop.stop()

    # ------------------------------------------------------------------ the listener's thread

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, sock=self.sock, limit=MAX_HEADER_BYTES))
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            self._loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open_connections >= self.max_connections:
            if not self._waiting:  # every slot is answering a request: this one waits for none
                self.refused_connections += 1
                writer.transport.abort()  # the fd is freed now; the client sees a reset
                return
            # Full of connections that have not sent a request yet: drop the oldest of them. An honest
            # client sends its request at once, so half-open floods evict each other, not it.
            _, oldest = self._waiting.popitem(last=False)
            oldest.abort()
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
        del self._waiting[key]  # a whole request: no longer evictable
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            status, ctype, body = 400, "text/plain", b"bad request\n"
        elif parts[0] not in ("GET", "HEAD"):
            status, ctype, body = 405, "text/plain", b"only GET\n"
        else:
            route = self.routes.get(parts[1].split("?", 1)[0])
            status, ctype, body = route() if route else (404, "text/plain", b"not found\n")
        header = (f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: {ctype}\r\n"
                  f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("latin-1")
        writer.write(header if parts[0] == "HEAD" else header + body)
        writer.close()  # a graceful close sends every byte first (drain() alone stops at the high-water mark)
        await writer.wait_closed()
