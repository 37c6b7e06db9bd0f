"""``vllm-duplex``: serve | talk | prepare.

    vllm-duplex prepare [--force] [--name NAME ...]
    vllm-duplex serve [--config configs/<name>.yaml] [--host H] [--port P]
    vllm-duplex talk --audio in.wav --out reply.wav [--url ws://127.0.0.1:8000/v1/realtime]
"""

from __future__ import annotations

import argparse
import logging
import sys


def _serve(args: argparse.Namespace) -> int:
    import uvicorn
    from vllm_duplex.assets.files import AssetError
    from vllm_duplex.host.deploy import load_config
    from vllm_duplex.host.runtime import Runtime
    from vllm_duplex.realtime.server.serving import uvicorn_config

    config = load_config(args.config)
    try:
        engine = Runtime(config)
    except AssetError as e:  # a missing or corrupt model: refuse, never fall back
        print(f"vllm-duplex: cannot serve {config.name!r}: {e}", file=sys.stderr, flush=True)
        return 2
    host = args.host or config.host
    port = args.port if args.port is not None else config.port
    print(f"vllm-duplex: serving {config.name!r} (model {config.model!r}, policy "
          f"{config.policy!r}) on ws://{host}:{port}/v1/realtime", flush=True)
    uvicorn.Server(uvicorn_config(engine, host, port, args.log_level)).run()
    return 0


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
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("--log-level", default="warning")
    serve.set_defaults(func=_serve)

    talk = sub.add_parser("talk", help="stream a WAV to a server and save the spoken reply")
    talk.add_argument("--audio", required=True, help="input WAV (mono or stereo PCM16, any rate)")
    talk.add_argument("--out", required=True, help="where to write the reply WAV")
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
