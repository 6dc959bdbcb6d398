"""The checks of a space file's `pbt:` block, each problem located at its key.

A PBT population is one array of one architecture whose members copy each other's weights,
so a PBT space may search (for the starting population) only what a slot keeps for itself:
optimizer hyper-parameters, clipping and schedule values; and explore optimizer
hyper-parameters, clipping, the dropout rate and augmentation strengths.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hfta_nas.optim import OPTIMIZERS, optimizer_values
from hfta_nas.search import explore_bounds_problem

from ._schema import Fixed, LogUniform, Param, SpaceFile, Uniform
from ._yaml import Loc

# Searched params an array keeps per slot (the optimizer's hyper-parameters and the schedule's values).
PER_SLOT_OPTIMIZER = (
    "lr",
    "weight_decay",
    "momentum",
    "dampening",
    "betas",
    "beta1",
    "beta2",
    "eps",
    "alpha",
    "lr_decay",
    "initial_accumulator_value",
    "clip_value",
    "clip_norm",
)


CLIPPING = ("training.clip_norm", "training.clip_value")  # per-slot gradient clipping (an optimizer hparam)


def per_slot(path: str) -> bool:
    """Whether a searched param is one an array keeps per slot (else it fixes the array's architecture)."""
    return (
        path.startswith("training.schedule.")
        or path in CLIPPING
        or path in {f"training.optimizer.{k}" for k in PER_SLOT_OPTIMIZER}
    )


def explorable(file: SpaceFile) -> dict[str, str]:
    """The keys a pbt block may explore -> the name `hfta_nas.pbt` takes: the optimizer's per-slot
    hyper-parameters, the model's dropout rate and the augmentations' strengths."""
    cls = OPTIMIZERS.get(file.training.optimizer.name)
    keys = {f"training.optimizer.{n}": n for n in (optimizer_values(cls) if cls else ())}
    keys.update({path: path.rpartition(".")[2] for path in CLIPPING})
    keys["model.config.dropout"] = "dropout"
    keys.update({f"training.augment.{n}": f"augment.{n}" for n in ("noise", "mixup", "cutmix")})
    return keys


def _starting_value(file: SpaceFile, params: dict[str, Param], key: str) -> Any:
    """The value a key starts from in every member: a fixed param's, else the section's."""
    if isinstance(params.get(key), Fixed):
        return params[key].value
    if key == "model.config.dropout":
        return file.model.config.get("dropout", 0)
    augment = file.training.augment
    return getattr(augment, key.rpartition(".")[2], 0) if augment is not None else 0


def check_pbt(add: Callable[[Loc, str], None], file: SpaceFile, params: dict[str, Param]) -> None:
    """Add every problem of `file`'s pbt block (nothing when it has none)."""
    spec = file.pbt
    if spec is None:
        return
    if len(file.study.metrics) > 1:
        add(("study", "metrics"), "pbt ranks members by one metric; give study.metrics a single one")
    elif spec.metric is not None and spec.metric != file.study.metrics[0]:
        add(
            ("pbt", "metric"),
            f"pbt ranks by '{spec.metric}' but study.metrics is '{file.study.metrics[0]}': each member's trial "
            "is told the value it is ranked by; give the same metric (or leave pbt.metric out)",
        )
    if file.training.early_stopping is not None:
        add(("training", "early_stopping"), "early stopping does not apply to pbt: its worst members copy the best")
    if spec.interval >= file.training.epochs:
        add(
            ("pbt", "interval"),
            f"pbt exploits after every {spec.interval} epochs but members train {file.training.epochs}: it would "
            "never exploit; give an interval below training.epochs",
        )
    for path, param in params.items():
        if not per_slot(path) and not isinstance(param, Fixed):
            add(
                ("params", path),
                "a pbt population is one architecture with shared settings; searching this gives members different "
                "ones: fix it, or drop the pbt block to search it",
            )
    keys = explorable(file)
    for key, how in spec.explore.items():
        loc: Loc = ("pbt", "explore", key)
        if key not in keys:
            add(loc, _not_explorable(key, file.training.optimizer.name, keys))
        elif _needs_a_start(key) and not _starting_value(file, params, key):
            add(loc, f"'{key}' is 0 (off) in every member; set a starting value above 0 to explore it")
        else:
            _check_bounds(add, loc, how, params.get(key), keys[key])


def _needs_a_start(key: str) -> bool:
    """Dropout and augmentations at 0 are not there at all (no layer, no augmenting) to explore."""
    return key == "model.config.dropout" or key.startswith("training.augment.")


def _not_explorable(key: str, optimizer: str, keys: dict[str, str]) -> str:
    shapes = key.startswith(("model.", "data.")) or key in ("training.batch_size", "training.epochs")
    why = (
        "changes the model's shapes or a setting the array shares, so members could not copy each other's weights"
        if shapes
        else f"is not a value a slot keeps for itself (with optimizer {optimizer})"
    )
    return f"'{key}' {why}; explore takes {', '.join(keys)}"


def _check_bounds(add: Callable[[Loc, str], None], loc: Loc, how: Any, param: Param | None, name: str) -> None:
    low, high, log = explore_bounds(how, param)
    if low is None or high is None:
        add(loc, "give min and max (or search it in params with a uniform or log_uniform distribution)")
    elif not low < high:
        add(loc, f"min must be below max, got min {low} and max {high}")
    elif log and low <= 0:
        add(loc, f"a log-scale explore needs min > 0, got {low}")
    elif problem := explore_bounds_problem(name, low, high):
        add(loc, problem)


def explore_bounds(how: Any, param: Param | None) -> tuple[float | None, float | None, bool]:
    """(min, max, log) of one explored hyper-parameter: its own, else its searched distribution's."""
    searched = param if isinstance(param, (Uniform, LogUniform)) else None
    low = how.min if how.min is not None else (searched.min if searched else None)
    high = how.max if how.max is not None else (searched.max if searched else None)
    log = how.log if how.log is not None else isinstance(searched, LogUniform)
    return low, high, log
