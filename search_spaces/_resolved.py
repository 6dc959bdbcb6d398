"""One candidate, fully specified: what `hfta_nas.train` needs, and its config file.

A `ResolvedConfig` is what a search space becomes once every searched
parameter has a value (`SearchSpace.resolve`), and what `hfta-nas stability`
reads back (`ResolvedConfig.from_file`). Defaults are written out (the
family's config keys, the optimizer's hyper-parameters and flags, the
schedule's arguments), so a saved config reproduces the run even if a
default changes later.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hfta_nas import LOSSES, EarlyStopping, Objective, loss_kind
from hfta_nas.data import Augmentation
from hfta_nas.models import FAMILIES, family_defaults, load_factory
from hfta_nas.optim import OPTIMIZERS, LRSchedule, hparam_schedule_problems

from ._checks import validate
from ._errors import Problem, SpaceError
from ._overrides import OverriddenWhere, apply_overrides, parse_overrides
from ._schema import SpaceFile, short, unknown_key_message
from ._yaml import Loc, Where, dump_yaml, parse_yaml

FILE_KEYS = (
    "model",
    "model_config",
    "dataset",
    "data",
    "optimizer",
    "hparams",
    "schedule",
    "epochs",
    "accumulate",
    "early_stopping",
    "loss",
    "metrics",
    "augment",
    "precision",
    "hparam_schedule",
    "origin",
)
DATA_KEYS = ("batch_size", "val_fraction", "test_fraction", "split_seed", "num_samples")
_SCHEDULE_DEFAULTS = {
    name: p.default for name, p in inspect.signature(LRSchedule.__init__).parameters.items() if p.kind is p.KEYWORD_ONLY
}


@dataclass(frozen=True)
class ResolvedConfig:
    """Everything one candidate needs; the arguments of `hfta_nas.train` (plus the data split).

    - model: a built-in family name or a user factory 'module:function' / 'file.py:function'
    - model_config: the family's full config (defaults filled in) or the factory's keyword arguments
    - dataset: a built-in dataset, a .npz/.csv path or 'module:function' (for `hfta_nas.data.load_dataset`)
    - data: batch_size, val_fraction, test_fraction, split_seed, num_samples
    - optimizer: a name in `hfta_nas.optim.OPTIMIZERS`
    - hparams: every hyper-parameter and flag of that optimizer (betas split into beta1 / beta2)
    - schedule: None, or `kind` plus every LRSchedule argument (cosine's t_max defaults to epochs)
    - epochs: training epochs
    - accumulate: micro-batches per optimizer step (1: none)
    - early_stopping: None, or EarlyStopping's arguments (metric, patience, min_delta, mode)
    - per-slot gradient clipping is in hparams (clip_norm, clip_value), where set
    - loss: None (cross-entropy), or the loss's name and options (see `hfta_nas.Objective`)
    - metrics: user metrics, name -> 'module:function'
    - augment: None, or `hfta_nas.data.Augmentation`'s arguments (shift, flip, noise, mixup, cutmix)
    - precision: float32, bf16 or fp16 (autocast; fp16 with per-slot loss scaling)
    - hparam_schedule: None, or per-slot hyper-parameter name -> one value per epoch, set before
      each epoch (lr: the base lr the schedule scales); a PBT member's `pbt_schedule` replayed
    - origin: where the config came from (study, trial, values, seeds, ...); informational,
      not compared by `==`
    """

    model: str
    model_config: dict[str, Any]
    dataset: str
    data: dict[str, Any]
    optimizer: str
    hparams: dict[str, Any]
    schedule: dict[str, Any] | None
    epochs: int
    accumulate: int = 1
    early_stopping: dict[str, Any] | None = None
    loss: dict[str, Any] | None = None
    metrics: dict[str, str] = field(default_factory=dict)
    augment: dict[str, Any] | None = None
    precision: str = "float32"
    hparam_schedule: dict[str, list[float]] | None = None
    origin: dict[str, Any] = field(default_factory=dict, compare=False)

    # ------------------------------------------------------------ for the engine
    def train_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `hfta_nas.train` except `dataset` and `seeds`.

        Load the data with `load_dataset(cfg.dataset, **cfg.dataset_kwargs())` and
        pass the `Dataset` (train's own `dataset=` string would ignore the split).
        """
        return {
            "model": self.model,
            "model_config": copy.deepcopy(self.model_config),
            "optimizer": self.optimizer,
            "hparams": dict(self.hparams),
            "schedule": dict(self.schedule) if self.schedule is not None else None,
            "epochs": self.epochs,
            "batch_size": self.data["batch_size"],
            "accumulate": self.accumulate,
            "early_stopping": EarlyStopping(**self.early_stopping) if self.early_stopping is not None else None,
            "loss": self.objective(),
            "augmentation": Augmentation(**self.augment) if self.augment else None,
            "precision": self.precision,
            "hparam_schedule": copy.deepcopy(self.hparam_schedule),
        }

    @property
    def kind(self) -> str:
        """classification or regression: what the loss trains (read from its name; nothing imported)."""
        return loss_kind(self.loss["name"], self.loss.get("task")) if self.loss else "classification"

    def objective(self) -> Objective:
        """The loss and metrics as the engine takes them (user functions imported)."""
        spec = dict(self.loss or {})
        name = spec.pop("name", "cross_entropy")
        metrics = {metric: load_factory(path) for metric, path in self.metrics.items()}
        return Objective(loss=name if name in LOSSES else load_factory(name), metrics=metrics, **spec)

    def dataset_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `hfta_nas.data.load_dataset` after `source`."""
        kwargs = {k: self.data[k] for k in ("val_fraction", "test_fraction", "split_seed", "num_samples")}
        if self.kind == "regression":  # written only then: a classification config reads as before
            kwargs["task"] = "regression"
        return kwargs

    def optimizer_flags(self) -> dict[str, bool]:
        """The optimizer's options shared by the whole array (nesterov, amsgrad, ...)."""
        return {k: v for k, v in self.hparams.items() if k in OPTIMIZERS[self.optimizer].flags}

    def slot_hparams(self) -> dict[str, float]:
        """The hyper-parameters an array keeps per slot (lr, weight_decay, betas, ...)."""
        return {k: v for k, v in self.hparams.items() if k not in OPTIMIZERS[self.optimizer].flags}

    def shared_key(self) -> tuple:
        """Candidates can share one array only when these are equal (and their models fuse).

        The array has one dataset split, one batch size, one epoch count, one
        optimizer class with one set of flags; lr, weight decay, schedule
        arguments and model seeds may differ per slot.
        """
        return (
            self.dataset,
            tuple(sorted(self.data.items())),
            self.epochs,
            self.optimizer,
            tuple(sorted(self.optimizer_flags().items())),
            self.schedule is not None,
            self.accumulate,
            repr(self.early_stopping),
            repr(self.loss),
            repr(sorted(self.metrics.items())),
            repr(self.augment),
            self.precision,
        )

    # --------------------------------------------------------------- as a file
    def to_dict(self) -> dict[str, Any]:
        data = copy.deepcopy(asdict(self))
        if not data["origin"]:
            del data["origin"]
        # written only where set: a config without them reads (and hashes) as before they existed
        if data["accumulate"] == 1:
            del data["accumulate"]
        for key in ("early_stopping", "loss", "metrics", "augment", "hparam_schedule"):
            if not data[key]:
                del data[key]
        if data["precision"] == "float32":
            del data["precision"]
        return data

    def to_yaml(self, header: str | None = None, **origin: Any) -> str:
        """The config as YAML that `from_yaml` / `from_file` read back to an equal config.

        `header` becomes comment lines on top; keyword arguments (e.g. `study=`,
        `trial=`, `values=`, `seeds=`) are added to the `origin` mapping, which
        is written last and read back as `origin`.
        """
        data = self.to_dict()
        merged = {**self.origin, **origin}
        data.pop("origin", None)
        if merged:
            data["origin"] = merged
        text = dump_yaml(_plain(data))
        if header:
            text = "".join(f"# {line}\n" for line in header.splitlines()) + text
        return text

    def save(self, path: str | Path, header: str | None = None, **origin: Any) -> Path:
        path = Path(path)
        path.write_text(self.to_yaml(header, **origin), encoding="utf-8")
        return path

    @classmethod
    def from_yaml(cls, text: str, source: str = "<string>", overrides: Sequence[str] = ()) -> ResolvedConfig:
        """A config file's text (`overrides`: `key=value` settings over it, in the file's layout or
        the search space's: `epochs=2` and `training.epochs=2` are the same)."""
        located = parse_yaml(text, source)
        where: Where = Where(source, located.lines, _to_file_loc)
        sets = parse_config_overrides(overrides)
        if sets:
            located.data, where = apply_overrides(located.data, sets), OverriddenWhere(where, sets)
        file = validate(_as_space(located.data, where), where).file
        config = build(file, {})
        schedule = checked_hparam_schedule(located.data.get("hparam_schedule"), config, where)
        origin = located.data.get("origin") or {}
        return dataclasses.replace(config, hparam_schedule=schedule, origin=origin)

    @classmethod
    def from_file(cls, path: str | Path) -> ResolvedConfig:
        """Read a config written by `to_yaml` (or by hand); `SpaceError` naming file, line and key."""
        return cls.from_yaml(read_text(path), str(path))


def checked_hparam_schedule(schedule: Any, config: ResolvedConfig, where: Where) -> dict[str, list[float]] | None:
    """A config file's `hparam_schedule` for `config`'s optimizer and epochs (None when absent or empty);
    `SpaceError` with one located line per bad hyper-parameter. Checked after the rest of the file,
    since it needs the optimizer and the epochs (and the search-space schema has no such key)."""
    if schedule is None or schedule == {}:
        return None
    problems = hparam_schedule_problems(OPTIMIZERS[config.optimizer], schedule, config.epochs)
    if problems:
        raise SpaceError([where.problem(("hparam_schedule", *loc), message) for loc, message in problems])
    return {str(name): [float(value) for value in values] for name, values in schedule.items()}


def parse_config_overrides(items: Sequence[str]) -> list[Any]:
    """`--set key=value` items as `Override`s located in a config file's layout (a search
    space's dotted keys are translated: training.epochs -> epochs)."""
    return parse_overrides(items, translate=_to_file_loc)


def read_text(path: str | Path) -> str:
    source = str(path)
    if (
        Path(path).exists() and not Path(path).is_file() and not Path(path).is_dir()
    ):  # reading a pipe would wait forever
        raise SpaceError(
            Problem(source, None, "", "is not a regular file (a pipe, device or socket); expected a YAML file")
        )
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpaceError(
            Problem(
                source, None, "", f"file not found (looked for {Path(path).resolve()}){_other_suffix_hint(Path(path))}"
            )
        ) from None
    except IsADirectoryError:
        raise SpaceError(Problem(source, None, "", "is a directory; expected a YAML file")) from None
    except UnicodeDecodeError as error:
        raise SpaceError(
            Problem(source, None, "", f"is not UTF-8 text ({error.reason} at byte {error.start})")
        ) from None
    except OSError as error:
        raise SpaceError(Problem(source, None, "", f"cannot be read: {error.strerror or error}")) from None


def _other_suffix_hint(path: Path) -> str:
    """'; did you mean x.yaml?' when the same name with the other YAML suffix exists (.yml for .yaml, and back)."""
    other = {".yaml": ".yml", ".yml": ".yaml"}.get(path.suffix)
    return f"; did you mean {path.with_suffix(other)}?" if other and path.with_suffix(other).is_file() else ""


def _plain(value: Any) -> Any:
    """Values safe for YAML: NumPy / torch scalars as Python numbers, tuples as lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if type(value) in (type(None), bool, int, float, str):  # exact: np.float64 is a float subclass
        return value
    if isinstance(value, str):
        return str(value)
    if hasattr(value, "item"):
        try:
            return _plain(value.item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


# ---------------------------------------------------------------- file layout
def _to_file_loc(loc: Loc) -> Loc:
    """A location in the search-space layout -> the same setting in a config file."""
    head, rest = loc[:2], loc[2:]
    if loc[:1] == ("model",):
        if loc[1:2] == ("config",):
            return ("model_config", *rest)
        return ("model",)
    if loc[:1] == ("data",):
        return ("dataset",) if loc[1:2] == ("dataset",) else loc
    if loc[:1] == ("training",):
        if head in (("training", "epochs"), ("training", "accumulate")):
            return (head[1],)
        if head in (
            ("training", "early_stopping"),
            ("training", "loss"),
            ("training", "metrics"),
            ("training", "augment"),
            ("training", "precision"),
        ):
            return (head[1], *rest)
        if head in (("training", "clip_norm"), ("training", "clip_value")):
            return ("hparams", head[1])
        if head == ("training", "optimizer"):
            return ("optimizer",) if rest[:1] == ("name",) else ("hparams", *rest)
        if head == ("training", "schedule"):
            return ("schedule", *rest)
        return ()
    return loc


def _as_space(data: Any, where: Where) -> dict[str, Any]:
    """A config file's mapping in the search-space layout, so one validator checks both."""
    if data is None:
        raise where.error((), f"the file is empty; expected a config with keys {', '.join(FILE_KEYS)}")
    if not isinstance(data, dict):
        raise where.error(
            (), f"expected a mapping with keys {', '.join(FILE_KEYS)}, got {type(data).__name__} {short(data)}"
        )
    problems = []
    for key in data:
        if key not in FILE_KEYS:
            problems.append(where.problem((str(key),), unknown_key_message(key, list(FILE_KEYS))))
    if "model" not in data:
        problems.append(
            where.problem((), "missing required key 'model' (a family such as cnn1d, or 'module:function')")
        )
    for key in ("model_config", "data", "hparams", "origin"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            problems.append(
                where.problem((key,), f"expected a mapping, got {short(data[key])} ({type(data[key]).__name__})")
            )
    if data.get("schedule") is not None and not isinstance(data["schedule"], dict):
        problems.append(
            where.problem(("schedule",), f"expected a mapping with 'kind' or null, got {short(data['schedule'])}")
        )
    if isinstance(data.get("data"), dict) and "dataset" in data["data"]:
        problems.append(
            where.problem(("data", "dataset"), "the dataset is the top-level key 'dataset', not data.dataset")
        )
    if problems:
        raise SpaceError(problems)
    model = data["model"]
    space: dict[str, Any] = {"model": {("factory" if isinstance(model, str) and ":" in model else "family"): model}}
    space["study"] = {"metrics": ["val_loss"]}  # a config has no study; val_loss is measured for every loss
    if data.get("model_config") is not None:
        space["model"]["config"] = data["model_config"]
    space["data"] = dict(data.get("data") or {})
    if "dataset" in data:
        space["data"]["dataset"] = data["dataset"]
    training: dict[str, Any] = {}
    for key in ("epochs", "accumulate", "early_stopping", "loss", "metrics", "augment", "precision"):
        if key in data:
            training[key] = data[key]
    optimizer = dict(data.get("hparams") or {})
    if "optimizer" in data:
        optimizer["name"] = data["optimizer"]
    training["optimizer"] = optimizer
    if data.get("schedule") is not None:
        training["schedule"] = data["schedule"]
    space["training"] = training
    return space


# ------------------------------------------------------------- construction
def _set(tree: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node = tree
    for part in parts[:-1]:
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
    node[parts[-1]] = copy.deepcopy(value)


def build(file: SpaceFile, values: Mapping[str, Any]) -> ResolvedConfig:
    """The config of one candidate: `file`'s sections with `values` set at their dotted paths."""
    training = file.training
    tree: dict[str, Any] = {
        "data": file.data.model_dump(),
        "model": {"config": copy.deepcopy(file.model.config)},
        "training": {
            "epochs": training.epochs,
            "optimizer": {"name": training.optimizer.name, **copy.deepcopy(training.optimizer.hparams)},
            "schedule": (
                {"kind": training.schedule.kind, **copy.deepcopy(training.schedule.args)}
                if training.schedule is not None
                else None
            ),
            "clip_norm": training.clip_norm,
            "clip_value": training.clip_value,
            "accumulate": training.accumulate,
            "early_stopping": training.early_stopping.model_dump() if training.early_stopping is not None else None,
            "loss": training.loss.model_dump() if training.loss is not None else None,
            "metrics": dict(training.metrics),
            "augment": training.augment.model_dump() if training.augment is not None else None,
            "precision": training.precision,
        },
    }
    for path, value in values.items():
        _set(tree, path, value)

    family, factory = file.model.family, file.model.factory
    config = tree["model"]["config"]
    if family in FAMILIES and factory is None:
        config = {**family_defaults(family), **config}
    epochs = tree["training"]["epochs"]
    hparams = dict(tree["training"]["optimizer"])
    name = hparams.pop("name")
    if "betas" in hparams:
        hparams["beta1"], hparams["beta2"] = hparams.pop("betas")
    cls = OPTIMIZERS[name]
    # clipping is written only where set: an unclipped config reads as it did before clipping existed
    defaults = {k: v for k, v in cls.defaults.items() if k not in cls.clipping}
    hparams = {**defaults, **cls.flags, **hparams}
    for key in ("clip_norm", "clip_value"):  # training.clip_*: the optimizer clips per slot
        if tree["training"][key] is not None:
            hparams[key] = tree["training"][key]
    schedule = tree["training"]["schedule"]
    if schedule is not None:
        schedule = {
            "kind": schedule["kind"],
            **_SCHEDULE_DEFAULTS,
            "t_max": epochs,
            **{k: v for k, v in schedule.items() if k != "kind"},
        }
    data = {k: tree["data"][k] for k in DATA_KEYS}
    return ResolvedConfig(
        model=factory if factory is not None else family,
        model_config=config,
        dataset=tree["data"]["dataset"],
        data=data,
        optimizer=name,
        hparams=hparams,
        schedule=schedule,
        epochs=epochs,
        accumulate=tree["training"]["accumulate"],
        early_stopping=tree["training"]["early_stopping"],
        loss=tree["training"]["loss"],
        metrics=tree["training"]["metrics"],
        augment=tree["training"]["augment"],
        precision=tree["training"]["precision"],
    )
