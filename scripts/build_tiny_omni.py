#!/usr/bin/env python
"""Build the tiny random-weight omni models (no network) into the model
cache and print their directories, one a line:

    .venv/bin/python scripts/build_tiny_omni.py                     # tiny-minicpmo-4.5
    .venv/bin/python scripts/build_tiny_omni.py tiny-qwen2.5-omni --force

configs/omni-tiny-cpu.yaml serves tiny-minicpmo-4.5 from
~/.cache/vllm-duplex/models/ (``$VLLM_DUPLEX_CACHE/models/`` when set).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from vllm_duplex.testing.tiny_omni import NAMES, build

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", default=["tiny-minicpmo-4.5"], choices=NAMES, metavar="NAME",
                        help=f"one of {', '.join(NAMES)} (default: tiny-minicpmo-4.5)")
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args(argv)
    for name in args.names:
        print(build(name, force=args.force), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
