#!/usr/bin/env bash
# The graders `rstar eval run` needs beyond the Python dependencies, into the environment of the given
# interpreter: `bash install_graders.sh PYTHON`. install.sh runs it for every install; the Dockerfile runs it
# on the image's Python. Idempotent.
set -euo pipefail
python=${1:?usage: install_graders.sh PYTHON}

# bfcl-eval (last release with the BFCL v3 files) pins numpy==1.26.4 and provider SDKs that break vLLM's;
# the checker modules rstar.evals imports need none of them (the core dependencies bring what they do need).
"$python" -m pip install --quiet --no-deps bfcl-eval==2025.8.6.2
# IFEval's checkers need NLTK's punkt_tab, which NLTK would otherwise download at run time. The
# llama-index-core wheel (MIT) bundles NLTK's data; unpack only the English Punkt tables (plain text
# files, no pickles) into the environment's share/nltk_data (sys.prefix), one of the places NLTK searches by default.
punkt="$("$python" -c 'import sys; print(sys.prefix)')/share/nltk_data/tokenizers/punkt_tab/english"
if [ ! -f "$punkt/ortho_context.tab" ]; then
    tmp=$(mktemp -d)
    "$python" -m pip download --quiet --no-deps --dest "$tmp" llama-index-core==0.14.25
    "$python" - "$tmp"/llama_index_core-0.14.25-py3-none-any.whl "$punkt" <<'PY'
import hashlib, sys, zipfile
from pathlib import Path

wheel, target = Path(sys.argv[1]), Path(sys.argv[2])
digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
if digest != "caa7d9c5ac9b13dc33400cf8d5e92e689b6d1e4497eb9bfa50d6f52ca2eb22a1":
    sys.exit(f"install_graders.sh: unexpected llama-index-core wheel (sha256 {digest}); not unpacking punkt_tab")
prefix = "llama_index/core/_static/nltk_cache/tokenizers/punkt_tab/english/"
target.mkdir(parents=True, exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    for name in names:
        (target / name[len(prefix):]).write_bytes(z.read(name))
print(f"install_graders.sh: NLTK punkt_tab (English) unpacked into {target}")
PY
    rm -rf "$tmp"
fi
