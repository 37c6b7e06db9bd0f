"""Model files that come from installed packages: where they are cached, how
they are assembled (``prepare``) and checked.

Below the stages, which find their default weights here; ``vllm-duplex
prepare`` (the CLI) drives the same code.
"""
