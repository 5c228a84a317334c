"""A LoRA delta file: low-rank weight updates for a named base model, merged into it at pull time.

The embedded default model ships as the verified SmolLM2 base plus such a delta (a few MB in the
repository, made by `rstar rl sft`): `rstar model pull` merges W + scale * B @ A for every adapted
projection and saves the result. The file is safetensors: `<module>.lora_A` [rank, in] and
`<module>.lora_B` [out, rank] per adapted Linear, and metadata with each module's scale and the sha256 of
the base weights it was trained on, so a delta is never merged onto a base it does not belong to.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

FORMAT = "rstar-lora-delta-1"
BASE_WEIGHTS = "model.safetensors"


class DeltaMismatch(ValueError):
    """The delta does not fit the base model: another base, or shapes that do not match."""


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_delta(path: Path, adapters: dict, base_dir: Path, provenance: dict) -> None:
    """adapters: module name -> (A [rank, in], B [out, rank], scale). Stored in fp16."""
    import torch
    from safetensors.torch import save_file

    tensors, scales = {}, {}
    for name, (a, b, scale) in adapters.items():
        tensors[f"{name}.lora_A"] = a.to(torch.float16).contiguous()
        tensors[f"{name}.lora_B"] = b.to(torch.float16).contiguous()
        scales[name] = scale
    metadata = {"format": FORMAT, "base_sha256": _sha256(Path(base_dir) / BASE_WEIGHTS), "scales": json.dumps(scales), "provenance": json.dumps(provenance)}
    save_file(tensors, str(path), metadata=metadata)


def read_metadata(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        return handle.metadata() or {}


def merge_delta(base_dir: Path, delta_path: Path, out_dir: Path) -> None:
    """Write base + delta as fp32 safetensors into out_dir (config and tokenizer files are the caller's).

    fp32 keeps the small low-rank updates exact; the engine casts to its own dtype when it loads.
    """
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    metadata = read_metadata(delta_path)
    if metadata.get("format") != FORMAT:
        raise DeltaMismatch(f"{delta_path} is not a LoRA delta file ({FORMAT})")
    base_sha = _sha256(Path(base_dir) / BASE_WEIGHTS)
    if base_sha != metadata.get("base_sha256"):
        raise DeltaMismatch(f"{delta_path} was trained on base weights with sha256 {metadata.get('base_sha256')}, but {base_dir} has {base_sha}")
    scales = json.loads(metadata["scales"])
    weights = {name: tensor.to(torch.float32) for name, tensor in load_file(str(Path(base_dir) / BASE_WEIGHTS)).items()}
    with safe_open(str(delta_path), "pt") as delta:
        for module, scale in scales.items():
            a, b = delta.get_tensor(f"{module}.lora_A").float(), delta.get_tensor(f"{module}.lora_B").float()
            name = f"{module}.weight"
            if name not in weights:
                raise DeltaMismatch(f"{delta_path} adapts {module}, which the base model does not have")
            if (b.shape[0], a.shape[1]) != tuple(weights[name].shape) or a.shape[0] != b.shape[1]:
                raise DeltaMismatch(f"{delta_path}: {module} delta is {b.shape[0]}x{a.shape[1]} (rank {a.shape[0]}), the base weight is {tuple(weights[name].shape)}")
            weights[name] += scale * (b @ a)
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out_dir / BASE_WEIGHTS), metadata={"format": "pt"})
