"""The servers, each on one model: `omnicore serve` (the OpenAI-compatible HTTP server,
omnicore.apps.server), `omnicore wyoming` (the Wyoming protocol, for Home Assistant) and
`omnicore mcp` (an MCP server, for LLM agents). They share the options of the voice library,
admission and the connections' clocks (`add_server_options`)."""

from __future__ import annotations

import argparse
import importlib.util
import math
import os

from ...errors import ConfigError, InputError
from ...model.config import PROFILES
from . import common
from .options import PROFILE_TRADE_OFF, add_generation_options, gen_kwargs

# The profile of a server's requests that name none. At full size on 2 CPU cores exact's first
# audio takes about a minute, past every voice client's patience (Home Assistant ~5 s, LiveKit's
# stock class 10 s, an MCP client 60 s); live's comes inside them (benchmarks/README.md, "First
# audio through each door"). It is approximate, so each door says so, and --profile exact (or a
# request's profile) asks for the reference's algorithm. The Python API and `say` stay exact.
DOOR_PROFILE = "live"
DOOR_PROFILE_HELP = (f"the profile of requests that name none (default {DOOR_PROFILE}: its first "
                     "audio fits a voice client's patience on a CPU; exact for the reference's "
                     "algorithm). ")


def check_server_options(args) -> None:
    """The shared options' values, checked before the model loads."""
    if args.voices_dir is not None and not args.voices_dir.strip():
        raise InputError("--voices-dir is empty: give a folder, or leave it out for the "
                         "default (OMNICORE_VOICES_DIR, else the user's data folder)")
    if args.max_queue < 1:
        raise InputError(f"--max-queue must be at least 1, got {args.max_queue}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise InputError(f"--max-concurrency must be at least 1, got {args.max_concurrency}")
    for flag, value, least in (("--send-timeout", args.send_timeout, "> 0"),
                               ("--idle-timeout", args.idle_timeout, "> 0"),
                               ("--grace", args.grace, ">= 0")):
        if not (math.isfinite(value) and (value > 0 or least == ">= 0" and value == 0)):
            raise InputError(f"{flag} must be a finite number of seconds {least}, got {value}")


def require_extra(module: str, extra: str) -> None:
    """A ConfigError, before any model loads, when a server's extra is not installed."""
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"this command needs its extra: pip install 'omnicore[{extra}]'")


def cmd_serve(args) -> int:
    from .. import server
    from ..server.voices import parse_alias

    check_server_options(args)
    if not (math.isfinite(args.body_timeout) and args.body_timeout > 0):
        raise InputError(f"--body-timeout must be a finite number of seconds > 0, got "
                         f"{args.body_timeout}")
    aliases = dict(parse_alias(spec) for spec in args.voice_alias)
    if args.ray is not None:
        return serve_on_ray(args, aliases)
    for flag, value, default in (("--replicas", args.replicas, 1),
                                 ("--autoscale", args.autoscale, None),
                                 ("--cpus-per-replica", args.cpus_per_replica, 1.0),
                                 ("--gpus-per-replica", args.gpus_per_replica, 0.0)):
        if value != default:
            raise InputError(f"{flag} sets the replicas on Ray Serve; it needs --ray")
    server.serve(args.model, args.host, args.port, args.voices_dir, args.api_key, args.max_queue,
                 log_level="warning" if args.quiet else "info",
                 max_concurrency=args.max_concurrency, ui=args.ui, send_timeout=args.send_timeout,
                 idle_timeout=args.idle_timeout, grace=args.grace,
                 metrics_public=args.metrics_public, require_consent=args.require_consent,
                 precision=args.precision, voice_aliases=aliases, profile=args.profile,
                 body_timeout=args.body_timeout)
    return 0


def serve_on_ray(args, aliases: dict) -> int:
    """`serve --ray [ADDRESS]`: the same app on Ray Serve (omnicore.apps.server.ray_serve)."""
    from ..server import log_to_stderr, ray_serve
    from ..server.voices import check_aliases

    if args.ui:
        raise InputError("--ui is not served through Ray Serve: run it on a node's own "
                         "`omnicore serve --ui`")
    autoscale = ray_serve.parse_autoscale(args.autoscale)
    if autoscale is not None and args.replicas != 1:
        raise InputError("give --replicas N or --autoscale MIN:MAX, not both")
    if args.replicas < 1 or args.cpus_per_replica <= 0 or args.gpus_per_replica < 0:
        raise InputError("--replicas must be at least 1, --cpus-per-replica > 0 and "
                         "--gpus-per-replica >= 0")
    if args.voices_dir is None:
        from ..server.library import default_folder
        args.voices_dir = str(default_folder())  # every replica on the one library
    check_aliases(args.voices_dir, aliases)
    log_to_stderr(ray_serve.log, args.quiet)
    state = {"voices_dir": args.voices_dir, "api_key": args.api_key, "max_queue": args.max_queue,
             "max_concurrency": args.max_concurrency, "metrics_public": args.metrics_public,
             "require_consent": args.require_consent, "voice_aliases": aliases}
    ray_serve.run(args.model, args.ray or None, args.host, args.port, state,
                  precision=args.precision, profile=args.profile, replicas=args.replicas,
                  autoscale=autoscale, cpus=args.cpus_per_replica, gpus=args.gpus_per_replica,
                  max_queue=args.max_queue)
    return 0


def cmd_wyoming(args) -> int:
    check_server_options(args)
    require_extra("wyoming", "wyoming")
    from ..server import wyoming_server

    synth = speech_settings(args)
    profile = synth.pop("profile")  # the model's default: each text may not name its own
    wyoming_server.serve(args.model, args.uri, args.voice or None, synth, profile=profile,
                         precision=args.precision, send_timeout=args.send_timeout,
                         grace=args.grace, quiet=args.quiet, all_languages=args.all_languages,
                         voices_dir=args.voices_dir,
                         max_queue=args.max_queue, max_concurrency=args.max_concurrency,
                         idle_timeout=args.idle_timeout, require_consent=args.require_consent)
    return 0


def cmd_mcp(args) -> int:
    check_server_options(args)
    require_extra("mcp", "mcp")
    from ..server import mcp_server

    synth = speech_settings(args)
    profile = synth.pop("profile")  # the model's default, as serve's
    mcp_server.serve(args.model, args.output_dir, synth, profile=profile, http=args.http,
                     host=args.host, port=args.port, api_key=args.api_key,
                     precision=args.precision, send_timeout=args.send_timeout, grace=args.grace,
                     quiet=args.quiet, voices_dir=args.voices_dir, max_queue=args.max_queue,
                     max_concurrency=args.max_concurrency, idle_timeout=args.idle_timeout,
                     require_consent=args.require_consent)
    return 0


def speech_settings(args) -> dict:
    """The generation settings of every text (`add_generation_options(sp, texts=False)`), as
    the model's keyword arguments."""
    synth = gen_kwargs(args)
    for key in ("instruct", "duration"):
        synth.pop(key, None)
    return synth


def add_server_options(sp, what: str = "requests") -> None:
    """The voice library, admission and the clocks, as every server takes them."""
    sp.add_argument("--voices-dir", help="the voice library's folder (voice prompts .npz, consents); "
                                         "servers may share one (default: OMNICORE_VOICES_DIR, "
                                         "else $XDG_DATA_HOME/omnicore/voices, else "
                                         "~/.local/share/omnicore/voices)")
    sp.add_argument("--require-consent", action=argparse.BooleanOptionalAction,
                    help="set the voices folder to require the id of the speaker's consent "
                         "recording for a cloned voice, for every server on it; "
                         "--no-require-consent lifts it (default: the folder's setting)")
    sp.add_argument("--max-queue", type=int, default=16,
                    help=f"{what} in flight before the server refuses more (default: %(default)s)")
    sp.add_argument("--max-concurrency", type=int,
                    help=f"{what} synthesising at once, the others wait (default: all admitted; "
                         "the engine batches them)")
    sp.add_argument("--send-timeout", type=float, default=30.0, metavar="SECONDS",
                    help="cut a client that stops reading for this long, freeing its slot "
                         "(default: %(default)g)")
    sp.add_argument("--idle-timeout", type=float, default=30.0, metavar="SECONDS",
                    help="close a connection that sends nothing for this long: no request, a "
                         "stalled body, a silent socket (default: %(default)g)")
    sp.add_argument("--grace", type=float, default=30.0, metavar="SECONDS",
                    help=f"on SIGTERM, let {what} in flight finish for this long before "
                         "stopping them (default: %(default)g)")


def add_parser(sub) -> None:
    sv = sub.add_parser("serve", help="an OpenAI-compatible speech server (pip install 'omnicore[server]')",
                        description="Serve POST /v1/audio/speech (OpenAI's API), a voice library "
                                    "(also as OpenAI's voices and voice consents), /v1/models, "
                                    "/health and /metrics (and with --ui the demo at /ui) from "
                                    "one model.")
    common.add_model_options(sv)
    sv.add_argument("--profile", choices=PROFILES, default=DOOR_PROFILE,
                    help=DOOR_PROFILE_HELP + "A request's `profile` field chooses its own. "
                         + PROFILE_TRADE_OFF)
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    sv.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    add_server_options(sv, "speech requests")
    sv.add_argument("--body-timeout", type=float, default=120.0, metavar="SECONDS",
                    help="a request body not all in within this long is a 408, however "
                         "steadily it trickles (default: %(default)g)")
    sv.add_argument("--api-key", default=os.environ.get("OMNICORE_API_KEY"),
                    help="require 'Authorization: Bearer KEY' (env OMNICORE_API_KEY)")
    sv.add_argument("--metrics-public", action="store_true",
                    help="serve /metrics without the API key (/health is always open)")
    sv.add_argument("--voice-alias", action="append", default=[], metavar="NAME=VOICE",
                    help="let the voice name NAME speak as the library voice VOICE, for clients "
                         "that only allow OpenAI's names (e.g. alloy=my_voice; repeatable)")
    sv.add_argument("--ui", action="store_true",
                    help="also serve the Gradio demo at /ui, on the same model (needs a source "
                         "checkout and the demo extra)")
    rg = sv.add_argument_group("on a Ray cluster (the ray extra; docs/cluster.md, Online)")
    rg.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                    help="serve the same API as a Ray Serve application, each replica with its "
                         "own model and engine, requests for a voice sent to replicas holding "
                         "it: no ADDRESS starts a local Ray, 'auto' joins this node's cluster, "
                         "ray://HOST:10001 one through Ray Client")
    rg.add_argument("--replicas", type=int, default=1, help="replicas (default: %(default)s)")
    rg.add_argument("--autoscale", metavar="MIN:MAX",
                    help="scale between MIN and MAX replicas on their requests in flight "
                         "(instead of --replicas)")
    rg.add_argument("--cpus-per-replica", type=float, default=1.0, metavar="K",
                    help="CPUs each replica reserves, and its BLAS/Numba threads (default: "
                         "%(default)g)")
    rg.add_argument("--gpus-per-replica", type=float, default=0.0, metavar="G",
                    help="GPUs each replica reserves (with CuPy: the cupy backend; default: "
                         "%(default)g)")
    sv.set_defaults(func=cmd_serve, compile_notice=False)  # the server logs it

    wy = sub.add_parser("wyoming", help="a Wyoming TTS server, for Home Assistant (pip install "
                                        "'omnicore[wyoming]')",
                        description="Speak the Wyoming protocol (describe, synthesize, and text "
                                    "streamed in with synthesize-start/chunk/stop), as Home "
                                    "Assistant's voice pipelines use it, from one model: the "
                                    "voices are the presets and the voice library.")
    common.add_model_options(wy)
    wy.add_argument("--uri", default="tcp://127.0.0.1:10200",
                    help="where to listen: tcp://HOST:PORT or unix://PATH (default: %(default)s; "
                         "tcp://0.0.0.0:10200 for Home Assistant on another machine)")
    wy.add_argument("--voice", default="alloy",
                    help="the voice of a text that names none: a preset or a library voice, or "
                         "'' for the model's auto voice (default: %(default)s)")
    wy.add_argument("--all-languages", action="store_true",
                    help="list each voice under all 646 language ids (default: the 125 ISO "
                         "639-1 codes, which keep Home Assistant's language picker usable)")
    add_server_options(wy, "texts")
    add_generation_options(wy, texts=False, profile=(DOOR_PROFILE, DOOR_PROFILE_HELP))
    wy.set_defaults(func=cmd_wyoming, compile_notice=False)  # the server logs it

    mc = sub.add_parser("mcp", help="an MCP server, for LLM agents (pip install 'omnicore[mcp]')",
                        description="Serve the tools speak, list_voices, design_voice, "
                                    "clone_voice, delete_voice and list_languages over MCP "
                                    "(stdio, or streamable HTTP with --http), from one model and "
                                    "the voice library.")
    common.add_model_options(mc)
    mc.add_argument("--output-dir", help="the folder speak writes into (its `path`, and audio "
                                         "too big to send inline), and nothing outside it "
                                         "(default: no files are written)")
    mc.add_argument("--http", action="store_true",
                    help="streamable HTTP at http://HOST:PORT/mcp instead of stdio")
    mc.add_argument("--host", default="127.0.0.1", help="address to bind with --http "
                                                        "(default: %(default)s)")
    mc.add_argument("--port", type=int, default=8001, help="port with --http (default: %(default)s)")
    mc.add_argument("--api-key", default=os.environ.get("OMNICORE_API_KEY"),
                    help="with --http, require 'Authorization: Bearer KEY' (env OMNICORE_API_KEY)")
    add_server_options(mc, "tool calls")
    add_generation_options(mc, texts=False, profile=(DOOR_PROFILE, DOOR_PROFILE_HELP))
    mc.set_defaults(func=cmd_mcp, compile_notice=False)  # the server logs it
