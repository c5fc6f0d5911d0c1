"""`omnicore serve --ray [ADDRESS]`: the same HTTP server as a Ray Serve application, its
replicas each owning a model and its engine, requests for one voice sent to the replicas that
hold it.

    Serve's proxy (every node) -> Front (the ingress: reads the body, finds the voice)
        -> Speaker replica (handle.options(multiplexed_model_id=voice, stream=True))
           -> create_app(ServerState): the routes of `omnicore serve`, run on the request's
              ASGI scope and body; its ASGI messages stream back through Front to the proxy

Front is a relay of a few lines (num_cpus 0): every route is `omnicore serve`'s own, run by a
Speaker. Clients (the OpenAI SDK) never send Serve's `serve_multiplexed_model_id` header, so
Front reads the speech body's `voice` and routes on it with `ray.serve.multiplexed`: a Speaker
keeps the voices it served (`Speaker.voice_prompt`, the library's prompt cache underneath), and
Front's router sends a voice to its home, the replica that last took it (ray_router.py), then
to one that holds it. The voices folder stays the one library, written atomically under its
lock (library.py): on several nodes a folder every node sees. Front also keeps the cluster's
voice tally, which the Speakers report to and `/metrics` reads (not an actor of its own: every
Ray actor wakes 100 times a second, on the cores the engines use).

Faults: a Speaker lost before the response started is a 503 the client can retry (Serve sends
new requests to live replicas); one lost mid-stream aborts the connection, so the client's read
fails (a raw or SSE stream is never closed as if it were complete). A Speaker that cannot load
the model fails the deployment, reported by the command at start-up.

The WebSocket: Front accepts the connection's messages into a queue, a Speaker runs the route
and takes them one handle call each (`next_message`: Front is one replica, so the call finds
the queue); what the route sends streams back as for HTTP. A replica lost closes it with 1011.

Not through Serve: the connections' clocks of runtime.py (Serve's proxy has its own), the demo
at /ui.

Ray is imported only here, when `--ray` is given (the `ray` extra, which includes Serve).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import threading

from ...errors import ConfigError, InputError

APP = "omnicore"
INSTALL = "pip install 'omnicore[ray]'"
# Conversations one replica carries at once, as the autoscaler's target (Serve's
# target_ongoing_requests): a GPU's measured batch (docs/performance.md, NVIDIA H200: 8 at
# once), else the replica's cores over the cores one conversation needs to play without gaps
# (docs/performance.md, "Sizing"), at least 1.
GPU_CONVERSATIONS = 8
CORES_PER_CONVERSATION = {"exact": 46, "fast": 10, "live": 10}
# ASGI messages a Speaker runs ahead of its relay: a stream is paced by its reader.
AHEAD = 8
INBOX = 64  # a WebSocket's messages Front holds for its Speaker
OBJECT_STORE_BYTES = 256 * 1024 ** 2
VOICE_SLOTS = 64  # voices a Speaker keeps for routing (serve.multiplexed's LRU)
ROUTER = "omnicore.apps.server.ray_router:VoiceRouter"
# A local Ray shares its cores with the engines, and each slice of its own CPU is taken from an
# engine thread that its BLAS partner then waits for. So its Serve controller polls every 0.5 s,
# not Serve's 0.1 s (voice placement does not wait for it: ray_router.py), and Ray's own
# metrics, which nothing here reads (the dashboard is off; `/metrics` is omnicore's), are not
# collected. The environment's own values win.
QUIET = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5", "RAY_enable_metrics_collection": "false"}
log = logging.getLogger("omnicore.serve")


def import_serve():
    """(ray, ray.serve), or ConfigError naming the extra, in one line."""
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise ConfigError(f"--ray needs Ray Serve, which is not installed ({exc}); install the "
                          f"extra: {INSTALL}") from None
    return ray, serve


def parse_autoscale(spec: str | None) -> tuple[int, int] | None:
    """'MIN:MAX' -> (MIN, MAX), 1 <= MIN <= MAX (MIN 0 would make the first request wait for a
    model to load)."""
    if spec is None:
        return None
    lo, sep, hi = spec.partition(":")
    if not (sep and lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi)):
        raise InputError(f"--autoscale wants MIN:MAX replicas with 1 <= MIN <= MAX, got {spec!r}")
    return int(lo), int(hi)


def target_ongoing(profile: str, cpus: float, gpus: float) -> int:
    """Requests per replica the autoscaler aims at (see GPU_CONVERSATIONS)."""
    if gpus > 0:
        return GPU_CONVERSATIONS
    return max(1, int(cpus // CORES_PER_CONVERSATION[profile]))


def wire_scope(scope: dict) -> dict:
    """An HTTP request's or a WebSocket's ASGI scope, what a Speaker's app reads of it, for
    the handle call."""
    keep = ("type", "asgi", "http_version", "method", "scheme", "path", "raw_path",
            "query_string", "headers", "client", "server", "subprotocols")
    out = {k: scope[k] for k in keep if k in scope}
    out["root_path"] = ""  # the routes are at /, whatever prefix Serve mounted
    out["headers"] = [(bytes(k), bytes(v)) for k, v in scope.get("headers", ())]
    return out


def voice_of(scope: dict, body: bytes) -> str:
    """The voice a speech request names ("" for any other request, or a body that is not
    JSON: the route answers it)."""
    if scope.get("method") != "POST" or scope.get("path") != "/v1/audio/speech":
        return ""
    try:
        voice = json.loads(body).get("voice")
    except (ValueError, AttributeError):
        return ""
    if isinstance(voice, dict):
        voice = voice.get("id")
    return voice if isinstance(voice, str) and 0 < len(voice) <= 128 else ""


def json_response(status: int, message: str, code: str) -> list[dict]:
    from .protocol import error_body

    body = json.dumps(error_body(status, message, None, code)).encode()
    return [{"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")]},
            {"type": "http.response.body", "body": body}]


class VoiceTally:
    """The cluster's voice affinity, kept by Front: each Speaker reports, per voice, the
    requests it served and how often its library parsed that voice's file."""

    def __init__(self):
        self.rows: dict[tuple[str, str], tuple[int, int]] = {}  # (replica, voice) -> (req, loads)
        self.replicas: dict[str, tuple[str, int]] = {}  # replica -> (node, pid)

    def hello(self, replica: str, node: str, pid: int) -> None:
        self.replicas[replica] = (node, pid)

    def bye(self, replica: str) -> None:
        self.replicas.pop(replica, None)

    def served(self, replica: str, voice: str, requests: int, loads: int) -> None:
        self.rows[(replica, voice)] = (requests, loads)

    def text(self) -> str:
        """Prometheus text: per replica and voice, requests and loads, and the hit rate."""
        out = ["# HELP omnicore_cluster_voice_requests speech requests with a voice, by the "
               "replica that served them", "# TYPE omnicore_cluster_voice_requests gauge"]
        out += [f'omnicore_cluster_voice_requests{{replica="{r}",voice="{v}"}} {n}'
                for (r, v), (n, _) in sorted(self.rows.items())]
        out += ["# HELP omnicore_cluster_voice_prompt_loads a voice's prompt parsed from its "
                "file, by replica (at most once per replica while the file is unchanged)",
                "# TYPE omnicore_cluster_voice_prompt_loads gauge"]
        out += [f'omnicore_cluster_voice_prompt_loads{{replica="{r}",voice="{v}"}} {n}'
                for (r, v), (_, n) in sorted(self.rows.items())]
        requests = sum(n for n, _ in self.rows.values())
        loads = sum(n for _, n in self.rows.values())
        rate = 1 - loads / requests if requests else 0
        out += ["# HELP omnicore_cluster_voice_hit_rate requests whose replica held the voice's "
                "prompt already: 1 - loads / requests", "# TYPE omnicore_cluster_voice_hit_rate "
                "gauge", f"omnicore_cluster_voice_hit_rate {rate}"]
        out += ["# HELP omnicore_cluster_replica a Speaker replica up (node, pid): started, and "
                "not stopped by Serve (a killed one, which could not say so, stays listed)",
                "# TYPE omnicore_cluster_replica gauge"]
        out += [f'omnicore_cluster_replica{{replica="{r}",node="{n}",pid="{p}"}} 1'
                for r, (n, p) in sorted(self.replicas.items())]
        return "\n".join(out) + "\n"


class Speaker:
    """One replica: the model, its engine and `omnicore serve`'s app over them, built by Serve
    (a ray.serve.deployment); its thread count is in its environment (cluster.actor_env)."""

    def __init__(self, model: str, state: dict, precision: str, profile: str):
        import ray
        from ray import serve

        from . import log_model, server_state
        from .app import create_app

        self.server = server_state(model, precision, profile, **state)
        self.app = create_app(self.server)
        self.server.warm_up(log)  # compiled before the replica takes a request
        ctx = serve.get_replica_context()
        self.replica = getattr(ctx, "replica_id", None)
        self.replica = getattr(self.replica, "unique_id", None) or str(ctx.replica_tag)
        self.served: dict[str, int] = {}
        # the tally, in Front (calls queue until it is up; none waits for an answer)
        self.front = serve.get_deployment_handle("Front", APP)
        self.front.hello.remote(self.replica, ray.util.get_node_ip_address(), os.getpid())
        self.server.metrics_extra = lambda: self.front.text.remote().result(timeout_s=10)
        log_model(log, self.server, model)

    async def voice_prompt(self, voice: str):
        """The voice's prompt, loaded into this replica (build() wraps it in
        ray.serve.multiplexed under the same name: the voices a replica holds are what Serve
        routes on)."""
        return await self.server.in_thread(self.server.voice, voice)

    async def http(self, scope: dict, body: bytes):
        """Run the app on one HTTP request; yields its ASGI messages (a stream paced by its
        reader). A cancelled call is the client gone: the app sees http.disconnect."""
        from ray import serve

        voice = serve.get_multiplexed_model_id()
        if voice:
            try:
                await self.voice_prompt(voice)
            except Exception:  # noqa: BLE001 - the route itself answers a bad or unknown voice
                pass
            else:
                self.report(voice)
        gone = asyncio.Event()
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            if pending:
                return pending.pop()
            await gone.wait()
            return {"type": "http.disconnect"}
        async for message in self._run(scope, receive, gone):
            yield message

    async def socket(self, scope: dict, conn: str):
        """Run the app on one WebSocket; yields what it sends, and takes what the client sends
        from the Front replica holding the connection (`next_message`), one call each."""
        gone = asyncio.Event()

        async def receive():
            got = asyncio.ensure_future(self.front.next_message.remote(conn))
            left = asyncio.ensure_future(gone.wait())
            await asyncio.wait({got, left}, return_when=asyncio.FIRST_COMPLETED)
            left.cancel()
            if got.done():
                return got.result()
            got.cancel()
            return {"type": "websocket.disconnect", "code": 1006}
        async for message in self._run(scope, receive, gone):
            yield message

    async def _run(self, scope: dict, receive, gone: asyncio.Event):
        """The app on `scope`: its ASGI messages as it sends them (at most AHEAD ahead of
        their reader); `gone` is set when the reader stops (the call ended or cancelled)."""
        out: asyncio.Queue = asyncio.Queue(AHEAD)
        end = object()

        async def send(message):
            if message["type"] in ("http.response.start", "websocket.accept"):
                # Serve's proxy adds x-request-id; the replica's name for the operator
                headers = [(k, v) for k, v in message.get("headers", ()) if k != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-omnicore-replica",
                                                             self.replica.encode())]}
            await out.put(message)

        async def run():
            try:
                await self.app(scope, receive, send)
            finally:
                if not gone.is_set():
                    await out.put(end)
        task = asyncio.ensure_future(run())
        try:
            while (message := await out.get()) is not end:
                yield message
            await task  # an error the app let out ends the stream with it
        finally:
            gone.set()
            while not task.done():  # let the app see the disconnect and end
                while not out.empty():
                    out.get_nowait()
                await asyncio.wait({task}, timeout=0.05)

    def __del__(self):  # Serve stops the replica (scaled down, deleted)
        if getattr(self, "front", None) is not None:
            with contextlib.suppress(Exception):  # the application is going too
                self.front.bye.remote(self.replica)

    def report(self, voice: str) -> None:
        self.served[voice] = self.served.get(voice, 0) + 1
        self.front.served.remote(self.replica, voice, self.served[voice],
                                 self.server.voices.loads.get(voice, 0))


class Front:
    """The ingress's ASGI app: each HTTP request's body read (bounded), its voice found, and
    the request run by a Speaker chosen for that voice; its messages relayed as they come."""

    def __init__(self, max_body: int):
        self.max_body = max_body
        self._speaker = None

    def speaker(self):
        if self._speaker is None:
            from ray import serve

            self._speaker = serve.get_deployment_handle("Speaker", APP)
        return self._speaker

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            return await send({"type": "lifespan.shutdown.complete"})
        if scope["type"] == "websocket":
            return await self.relay_socket(scope, receive, send)
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body:
                for m in json_response(413, f"request body over {self.max_body:,} bytes",
                                       "upload_too_large"):
                    await send(m)
                return
            if not message.get("more_body"):
                break
        await self.relay(scope, bytes(body), receive, send)

    async def relay(self, scope, body: bytes, receive, send):
        voice = voice_of(scope, body)
        call = self.speaker().options(stream=True, multiplexed_model_id=voice).http.remote(
            wire_scope(scope), body)

        async def disconnected():
            while (await receive())["type"] != "http.disconnect":
                pass
        gone = asyncio.ensure_future(disconnected())
        started = False
        try:
            while True:
                step = asyncio.ensure_future(call.__anext__())
                await asyncio.wait({step, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():  # the client left: the Speaker's app sees a disconnect
                    step.cancel()
                    call.cancel()
                    return
                try:
                    message = step.result()
                except StopAsyncIteration:
                    return
                except Exception as exc:  # noqa: BLE001 - the replica was lost (RayActorError)
                    if started:  # mid-stream: abort the connection, never end it as if whole
                        raise ConnectionAbortedError(
                            f"the replica serving this stream was lost: {exc}") from None
                    for m in json_response(503, "the replica serving this request was lost; "
                                                "retry", "replica_lost"):
                        await send(m)
                    return
                started = started or message["type"] == "http.response.start"
                await send(message)
        finally:
            gone.cancel()


    async def relay_socket(self, scope, receive, send):
        """A WebSocket run by a Speaker: what it sends relayed to the client; what the client
        sends queued here (INBOXES, a few messages: a client that floods waits) for the
        Speaker to take (`next_message`)."""
        conn = secrets.token_hex(12)
        inbox: asyncio.Queue = asyncio.Queue(INBOX)
        INBOXES[conn] = inbox

        async def pump():
            while (message := await receive())["type"] != "websocket.disconnect":
                await inbox.put(message)
            await inbox.put(message)
        pumping = asyncio.ensure_future(pump())
        call = self.speaker().options(stream=True).socket.remote(wire_scope(scope), conn)
        accepted = False
        try:
            async for message in call:
                accepted = accepted or message["type"] == "websocket.accept"
                await send(message)
        except Exception:  # noqa: BLE001 - the replica was lost: a close the client can tell
            await send({"type": "websocket.close", "code": 1011 if accepted else 1013,
                        "reason": "the replica serving this socket was lost"})
        finally:
            pumping.cancel()
            INBOXES.pop(conn, None)
            with contextlib.suppress(asyncio.QueueFull):  # a Speaker still waiting: it ends
                inbox.put_nowait({"type": "websocket.disconnect", "code": 1006})


# WebSocket connections open on this Front replica: id -> what their clients sent, not yet
# taken by the Speaker running them.
INBOXES: dict[str, asyncio.Queue] = {}


async def next_message(conn: str) -> dict:
    """The next message a client sent on WebSocket `conn` (a disconnect once it is gone)."""
    inbox = INBOXES.get(conn)
    if inbox is None:
        return {"type": "websocket.disconnect", "code": 1006}
    return await inbox.get()


def build(serve, model: str, state: dict, *, precision: str, profile: str, replicas: int,
          autoscale: tuple[int, int] | None, cpus: float, gpus: float, max_queue: int):
    """The Serve application: Front (ingress) and the Speaker deployment."""
    from ..cluster import actor_env
    from .protocol import MAX_UPLOAD_BYTES

    # threads as the batch's actors set them; a GPU replica runs the CuPy backend
    env = {**actor_env(max(1, int(cpus))), **({"OMNICORE_BACKEND": "cupy"} if gpus else {})}
    options = {"max_constructor_retry_count": 2,
               "ray_actor_options": {"num_cpus": cpus, "num_gpus": gpus,
                                     "runtime_env": {"env_vars": env}},
               "max_ongoing_requests": max_queue, "health_check_period_s": 2,
               "health_check_timeout_s": 30, "graceful_shutdown_timeout_s": 30,
               # a voice's requests go to its home replica the moment it has one (ray_router.py)
               "request_router_config": {"request_router_class": ROUTER}}
    if autoscale is None:
        options["num_replicas"] = replicas
    else:
        options["autoscaling_config"] = {
            "min_replicas": autoscale[0], "max_replicas": autoscale[1],
            "target_ongoing_requests": target_ongoing(profile, cpus, gpus),
            "upscale_delay_s": 2, "downscale_delay_s": 20, "metrics_interval_s": 1,
            "look_back_period_s": 4}
    speaker_cls = type("Speaker", (Speaker,), {
        "voice_prompt": serve.multiplexed(max_num_models_per_replica=VOICE_SLOTS)(
            Speaker.voice_prompt)})
    speaker = serve.deployment(name="Speaker", **options)(speaker_cls)

    front_app = Front(MAX_UPLOAD_BYTES + 64 * 1024)  # a form's fields beside its largest upload

    @serve.ingress(front_app)
    class FrontDeployment(VoiceTally):  # the tally's calls are the deployment's methods
        def __init__(self, speaker_app):
            super().__init__()
            self.speaker_app = speaker_app  # binds the Speaker deployment into the application

        async def next_message(self, conn: str) -> dict:
            return await next_message(conn)

    front = serve.deployment(name="Front", num_replicas=1, max_ongoing_requests=1000,
                             ray_actor_options={"num_cpus": 0})(FrontDeployment)
    return front.bind(speaker.bind(model, state, precision, profile))


def local_ray() -> tuple[dict, dict]:
    """ray.init's arguments for a local Ray on this machine's cores (a small object store:
    requests and audio pieces), and the environment its processes get (QUIET)."""
    return ({"address": "local", "num_cpus": os.cpu_count(),
             "object_store_memory": OBJECT_STORE_BYTES, "include_dashboard": False}, dict(QUIET))


def drop_log_monitor(ray) -> None:
    """Stop a local Ray's log monitor, just started by ray.init here. It forwards workers'
    output to drivers, and none here asks for it (log_to_driver=False); its scan of the log
    folder every 0.1 s was a tenth of the local Ray's own CPU. The logs stay in Ray's session
    folder. Ray's own Node call, the one ray.shutdown uses; where a Ray lacks it, it runs on."""
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    with contextlib.suppress(AttributeError, KeyError):
        worker._global_node.kill_log_monitor(check_alive=False)


def run(model: str, address: str | None, host: str, port: int, state: dict, *, precision: str,
        profile: str, replicas: int, autoscale: tuple[int, int] | None, cpus: float,
        gpus: float, max_queue: int) -> None:
    """Deploy on Ray (a local instance without `address`; "auto"; "ray://HOST:10001") and
    serve until SIGINT or SIGTERM, then delete the application (and stop the Ray this
    started). A deployment whose replicas cannot load the model is a ConfigError now."""
    ray, serve = import_serve()
    started = False
    if not ray.is_initialized():
        local, env = local_ray()
        if not address:  # read by the processes the local Ray starts, from this environment
            for key, value in env.items():
                os.environ.setdefault(key, value)
        # A local raylet has 30 s to register (Ray's fixed limit), which a loaded machine can
        # miss: a local start is tried twice.
        for attempt in range(1 if address else 2):
            try:
                ray.init(**({"address": address} if address else local),
                         logging_level="ERROR", log_to_driver=False)
                if not address:
                    drop_log_monitor(ray)
                break
            except Exception as exc:  # noqa: BLE001 - Ray's start or join failed: one line
                ray.shutdown()  # what a half-started local Ray left
                if address or attempt:
                    raise ConfigError(f"Ray did not start at {address!r}: {exc}" if address
                                      else f"a local Ray did not start: {exc}") from None
                log.info("A local Ray did not start (%s); trying again", exc)
        started = not address
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        serve.start(http_options={"host": host, "port": port})
        app = build(serve, model, state, precision=precision, profile=profile,
                    replicas=replicas, autoscale=autoscale, cpus=cpus, gpus=gpus,
                    max_queue=max_queue)
        try:
            serve.run(app, name=APP, route_prefix="/", blocking=False)
        except RuntimeError as exc:
            raise ConfigError(f"the Speaker replicas did not start (the model {model!r} must "
                              f"load on every node): {str(exc).strip().splitlines()[-1]}") from None
        base = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        log.info("Serving %s on Ray Serve at http://%s: %s, %s CPU%s per replica", model, base,
                 f"{replicas} replicas" if autoscale is None
                 else f"{autoscale[0]}-{autoscale[1]} replicas (target "
                      f"{target_ongoing(profile, cpus, gpus)} requests each)",
                 f"{cpus:g}", f" + {gpus:g} GPU" if gpus else "")
        while not stop.wait(0.5):
            pass
        log.info("Stopping: deleting the application")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        try:
            serve.delete(APP)
        except Exception:  # noqa: BLE001 - nothing was deployed, or Ray is already gone
            pass
        if started:
            serve.shutdown()
            ray.shutdown()
