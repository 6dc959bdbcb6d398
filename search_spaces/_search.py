"""The YAML front-end of a search: a space file becomes an Optuna study and a
`build(trial)` function, and `hfta_nas.optimize` does the rest (one
implementation underneath for files and for Python searches).

`build` suggests every searched param under its dotted path
(`model.config.channels`, `training.optimizer.lr`, ...), resolves the file's
config and returns it as a `hfta_nas.Candidate`; a Python `build` that makes
the same suggests in the same order gets the same trials for the same seed.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import torch

import hfta_nas
from hfta_nas import Candidate
from hfta_nas.data import Dataset, load_dataset
from hfta_nas.errors import HftaNasError
from hfta_nas.models import resolve_model
from hfta_nas.runtime import checked_out_dir
from hfta_nas.search import (
    PBTSummary,
    SearchPlan,
    SearchSummary,
    StepCost,
    artifact_folder,
    attach_study_file,
    check_directions,
    check_options,
    check_patience,
    copy_of_stored_study,
    open_storage,
    optimize,
    pbt,
    plan,
    set_study_text,
    study_lock,
)

from ._constraints import OutcomeConstraints
from ._identity import check_same_space, remember_space
from ._pbt import pbt_options
from ._pbt_checks import per_slot
from ._sources import check_sources
from ._space import SearchSpace

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _data_of(config: Any, datasets: dict[str, Dataset], device: str, dtype: str) -> Dataset:
    """`config`'s dataset, loaded once per distinct data section into `datasets`."""
    kwargs = config.dataset_kwargs()
    key = repr((str(config.dataset), sorted(kwargs.items())))
    if key not in datasets:
        datasets[key] = load_dataset(config.dataset, **kwargs, device=device, dtype=_DTYPES[dtype])
    return datasets[key]


def preload_data(space: SearchSpace, *, device: str = "cpu", dtype: str = "float32") -> dict[str, Dataset]:
    """The data of one candidate of the space (every param at its lower end or first choice),
    loaded: a data file that cannot be read is refused before a study is written. The result
    is the cache `candidate_builder` takes (`datasets`), so the data is not loaded twice."""
    datasets: dict[str, Dataset] = {}
    first = {path: _first_value(param) for path, param in space.searched.items()}
    _data_of(space.resolve(first), datasets, device, dtype)
    return datasets


def _first_value(param: Any) -> Any:
    return param.values[0] if hasattr(param, "values") else param.min


def candidate_builder(
    space: SearchSpace, *, device: str = "cpu", dtype: str = "float32", datasets: dict[str, Dataset] | None = None
) -> Callable[[optuna.Trial], Candidate]:
    """`build(trial)` for `hfta_nas.optimize`: the space's suggests, resolved to a Candidate
    (datasets are loaded once per distinct data section, into `datasets` when given)."""
    datasets = {} if datasets is None else datasets

    def build(trial: optuna.Trial) -> Candidate:
        config = space.resolve(space.suggest(trial))
        data = _data_of(config, datasets, device, dtype)
        factory = resolve_model(
            config.model, config.model_config, input_shape=data.input_shape, num_classes=data.num_classes
        )
        training = config.train_kwargs()  # the loss, early stopping and augmentation as the engine takes them
        return Candidate(
            model=factory,
            optimizer=config.optimizer,
            hparams=config.hparams,
            schedule=config.schedule,
            epochs=config.epochs,
            batch_size=config.data["batch_size"],
            data=data,
            config=config,
            accumulate=config.accumulate,
            early_stopping=training["early_stopping"],
            loss=training["loss"],
            augmentation=training["augmentation"],
            precision=config.precision,
        )

    return build


def architecture_params(space: SearchSpace) -> list[str]:
    """The searched params that fix a candidate's array: all but per-slot optimizer and schedule values."""
    return [p for p in space.searched if not per_slot(p)]


def check_searches_something(space: SearchSpace) -> None:
    """HftaNasError for a space with nothing to search (`params` empty or null): every trial would
    train the same settings, which is a seed study, and `hfta-nas stability` is the tool for it."""
    if not space.searched:
        raise HftaNasError(
            f"{space.source}: params searches nothing (it is empty or null, or every value is fixed), so every "
            "trial would train the same settings; give params a distribution to search, or train this "
            f"configuration over seeds with `hfta-nas stability {space.source}`."
        )


def study_name_of(space: SearchSpace, study_name: str | None) -> str:
    """The study's name (--study-name, the space's study.name, else the file name); HftaNasError for
    a name with a control character (a newline or NUL would be stored, listed and exported as is)."""
    name = study_name or space.study.name or Path(space.source).stem
    if not name.isprintable():
        raise HftaNasError(
            f"study name {name!r} holds a control character (a newline, tab or NUL); expected printable characters."
        )
    return name


def default_out_dir(study_name: str) -> Path:
    """`runs/<study name>`, where a search without `out_dir` writes; HftaNasError when the name is not one
    plain folder name (it would write elsewhere, e.g. '../../x', or the file system refuses it)."""
    if (
        not study_name
        or len(study_name) > 128
        or study_name in (".", "..")
        or any(c in study_name for c in "/\\\0")
        or not study_name.isprintable()
    ):
        shown = study_name if len(study_name) <= 60 else study_name[:40] + f"... ({len(study_name)} characters)"
        raise HftaNasError(
            f"study name {shown!r} cannot name the default output folder runs/<study name>: expected "
            "1-128 printable characters without '/' or '\\' (and not '.' or '..'); give --out, or "
            "another --study-name"
        )
    return Path("runs") / study_name


def storage_patience_of(space: SearchSpace, given: float | None = None) -> tuple[float, bool]:
    """(the storage patience: `given`, else the space's study.storage_patience; whether either was
    given explicitly). An explicit patience holds for the first contact too (`open_storage`'s
    wait_at_start): workers a scheduler starts while the database restarts wait for it; without
    one, a storage that cannot be reached at start (a wrong URL) is refused at once."""
    if given is not None:
        return given, True
    return space.study.storage_patience, "storage_patience" in space.study.model_fields_set


def open_space_study(
    space: SearchSpace,
    storage: str | None = None,
    study_name: str | None = None,
    *,
    adopt: bool = False,
    storage_patience: float | None = None,
    new_space: bool = False,
) -> optuna.Study:
    """The space's study in `storage` (created, or resumed when it exists with the same directions
    and the same space; one with trials that hfta-nas did not make only when `adopt`; one searched
    with another space only when `new_space`). Its storage rides out outages of `storage_patience`
    seconds (default: the space's study.storage_patience)."""
    patience, explicit = storage_patience_of(space, storage_patience)
    opened, location = open_storage(storage, patience, wait_at_start=explicit)
    name = study_name_of(space, study_name)
    # under the study's lock from the check to the write: of two processes that open one study at
    # once with different spaces, the first stores its space and the other is refused (_identity)
    with study_lock(opened, location, name):
        study = _load_or_create(space, opened, name, location, adopt)
        check_directions(study, space.directions)
        _check_distributions(study, space)
        if check_same_space(study, space, location, new_space=new_space):
            remember_space(study, space)
        _store_space(study, space, location)
    return study


def _load_or_create(space: SearchSpace, opened: Any, name: str, location: str, adopt: bool) -> optuna.Study:
    sampler, pruner = space.make_sampler(seed=space.seed), space.make_pruner()
    try:  # loaded first: create_study(load_if_exists=True) appends a record to a journal even when the study exists
        study = optuna.load_study(study_name=name, storage=opened, sampler=sampler, pruner=pruner)
        if not adopt:
            _refuse_a_stranger(study, location)
        return study
    except KeyError:
        return optuna.create_study(
            storage=opened,
            study_name=name,
            directions=space.directions,
            sampler=sampler,
            pruner=pruner,
            load_if_exists=True,
        )


def _store_space(study: optuna.Study, space: SearchSpace, location: str) -> None:
    """The space's file, overrides and settings with the study (checked to be its space before)."""
    with warnings.catch_warnings():  # set_metric_names is "experimental" in Optuna, and stable in use
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(space.study.metrics))
    # The file's text is long: kept out of the user attributes (which `optuna studies` and the dashboard
    # list), and shown in the dashboard as an artifact.
    set_study_text(study, "space_text", space.text)
    set_study_text(study, "space_overrides", list(space.overrides))  # `--set`s: the space as it was searched
    attach_study_file(
        study,
        Path(space.source).name if space.source.endswith((".yaml", ".yml")) else "space.yaml",
        space.text,
        artifact_folder(location),
    )
    for key, value in {
        "space_source": str(space.source),
        "sampler": space.sampler.name,
        "pruner": space.pruner.name,
        "seed": space.seed,
        "versions": {"hfta_nas": hfta_nas.__version__, "torch": torch.__version__, "optuna": optuna.__version__},
    }.items():
        study.set_user_attr(key, value)


def _refuse_a_stranger(study: optuna.Study, location: str) -> None:
    """HftaNasError for a study with trials and none of the attributes hfta-nas gives its studies
    (plain Optuna's, say): searching it would fail its RUNNING trials as interrupted and add ours."""
    trials = study.get_trials(deepcopy=False)
    if trials and "hfta_nas" not in (study.user_attrs.get("versions") or {}):
        raise HftaNasError(
            f"study '{study.study_name}' in {location} was not made by hfta-nas ({len(trials)} trials, none of "
            "its attributes): searching it would fail its RUNNING trials and add trials of this space; give "
            "--adopt to take it over, or another --study-name."
        )


def _check_distributions(study: optuna.Study, space: SearchSpace) -> None:
    """A resumed study's params keep their kind of distribution (Optuna refuses another on ask):
    HftaNasError naming the param, before anything is written."""
    wanted = space.distributions()
    for trial in study.get_trials(deepcopy=False):
        for path, stored in trial.distributions.items():
            if path not in wanted:
                continue
            try:
                optuna.distributions.check_distribution_compatibility(stored, wanted[path])
            except ValueError:
                raise HftaNasError(
                    f"study '{study.study_name}' has trials where '{path}' is {stored}, but this space makes it "
                    f"{wanted[path]}; a study keeps one kind of distribution per parameter: restore the old "
                    "definition, or give another --study-name"
                ) from None


def _options(
    space: SearchSpace,
    n_trials: int | None,
    timeout: float | None,
    array_size: int | str | None,
    device: str,
    dtype: str,
) -> dict[str, Any]:
    """`optimize`'s options from the file, overridden by those given; checked before anything is stored."""
    options = dict(
        n_trials=n_trials if n_trials is not None else space.budget.n_trials,
        timeout=timeout if timeout is not None else space.budget.timeout,
        array_size=array_size if array_size is not None else space.array.size,
        metrics=list(space.study.metrics),
        seed=space.seed if space.seed is not None else 0,
        device=device,
        dtype=dtype,
        max_waste=space.array.max_waste,
        replicate=architecture_params(space) if space.array.fill == "replicate" else None,
        step_cost=StepCost(**space.array.step_cost.model_dump()) if space.array.step_cost else None,
    )
    check_options(options["n_trials"], options["timeout"], options["array_size"], options["max_waste"])
    return options


def run_search(
    space: SearchSpace,
    *,
    storage: str | None = None,
    study_name: str | None = None,
    n_trials: int | None = None,
    timeout: float | None = None,
    array_size: int | str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    out_dir: str | Path | None = None,
    on_event: Callable[[Any], None] | None = None,
    adopt: bool = False,
    storage_patience: float | None = None,
    new_space: bool = False,
) -> SearchSummary | PBTSummary:
    """Search a space file's space (a PBTSummary: population-based training, when it has a pbt block); options
    left None come from the file. A stored study of that
    name that hfta-nas did not make is refused unless `adopt` (its RUNNING trials would be failed), one
    searched with another space unless `new_space`.
    The storage may be unreachable for up to `storage_patience` seconds at a time (see PatientStorage)."""
    if storage_patience is not None:
        check_patience(storage_patience)
    if space.pbt is None:  # a population may start alike: explore makes its members differ
        check_searches_something(space)
    check_sources(space)  # a missing factory or data file fails here, before any trial is asked
    options = _options(space, n_trials, timeout, array_size, device, dtype)
    out = checked_out_dir(
        out_dir if out_dir is not None else default_out_dir(study_name_of(space, study_name)), "--out"
    )
    datasets = preload_data(space, device=device, dtype=dtype)  # unreadable data fails before the study is written
    study = open_space_study(
        space, storage, study_name, adopt=adopt, storage_patience=storage_patience, new_space=new_space
    )
    build = candidate_builder(space, device=device, dtype=dtype, datasets=datasets)
    if space.pbt is not None:
        return pbt(study, build, out_dir=out, on_event=on_event, device=device, dtype=dtype, **pbt_options(space))
    constraints = OutcomeConstraints(space.constraints) if space.constraints else None
    return optimize(study, build, out_dir=out, on_event=on_event, constraints=constraints, **options)


def plan_search(
    space: SearchSpace,
    *,
    storage: str | None = None,
    study_name: str | None = None,
    n_trials: int | None = None,
    timeout: float | None = None,
    array_size: int | str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    max_arrays: int | None = None,
    new_space: bool = False,
) -> SearchPlan:
    """What `run_search` would train (`--dry-run`), by the same policy; nothing is written
    (an existing study is read, and the plan asks in a copy). A study searched with another
    space is refused as `run_search` refuses it, unless `new_space`."""
    check_searches_something(space)
    check_sources(space)
    study, location = copy_of_stored_study(
        storage,
        study_name_of(space, study_name),
        directions=space.directions,
        sampler=space.make_sampler(seed=space.seed),
        pruner=space.make_pruner(),
    )
    check_same_space(study, space, location, new_space=new_space)
    return plan(
        study,
        candidate_builder(space, device=device, dtype=dtype),
        storage=location,
        max_arrays=max_arrays,
        **_options(space, n_trials, timeout, array_size, device, dtype),
    )
