#!/usr/bin/env bash
# The virtual environment the Python tests run in (`make test`): Debian's
# python3 with python/requirements-test.txt, i.e. PyTorch (PyPI's wheel, with
# its CUDA libraries: about 5 GB to download, about 5 minutes on first use),
# transformers 5, PEFT, TRL, pytest, nanobind and scikit-build-core.
# Made once per machine and reused; synced again only when the requirements
# file changes (a stamp inside the venv holds its hash).
#   scripts/python_env.sh VENV_DIR
set -euo pipefail

venv="${1:?usage: scripts/python_env.sh VENV_DIR}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
reqs="$repo/python/requirements-test.txt"
stamp="$venv/.tiermoe-requirements"
want="$(sha256sum "$reqs" | cut -d' ' -f1)"

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "python_env: creating $venv (torch, transformers, PEFT, TRL: about 5 GB on first use)" >&2
  /usr/bin/python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -r "$reqs"
echo "$want" >"$stamp"
echo "python_env: $venv is ready" >&2
