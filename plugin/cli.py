"""``vllm-duplex``: serve | edge | talk | prepare.

The top of the layering: it starts a server process (``realtime.server``), a
fleet of them (``fleet``), an edge router, the ``talk`` client, or the model
preparation; nothing imports it.

    vllm-duplex prepare [--force] [--name NAME ...]
    vllm-duplex serve [--config configs/<name>.yaml] [--host H] [--port P] [--grpc-port G] [--workers N]
                      [--allow-unauthenticated]
    vllm-duplex edge --machine m1=HOST:PORT --machine m2=HOST:PORT [--listen H:P] [--adopt]
    vllm-duplex talk --audio in.flac --out reply.mp3 [--url ws://127.0.0.1:8000/v1/realtime]
"""

from __future__ import annotations

import argparse
import logging
import sys


def _serve(args: argparse.Namespace) -> int:
    from vllm_duplex.host.deploy import load_config, resolve_config_path

    config = load_config(args.config)
    workers = config.workers if args.workers is None else config.workers.with_count(args.workers)
    host = args.host or config.host
    port = args.port if args.port is not None else config.port
    grpc_port = args.grpc_port if args.grpc_port is not None else config.grpc_port
    if args.worker_life is None:  # not a worker its supervisor started on loopback
        from vllm_duplex.host.exposure import REFUSED_EXIT, keys_line, refusal

        why = refusal(host, config.api_keys, args.allow_unauthenticated)
        if why is not None:
            print(f"vllm-duplex: {why}", file=sys.stderr, flush=True)
            return REFUSED_EXIT
        print(f"vllm-duplex: {keys_line(host, config.api_keys)}", flush=True)
    if workers.count > 1:
        if grpc_port is not None:
            print("vllm-duplex: --grpc-port is served by a single server (not with --workers)",
                  file=sys.stderr)
            return 2
        from vllm_duplex.fleet.supervisor import serve_workers

        return serve_workers(config, resolve_config_path(args.config), workers, host=host,
                             port=port, log_level=args.log_level)
    return _serve_one(args, config, workers, host, port, grpc_port)


def _serve_one(args: argparse.Namespace, config, workers, host: str, port: int,
               grpc_port: int | None = None) -> int:
    """One server process: a plain ``serve``, or one worker of ``serve --workers N``."""
    import uvicorn
    from vllm_duplex.assets.files import AssetError
    from vllm_duplex.fleet.engine_core import WorkerSlot
    from vllm_duplex.fleet.worker import worker_runtime
    from vllm_duplex.realtime.server.serving import uvicorn_config

    instance_id = args.instance_id or (workers.instance_ids()[0] if workers.configured else None)
    slot = WorkerSlot.from_json(args.engine_slot) if args.engine_slot else None
    supervised = args.worker_life is not None
    try:
        runtime, close = worker_runtime(config, instance_id=instance_id, slot=slot,
                                       life=args.worker_life or 1)
    except AssetError as e:  # a missing or corrupt model: refuse, never fall back
        print(f"vllm-duplex: cannot serve {config.name!r}: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        if not supervised:
            print(f"vllm-duplex: serving {config.name!r} (model {config.model!r}, policy "
                  f"{config.policy!r}) on ws://{host}:{port}/v1/realtime"
                  + (f" and gRPC {host}:{grpc_port}" if grpc_port is not None else ""), flush=True)
            print(f"vllm-duplex: machine: {runtime.machine_line()}", flush=True)
        uvicorn.Server(uvicorn_config(runtime, host, port, args.log_level, grpc_port)).run()
    finally:
        close()
    return 0


def _edge(args: argparse.Namespace) -> int:
    import asyncio

    from vllm_duplex.fleet.nginx import Nginx
    from vllm_duplex.fleet.router import RouterPlan, nginx_conf

    machines = dict(m.split("=", 1) for m in args.machine)
    plan = RouterPlan.for_edge(args.listen, machines, max_request_bytes=args.max_request_bytes,
                               adopt=args.adopt)
    if args.print_config:
        from pathlib import Path

        print(nginx_conf(plan, Path("/var/run/vllm-duplex-edge")), end="")
        return 0

    async def run() -> int:
        import signal

        nginx = Nginx(plan)
        await nginx.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(f"vllm-duplex edge: http://{args.listen} -> " + ", ".join(
            f"{m}={a}" for m, a in machines.items())
            + (" (a machine down: the others adopt)" if args.adopt else ""), flush=True)
        try:
            waiter = asyncio.create_task(nginx.wait())
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            stopper.cancel()
            return 0 if stop.is_set() else 1
        finally:
            await nginx.stop()

    return asyncio.run(run())


def _talk(args: argparse.Namespace) -> int:
    from vllm_duplex.realtime.client.talk import run_talk

    return run_talk(args)


def _prepare(args: argparse.Namespace) -> int:
    from vllm_duplex.assets.catalog import DEFAULT_ASSETS, LLM_DEFAULT
    from vllm_duplex.assets.files import AssetError
    from vllm_duplex.assets.prepare import prepare_many

    names = args.name or list(DEFAULT_ASSETS)
    try:
        prepared = prepare_many(names, force=args.force)
    except (AssetError, KeyError) as e:
        print(f"vllm-duplex prepare: {e.args[0] if isinstance(e, KeyError) else e}",
              file=sys.stderr, flush=True)
        return 2
    for name, path in prepared.items():
        print(f"{name}: {path}", file=sys.stderr)
    # stdout: the directory `vllm serve` takes (the LLM's), or each one asked for.
    shown = [LLM_DEFAULT] if not args.name else names
    for name in shown:
        print(prepared[name], flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-duplex", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve a deployment config over HTTP/WebSocket")
    serve.add_argument("--config", default=None,
                       help="a YAML path or a name in configs/ (default: cascade-cpu)")
    serve.add_argument("--host", default=None)
    serve.add_argument("--allow-unauthenticated", action="store_true",
                       help="serve beyond loopback with no API keys, open to anyone who can "
                            "reach it (without it such a server is refused)")
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("--log-level", default="warning")
    serve.add_argument("--grpc-port", type=int, default=None,
                       help="also serve the OpenEngine gRPC services on this port "
                            "(default: server.grpc_port of the config; unset: off)")
    serve.add_argument("--workers", type=int, default=None,
                       help="worker processes behind nginx, on one vLLM engine core "
                            "(default: the config's `workers`, else 1: one process)")
    serve.add_argument("--instance-id", default=None,
                       help="this server's owner id (w1, m2w3): the suffix of the ids it mints")
    # Set by the supervisor of `serve --workers N` for each worker it starts.
    serve.add_argument("--engine-slot", default=None, help=argparse.SUPPRESS)
    serve.add_argument("--worker-life", type=int, default=None, help=argparse.SUPPRESS)
    serve.set_defaults(func=_serve)

    edge = sub.add_parser(
        "edge", help="run an nginx edge router in front of several machines' `serve --workers`",
        description="Routes owner ids <machine>w<n> to that machine's router and new sessions to "
                    "the machine with the fewest connections (docs/deploy.md).")
    edge.add_argument("--listen", default="127.0.0.1:9000", help="host:port to listen on")
    edge.add_argument("--machine", action="append", required=True, metavar="NAME=HOST:PORT",
                      help="a machine (m1) and its router's address; repeat per machine")
    edge.add_argument("--max-request-bytes", type=int, default=1 << 20)
    edge.add_argument("--adopt", action="store_true",
                      help="the machines share one durable store (durability.url): a request "
                           "whose machine does not answer (connection refused) goes to the "
                           "others' routers, whose workers take the session over")
    edge.add_argument("--print-config", action="store_true",
                      help="print the nginx config instead of running it")
    edge.set_defaults(func=_edge)

    talk = sub.add_parser("talk", help="stream an audio file to a server and save the spoken reply")
    talk.add_argument("--audio", required=True,
                      help="input: any file soundfile reads (WAV, FLAC, OGG/Opus, MP3...), any rate "
                           "and channel count")
    talk.add_argument("--out", required=True,
                      help="where to write the reply; its extension names the format "
                           "(.wav .flac .ogg .opus .mp3 ...)")
    talk.add_argument("--out-rate", type=int, default=None, help="resample the reply (default: as sent)")
    talk.add_argument("--out-channels", type=int, default=1, help="channels of the reply file")
    talk.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime")
    talk.add_argument("--model", default=None, help="model to ask for (default: the served one)")
    talk.add_argument("--api-key", default=None)
    talk.add_argument("--chunk-ms", type=int, default=20)
    talk.add_argument("--no-realtime", action="store_true",
                      help="send chunks as fast as possible instead of at real-time pace")
    talk.add_argument("--timeout", type=float, default=60.0)
    talk.set_defaults(func=_talk)

    prepare = sub.add_parser(
        "prepare", help="verify and assemble the packaged models in the local cache",
        description="Checks every weight file the default pipeline needs (the SmolLM2 GGUF, "
                    "Whisper base and tiny.en, the Piper voice) against the sha256 pins "
                    "recorded in the repository, joins split files, converts the GGUF into a "
                    "Hugging Face directory, all under $VLLM_DUPLEX_CACHE/models/<name> "
                    "(default ~/.cache/vllm-duplex/...). Does nothing for what is prepared "
                    "already. A missing or corrupt file fails with its path and the package "
                    "to reinstall. Prints the LLM directory (what `vllm serve` takes), or "
                    "the directory of each --name.")
    prepare.add_argument("--name", action="append", default=None,
                         help="a pinned model (repeatable; default: the default pipeline's)")
    prepare.add_argument("--force", action="store_true", help="verify and build again")
    prepare.set_defaults(func=_prepare)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, getattr(args, "log_level", "warning").upper(),
                                      logging.WARNING))
    return args.func(args)


if __name__ == "__main__":  # vLLM spawns processes: keep the entry point guarded
    sys.exit(main())
