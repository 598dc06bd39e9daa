# Sourced by the compare scripts: the venv they share (bench/compare/.venv),
# made on first use. System packages stay visible: where PyTorch's CPU wheel
# index cannot be reached and PyPI's torch does not install either, Debian's
# python3-torch is the fallback (the tables name the torch version that ran).
#   compare_venv            torch 2.x (PyTorch's CPU index, else PyPI's CUDA
#                           wheel: about 5 GB with its libraries)
#   compare_venv_hf         and transformers 5 with PEFT 0.x (whole steps)
#   compare_run LOG NAME CMD...
#                           runs CMD: the last line it prints (its JSON) into
#                           LOG/NAME.json, its stderr into LOG/NAME.err, or
#                           {"error": its first "error" line (else its last
#                           line)} when it fails
compare_venv() {
  local here
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  venv="$here/.venv"
  py="$venv/bin/python"
  if [ ! -x "$py" ]; then
    python3 -m venv --system-site-packages "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip || true
  fi
  if ! "$py" -c 'import torch, sys; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null; then
    "$venv/bin/pip" install --quiet --index-url "${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" \
      'torch>=2,<3' 2>/dev/null ||
      { echo "PyTorch's CPU index unreachable; installing PyPI's torch 2.x (with its CUDA" \
          "libraries, about 5 GB)" >&2
        "$venv/bin/pip" install --quiet 'torch>=2,<3'; } ||
      echo "torch 2.x did not install; using the system torch if there is one" >&2
  fi
}
compare_venv_hf() {
  compare_venv
  "$py" -c 'import transformers, peft, numpy' 2>/dev/null ||
    "$venv/bin/pip" install --quiet 'transformers>=5,<6' 'peft>=0.17,<1' numpy safetensors
}
compare_run() {
  local log=$1 name=$2
  shift 2
  echo "== $name" >&2
  "$@" 2>"$log/$name.err" | tail -n 1 >"$log/$name.json" ||
    echo "{\"error\": \"$({ grep -m 1 'error' "$log/$name.err" || tail -n 1 "$log/$name.err"; } |
      tr '"\\' "''")\"}" >"$log/$name.json"
}
