"""`omnicore serve`: the OpenAI-compatible speech server (omnicore.server) from one model."""

from __future__ import annotations

import math
import os

from ..errors import InputError
from . import common


def cmd_serve(args) -> int:
    from .. import server

    if args.max_queue < 1:
        raise InputError(f"--max-queue must be at least 1, got {args.max_queue}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise InputError(f"--max-concurrency must be at least 1, got {args.max_concurrency}")
    for flag, value, least in (("--send-timeout", args.send_timeout, "> 0"),
                               ("--idle-timeout", args.idle_timeout, "> 0"),
                               ("--grace", args.grace, ">= 0")):
        if not (math.isfinite(value) and (value > 0 or least == ">= 0" and value == 0)):
            raise InputError(f"{flag} must be a finite number of seconds {least}, got {value}")
    server.serve(args.model, args.host, args.port, args.voices_dir, args.api_key, args.max_queue,
                 log_level="warning" if args.quiet else "info",
                 max_concurrency=args.max_concurrency, ui=args.ui, send_timeout=args.send_timeout,
                 idle_timeout=args.idle_timeout, grace=args.grace,
                 metrics_public=args.metrics_public, require_consent=args.require_consent,
                 precision=args.precision)
    return 0


def add_parser(sub) -> None:
    sv = sub.add_parser("serve", help="an OpenAI-compatible speech server (pip install 'omnicore[server]')",
                        description="Serve POST /v1/audio/speech (OpenAI's API), a voice library "
                                    "(also as OpenAI's voices and voice consents), /v1/models, "
                                    "/health and /metrics (and with --ui the demo at /ui) from "
                                    "one model.")
    common.add_model_options(sv)
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    sv.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    sv.add_argument("--voices-dir", help="the voice library's folder (voice prompts .npz, consents); "
                                         "servers may share one")
    sv.add_argument("--api-key", default=os.environ.get("OMNICORE_API_KEY"),
                    help="require 'Authorization: Bearer KEY' (env OMNICORE_API_KEY)")
    sv.add_argument("--metrics-public", action="store_true",
                    help="serve /metrics without the API key (/health is always open)")
    sv.add_argument("--max-queue", type=int, default=16,
                    help="speech requests in flight before 429 (default: %(default)s)")
    sv.add_argument("--max-concurrency", type=int,
                    help="requests synthesising at once, the others wait (default: all admitted; "
                         "the engine batches them)")
    sv.add_argument("--send-timeout", type=float, default=30.0, metavar="SECONDS",
                    help="cut a client that stops reading for this long, freeing its slot "
                         "(default: %(default)g)")
    sv.add_argument("--idle-timeout", type=float, default=30.0, metavar="SECONDS",
                    help="close a connection that sends nothing for this long: no request, a "
                         "stalled body, a silent WebSocket (default: %(default)g)")
    sv.add_argument("--grace", type=float, default=30.0, metavar="SECONDS",
                    help="on SIGTERM, let requests in flight finish for this long before "
                         "stopping them (default: %(default)g)")
    sv.add_argument("--require-consent", action="store_true",
                    help="a cloned voice needs the id of its speaker's consent recording "
                         "(POST /v1/audio/voice_consents), on /v1/audio/voices and /v1/voices")
    sv.add_argument("--ui", action="store_true",
                    help="also serve the Gradio demo at /ui, on the same model (needs a source "
                         "checkout and the demo extra)")
    sv.set_defaults(func=cmd_serve)
