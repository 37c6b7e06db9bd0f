#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a virtualenv at .venv with the package
# installed editable (plus test extras). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
