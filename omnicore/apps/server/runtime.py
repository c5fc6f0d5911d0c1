"""How `omnicore serve` runs under uvicorn: the connections' clocks and a graceful shutdown.

Clocks, each counted in /metrics (omnicore_timeouts_total{kind}):

    send   a connection whose client takes no byte for `send_timeout` seconds, while bytes
           wait for it, is cut: a stream's passes are cancelled and its slot comes back. On
           Linux the clock reads the kernel (the bytes the client has acknowledged, TCP_INFO,
           and those still queued for it, SIOCOUTQ): it runs from the client's last
           acknowledgement, so from when it stopped reading, whether or not the server has
           made anything new to send meanwhile (however loaded it is), and a slow reader that
           keeps reading is never cut. Elsewhere it runs while the transport holds bytes the
           kernel refused (its buffer limit is 0: any byte refused pauses the writer) and is
           put back when the kernel takes some.
    idle   a connection that has not sent a whole request head within `idle_timeout` seconds
           of connecting (or of its previous response) is closed, and a request body that
           stalls that long is a 408; a WebSocket with nothing to say likewise (stream_input).
    body   a request body not all in within `body_timeout` seconds of its first read (one
           that trickles a byte at a time never stalls) is a 408, `body_timeout`.

Shutdown (SIGTERM, or Ctrl-C): the server drains: new work gets a 503 with Retry-After and
/health says "draining" (the listening socket stays open, so a client is told, not refused);
work in flight may finish within `grace` seconds; what is left then is stopped (a JSON 503, an
SSE or WebSocket error event; a raw audio stream can only be cut), the worker threads are
waited for, and only then does uvicorn finish: nothing computes after it says so. A second
signal ends the grace at once.

The clocks are uvicorn's own protocols (h11, and its WebSocket protocol) with timers added at
the transport's flow-control callbacks: `pause_writing` is the one place that knows a client
has stopped reading, whatever the route.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time

import uvicorn

from .protocol import CUT, HTTPError
from .state import ServerState

log = logging.getLogger("uvicorn.error")
# The kernel's send buffer of a connection (it grows to megabytes by default): minutes of audio
# could sit there unread before the send clock starts. This much still carries audio many times
# faster than real time over a slow link. (Linux doubles what it is asked for: see
# `limit_send_buffer`.)
SEND_BUFFER_BYTES = 128 * 1024
# A request body's overall deadline by default (--body-timeout): a 20 MiB clip at ~2 Mbit/s.
BODY_TIMEOUT_S = 120.0
SEND_CHECKS = 10  # the send clock looks for progress this many times per --send-timeout,
SEND_CHECK_S = 0.25  # and at least this often while bytes wait for the client (its precision)
_TCPI_BYTES_ACKED = 120  # offset of tcpi_bytes_acked (u64) in Linux's struct tcp_info (>= 4.1)
STOP_WAIT_S = 10.0   # after the grace: how long stopped work may take to unwind
CLOSE_WAIT_S = 30.0  # then: how long the worker threads may take to end


def limit_send_buffer(transport) -> None:
    """At most SEND_BUFFER_BYTES queued in the kernel for this connection, and nothing held
    in the transport before the writer is paused (so the send clock starts as soon as the
    client stops taking bytes)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        got = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        if got > SEND_BUFFER_BYTES:  # Linux doubles the size asked for (its own bookkeeping)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF,
                            SEND_BUFFER_BYTES * SEND_BUFFER_BYTES // got)
    transport.set_write_buffer_limits(high=0, low=0)


def kernel_send_state(sock) -> tuple[int, int] | None:
    """(bytes the peer has acknowledged so far, bytes the kernel still holds for it) of a TCP
    socket, where the system says (Linux); None elsewhere, or once the socket is closed."""
    if sock is None or not hasattr(socket, "TCP_INFO"):
        return None
    try:
        import fcntl
        import termios

        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        held = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4)  # SIOCOUTQ on a socket
    except (ImportError, OSError, AttributeError):
        return None
    if len(info) < _TCPI_BYTES_ACKED + 8:
        return None
    return (struct.unpack_from("=Q", info, _TCPI_BYTES_ACKED)[0],
            struct.unpack("=i", held)[0])


class KernelSendClock:
    """The send clock read from the kernel (Linux): reset by every byte the client acknowledges
    and whenever nothing waits for it, expired after `timeout` seconds without (`works` is
    False where the system does not say)."""

    def __init__(self, sock, timeout: float, now: float):
        self.sock, self.timeout = sock, timeout
        state = kernel_send_state(sock)
        self.works, self.expired = state is not None, False
        self.acked, self.since = (state[0] if state else 0), now

    def look(self, now: float, buffered: int) -> float | None:
        """One look (`buffered`: the bytes the transport still holds): the seconds until the
        next, or None when the socket is closed; `expired` says the clock ran out."""
        state = kernel_send_state(self.sock)
        if state is None:
            return None
        acked, held = state
        waiting = held + buffered > 0
        if acked != self.acked or not waiting:
            self.acked, self.since = acked, now
        elif now - self.since >= self.timeout:
            self.expired = True
            return 0.0
        step = self.timeout / SEND_CHECKS
        if waiting:
            step = min(step, SEND_CHECK_S, self.since + self.timeout - now)
        return max(step, 0.0)


class _Clocks:
    """Timers on a uvicorn protocol: `send` while its transport holds bytes the client has
    not taken, `idle` as a subclass arms it. An expired timer counts itself and drops the
    connection."""

    send_timeout: float
    on_timeout = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        limit_send_buffer(transport)
        self._send_clock = KernelSendClock(transport.get_extra_info("socket"), self.send_timeout,
                                           self.loop.time())
        self._kernel_clock = self._send_clock.works
        if self._kernel_clock:
            self._arm("send", self.send_timeout / SEND_CHECKS, self._watch_send)

    def _arm(self, kind: str, seconds: float, then=None) -> None:
        """In `seconds`, call `then()` (by default: the clock `kind` expires)."""
        self._disarm(kind)
        self.__dict__[f"_clock_{kind}"] = self.loop.call_later(
            seconds, then or (lambda: self._expired(kind)))

    def _disarm(self, kind: str) -> None:
        handle = self.__dict__.pop(f"_clock_{kind}", None)
        if handle is not None:
            handle.cancel()

    def _expired(self, kind: str) -> None:
        self.__dict__.pop(f"_clock_{kind}", None)
        self.on_timeout(kind)
        self.transport.abort()  # a full buffer would keep a plain close() waiting to drain

    def _watch_send(self) -> None:
        """The kernel's send clock (KernelSendClock), for the connection's life."""
        step = self._send_clock.look(self.loop.time(), self.transport.get_write_buffer_size())
        if step is None:  # closed under us
            return
        if self._send_clock.expired:
            return self._expired("send")
        self._arm("send", step, self._watch_send)

    def _check_send(self) -> None:
        """Without the kernel's figures, while paused: cut the connection once the transport's
        buffer has not shrunk for send_timeout (it only shrinks as the kernel takes bytes)."""
        now, left = self.loop.time(), self.transport.get_write_buffer_size()
        if left < self._send_left:  # the client took some: the clock starts again
            self._send_left, self._send_since = left, now
        if now - self._send_since >= self.send_timeout:
            self._expired("send")
        else:
            step = min(self.send_timeout / SEND_CHECKS, self._send_since + self.send_timeout - now)
            self._arm("send", step, self._check_send)

    def pause_writing(self) -> None:
        super().pause_writing()
        if not self._kernel_clock:
            self._send_left = self.transport.get_write_buffer_size()
            self._send_since = self.loop.time()
            self._arm("send", self.send_timeout / SEND_CHECKS, self._check_send)

    def resume_writing(self) -> None:
        super().resume_writing()
        if not self._kernel_clock:
            self._disarm("send")

    def connection_lost(self, exc) -> None:
        self._disarm("send")
        self._disarm("idle")
        super().connection_lost(exc)


def protocols(send_timeout: float, idle_timeout: float, on_timeout):
    """(http, ws): uvicorn's h11 and WebSocket protocol classes with the clocks."""
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

    clocked = type("Clocked", (_Clocks,), {"send_timeout": send_timeout,
                                           "on_timeout": staticmethod(on_timeout)})

    class Http(clocked, H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._seen = None  # the last request cycle the idle clock saw start
            self._arm("idle", idle_timeout)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not self._seen:  # a whole request head arrived
                self._seen = self.cycle
                self._disarm("idle")
                # How the app cuts this connection (a raw stream the server stops: no bytes
                # that would pass for its end), before its task first runs.
                if self.cycle is not None:
                    self.cycle.scope.setdefault("extensions", {})[CUT] = self.transport.abort

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm("idle", idle_timeout)

        def handle_websocket_upgrade(self, event) -> None:
            self._disarm("idle")  # the transport is the WebSocket protocol's from here
            self._disarm("send")
            super().handle_websocket_upgrade(event)

    if AutoWebSocketsProtocol is None:  # neither websockets nor wsproto: no WebSocket
        return Http, None

    class Ws(clocked, AutoWebSocketsProtocol):
        async def send(self, message) -> None:
            await super().send(message)
            if message["type"] == "websocket.http.response.body" and not message.get("more_body"):
                # A refusal (401, 503) is a complete answer to the handshake; uvicorn would log
                # it as an app that never answered.
                self.handshake_complete = True

    return Http, Ws


class BodyClock:
    """ASGI middleware: a request body that stalls for `idle_timeout` seconds, or that is not
    all in within `body_timeout` seconds of its first read however steadily it trickles, is a
    408 (raised from `receive` into the route, which answers it as JSON)."""

    def __init__(self, app, idle_timeout: float, on_timeout,
                 body_timeout: float = BODY_TIMEOUT_S):
        self.app, self.idle_timeout, self.on_timeout = app, idle_timeout, on_timeout
        self.body_timeout = body_timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body_done = False
        deadline = None

        async def timed_receive():
            nonlocal body_done, deadline
            if body_done:  # after the body, receive() waits for a disconnect: no clock
                return await receive()
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.body_timeout
            left = deadline - now
            try:
                message = await asyncio.wait_for(receive(), min(self.idle_timeout, left))
            except asyncio.TimeoutError:
                if left < self.idle_timeout:
                    self.on_timeout("body")
                    raise HTTPError(408, f"the request body took over {self.body_timeout:g} s "
                                         "(--body-timeout)", None, "body_timeout",
                                    {"Connection": "close"}) from None
                self.on_timeout("idle")
                raise HTTPError(408, f"the request body stalled (nothing for "
                                     f"{self.idle_timeout:g} s)", None, "request_timeout",
                                {"Connection": "close"}) from None
            body_done = message["type"] != "http.request" or not message.get("more_body")
            return message
        await self.app(scope, timed_receive, send)


class GracefulServer(uvicorn.Server):
    """uvicorn's server, draining on the first signal (see the module's docstring)."""

    def __init__(self, config: uvicorn.Config, state: ServerState, grace: float):
        super().__init__(config)
        self.state, self.grace = state, grace
        self._signals = 0
        self._drain_t0: float | None = None
        self._stop_t0: float | None = None

    def handle_exit(self, sig, frame) -> None:
        # Runs in the signal handler: only notes it; on_tick (on the loop) acts. Unlike
        # uvicorn, the signal is not raised again once served: a drained server exits 0.
        self._signals += 1

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            return True
        if not self._signals:
            return False
        now = time.monotonic()
        state = self.state
        if self._drain_t0 is None:
            self._drain_t0 = now
            state.drain()
            log.info("Draining: new requests get 503; %d in flight may finish within %g s "
                     "(signal again to stop them now)", state.load()["in_flight"], self.grace)
        if state.load()["in_flight"] == 0:
            return True
        if self._stop_t0 is None and (now - self._drain_t0 >= self.grace or self._signals > 1):
            self._stop_t0 = now
            log.warning("Stopping %d requests still in flight", state.stop_all())
        return self._stop_t0 is not None and now - self._stop_t0 > STOP_WAIT_S

    async def shutdown(self, sockets=None) -> None:
        await super().shutdown(sockets)
        self.state.stop_all()
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, self.state.close, CLOSE_WAIT_S):
            log.error("Worker threads still running after %g s", CLOSE_WAIT_S)


def run(app, state: ServerState, host: str, port: int, log_level: str, send_timeout: float,
        idle_timeout: float, grace: float, on_started=None,
        body_timeout: float = BODY_TIMEOUT_S) -> None:
    """Serve `app` until a signal, then shut down gracefully. `on_started()` is called once
    uvicorn has configured its logging (for the start-up lines)."""
    def counted(kind: str) -> None:
        state.m_timeouts.labels(kind).inc()
    http, ws = protocols(send_timeout, idle_timeout, counted)
    config = uvicorn.Config(BodyClock(app, idle_timeout, counted, body_timeout), host=host,
                            port=port,
                            log_level=log_level, http=http, ws=ws if ws is not None else "none",
                            timeout_graceful_shutdown=5)
    server = GracefulServer(config, state, grace)
    if on_started is not None:
        on_started()
    server.run()
