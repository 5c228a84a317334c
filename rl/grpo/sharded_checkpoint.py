"""A GRPO run's training state in a checkpoint, sharded: torch.distributed.checkpoint (DCP) under `distributed/`.

Each rank writes only its own shards of the weights and of AdamW's moments, so no rank ever holds the whole
training state (a model too large for one rank's memory still checkpoints). DCP records every tensor's
global shape and each shard's place in it, and a load reads whichever pieces the loading ranks hold: a run
written on 8 ranks resumes on 4, on 1, or on 8, and a one-rank run's checkpoint resumes on 2.

Every rank calls these functions together (they are collectives when sharded), with the same directory: the
ranks run on one machine, so they share its file system. The directory is the checkpoint's temporary one
(`rl/checkpoint.write_checkpoint`): DCP's save returns on rank 0 only after every rank has reported its
files written, and only then is the directory flushed and renamed, so a crash never leaves a torn checkpoint.

The model files beside it (`model.safetensors`, gathered whole on rank 0) are what the engine and
`rstar serve --model` load; a resume reads the weights from here instead.
"""

from __future__ import annotations

from pathlib import Path

from rstar.rl.checkpoint import CheckpointError

SHARDED_DIR = "distributed"


def _trained_options():
    """Frozen weights (a LoRA run's base) are not training state: left out, and not expected back on load (DCP's
    load has already checked that every trained tensor came back)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=False)


def has_sharded_state(checkpoint: Path) -> bool:
    """False for checkpoints written before sharded checkpoints (`optimizer.pt`, AdamW's state gathered whole)."""
    return (checkpoint / SHARDED_DIR / ".metadata").is_file()


def _state(trainer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model = trainer.policy.causal_lm
    # get_optimizer_state_dict gives a fresh optimizer its (zero) moments first, so a load has tensors to fill.
    weights = get_model_state_dict(model, options=_trained_options())
    # DCP's ignore_frozen_params keeps a tied head whose embedding is frozen (LoRA's lm_head): left out here.
    weights = {name: tensor for name, tensor in weights.items() if model.get_parameter(name).requires_grad}
    return {"model": weights, "optimizer": get_optimizer_state_dict(model, trainer.optimizer, options=_trained_options())}


def save_sharded_state(trainer, directory: Path) -> None:
    """This rank's shards of the weights and AdamW's moments, and the schedule, into `directory/distributed`."""
    import torch.distributed.checkpoint as dcp

    dcp.save({**_state(trainer), "scheduler": trainer.scheduler.state_dict()}, checkpoint_id=Path(directory) / SHARDED_DIR)


def load_sharded_state(trainer, checkpoint: Path) -> None:
    """Weights, AdamW's moments and the schedule from a checkpoint written on any number of ranks."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    state = {**_state(trainer), "scheduler": trainer.scheduler.state_dict()}
    try:
        dcp.load(state, checkpoint_id=Path(checkpoint) / SHARDED_DIR)
    except Exception as exc:  # DCP wraps a rank's failure (a missing key, a shape that differs) in CheckpointException
        raise CheckpointError(f"{checkpoint}: its sharded state does not load into this model ({str(exc).splitlines()[0][:300]}); "
                              f"start a new run id, or resume with the model the run began with") from exc
    model = trainer.policy.causal_lm
    set_model_state_dict(model, state["model"], options=_trained_options())
    set_optimizer_state_dict(model, trainer.optimizer, state["optimizer"], options=_trained_options())
    trainer.scheduler.load_state_dict(state["scheduler"])
