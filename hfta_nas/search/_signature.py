"""Shape signatures: which candidates can share one array.

Two candidates fuse when one forward serves both and every tensor has the same
shape: same model (family or factory) and config, the same parameter and
buffer shapes, and the same settings that the array shares (dataset and batch
size, epochs, optimizer class and its on/off flags). Learning rates, weight
decay, schedules and seeds stay per slot. The model is built on the meta
device, so a signature costs no memory and no random numbers (a factory that
reads tensor values is built on the CPU instead, its random numbers restored).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hfta_nas.optim import OPTIMIZERS


def shape_signature(config: Any, factory: Callable[[], nn.Module]) -> str:
    """A short stable hash of everything that must be equal inside one array."""
    try:
        with torch.device("meta"), torch.random.fork_rng(devices=[]):
            model = factory()
    except Exception:  # a user factory that reads tensor values (`.item()`, `int(t)`) cannot run on meta
        with torch.random.fork_rng(devices=[]):
            model = factory()
    optimizer = OPTIMIZERS[config.optimizer]
    flags = {name: bool(config.hparams.get(name, default)) for name, default in optimizer.flags.items()}
    described = {
        "model": str(config.model),
        "model_config": config.model_config,
        "tensors": [(n, list(t.shape), str(t.dtype)) for n, t in [*model.named_parameters(), *model.named_buffers()]],
        "structure": repr(model),
        "data": {"dataset": str(config.dataset), **config.data},
        "epochs": config.epochs,
        "optimizer": config.optimizer,
        "flags": flags,
    }
    text = json.dumps(described, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]
