"""`SearchSpace`: a validated search space file and its conversion to Optuna.

Parameter names in Optuna (and so in the storage and the dashboard) are the
dotted paths of the file, e.g. `training.optimizer.lr`. Categorical choices
that are lists or mappings (a `channels` list) are stored in Optuna as their
JSON text ("[16, 32]"), because Optuna choices must be None, bool, int, float
or str; `suggest`, `decode` and `resolve` give the original values back.
"""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from pydantic import PrivateAttr

from hfta_nas.search import TrialSeededSampler

from . import _optuna
from ._checks import encode_choice, grid_space, json_able, validate
from ._errors import Problem, SpaceError
from ._overrides import OverriddenWhere, apply_overrides, parse_overrides
from ._resolved import ResolvedConfig, build, read_text
from ._schema import (
    ArraySpec,
    BudgetSpec,
    Categorical,
    ConstraintSpec,
    DataSpec,
    Distribution,
    Fixed,
    IntLogUniform,
    IntUniform,
    LogUniform,
    ModelSpec,
    NonNegativeInt,
    Param,
    PBTSpec,
    PrunerSpec,
    SamplerSpec,
    SpaceFile,
    StudySpec,
    TrainingSpec,
    Uniform,
    _Strict,
    short,
)
from ._wandb import is_sweep, translate_sweep
from ._yaml import Loc, Where, parse_yaml


class SearchSpace(_Strict):
    """A search space file, validated. Build one with `load_space` or `parse_space`.

    The sections hold the fixed settings; `params` maps dotted paths to a
    distribution (searched) or a `Fixed` value, which override the sections.
    `text` is the file as written (store it with the study), `source` its name.
    """

    study: StudySpec
    sampler: SamplerSpec
    pruner: PrunerSpec
    budget: BudgetSpec
    array: ArraySpec
    data: DataSpec
    training: TrainingSpec
    model: ModelSpec
    seed: NonNegativeInt | None
    params: dict[str, Param]
    pbt: PBTSpec | None = None  # population-based training instead of a search
    constraints: dict[str, ConstraintSpec] = {}  # outcome constraints on measured values (_constraints)
    text: str
    source: str
    notes: tuple[str, ...] = ()  # how a W&B sweep file's keys were read (empty for our own files)
    overrides: tuple[str, ...] = ()  # `--set key=value` given over the file's settings, in order
    _lines: dict[Loc, int] = PrivateAttr(default_factory=dict)  # key lines, for errors found later

    # ------------------------------------------------------------- the params
    @property
    def searched(self) -> dict[str, Distribution]:
        """The searched params (those with a distribution), in file order."""
        return {path: p for path, p in self.params.items() if not isinstance(p, Fixed)}

    @property
    def fixed(self) -> dict[str, Any]:
        """The params given a plain value in the file."""
        return {path: p.value for path, p in self.params.items() if isinstance(p, Fixed)}

    @property
    def directions(self) -> list[str]:
        """One Optuna direction per metric (always filled in)."""
        return list(self.study.directions or [])

    def distributions(self) -> dict[str, BaseDistribution]:
        """Optuna distributions of the searched params, keyed by dotted path."""
        return {path: _distribution(param) for path, param in self.searched.items()}

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """Ask `trial` for every searched param; {dotted path: value} with list/dict choices decoded."""
        values: dict[str, Any] = {}
        for path, param in self.searched.items():
            if isinstance(param, Uniform):
                values[path] = trial.suggest_float(path, param.min, param.max, step=param.step)
            elif isinstance(param, LogUniform):
                values[path] = trial.suggest_float(path, param.min, param.max, log=True)
            elif isinstance(param, IntUniform):
                values[path] = trial.suggest_int(path, param.min, param.max, step=param.step)
            elif isinstance(param, IntLogUniform):
                values[path] = trial.suggest_int(path, param.min, param.max, log=True)
            else:
                choices = [encode_choice(v) for v in param.values]
                values[path] = _decode_choice(param, trial.suggest_categorical(path, choices))
        return values

    def encode(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """{dotted path: value} as Optuna stores it (for FixedTrial, enqueue_trial, ...)."""
        return {
            path: encode_choice(value) if isinstance(self.params.get(path), Categorical) else value
            for path, value in values.items()
        }

    def decode(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Optuna's `trial.params` back to file values (JSON text of list/dict choices -> the list/dict)."""
        return {
            path: _decode_choice(param, value) if isinstance(param := self.params.get(path), Categorical) else value
            for path, value in params.items()
        }

    def resolve(self, values: Mapping[str, Any]) -> ResolvedConfig:
        """The candidate with these searched values: fixed settings and `values` merged at their paths.

        `values` must give every searched param (as `suggest` returns them, or
        Optuna's `trial.params`); a value outside its distribution is an error.
        """
        if not isinstance(values, Mapping):
            message = f"resolve needs a mapping of dotted paths to values, got {type(values).__name__}"
            raise SpaceError(Problem(self.source, None, "", message))
        where = Where(self.source, self._lines)
        searched = self.searched
        problems = []
        for path in values:
            if path not in searched:
                what = "is fixed in the file" if path in self.params else "is not a param of this space"
                problems.append(
                    where.problem(
                        ("params", str(path)),
                        f"got a value for '{path}', which {what}; searched params: {', '.join(searched) or 'none'}",
                    )
                )
        for path in searched:
            if path not in values:
                problems.append(where.problem(("params", path), f"no value given for searched param '{path}'"))
        if problems:
            raise SpaceError(problems)
        chosen: dict[str, Any] = dict(self.fixed)
        for path, param in searched.items():
            value, message = _checked_value(param, values[path])
            if message:
                problems.append(where.problem(("params", path), message))
            chosen[path] = value
        if problems:
            raise SpaceError(problems)
        return build(self._file(), chosen)

    def default_config(self) -> ResolvedConfig | None:
        """The config when nothing is searched (every param fixed); None otherwise."""
        return None if self.searched else self.resolve({})

    # --------------------------------------------------------------- Optuna
    def make_sampler(self, seed: int | None = None) -> optuna.samplers.BaseSampler:
        """The configured sampler, seeded with `seed` (default: the file's `seed`): trial k draws from a
        stream of its own, seeded from (seed, k), so workers and re-runs on one study never share one."""
        name = self.sampler.name
        missing = _optuna.missing_packages(name)
        if missing:
            raise Where(self.source, self._lines).error(
                ("sampler", "name"),
                f"sampler '{name}' needs the package(s) {', '.join(missing)}: pip install {' '.join(missing)}",
            )
        seed = self.seed if seed is None else seed
        if name == "grid":  # its seed orders the grid: every trial's sampler must share the order
            grid = grid_space(self.params)
            return TrialSeededSampler(lambda _: _optuna.build_sampler(name, self.sampler.kwargs, seed, grid), seed)
        # built once now (TrialSeededSampler.kind): a bad setting fails here, not at the first trial
        return TrialSeededSampler(functools.partial(_optuna.build_sampler, name, self.sampler.kwargs), seed)

    def make_pruner(self) -> optuna.pruners.BasePruner:
        """The configured pruner (NopPruner for 'none' and, by default, for multi-objective studies)."""
        return _optuna.build_pruner(self.pruner.name or "median", self.pruner.kwargs)

    def with_overrides(
        self, *, sampler: str | None = None, pruner: str | None = None, seed: int | None = None
    ) -> SearchSpace:
        """This space with another sampler, pruner or seed (what `hfta-nas search --sampler/--pruner/--seed` do).

        A sampler or pruner of another name starts from its defaults: the file's
        `kwargs` belong to the file's choice. The result is checked exactly as a
        file would be (a single-objective sampler or any pruner on a
        multi-objective study, a grid over continuous params, ...); problems
        raise `SpaceError` naming the option, e.g. `--sampler: expected one of ...`.
        """
        from ._checks import _check_sampler_and_pruner, _Run
        from ._schema import PRUNERS, SAMPLERS

        problems = []
        for option, value, names in (("--sampler", sampler, SAMPLERS), ("--pruner", pruner, PRUNERS)):
            if value is not None and value not in names:
                close = difflib.get_close_matches(str(value), names, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                problems.append(Problem(option, None, "", f"expected one of {', '.join(names)}, got {value!r}{hint}"))
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            problems.append(Problem("--seed", None, "", f"expected an integer >= 0, got {seed!r}"))
        if problems:
            raise SpaceError(problems)
        update: dict[str, Any] = {}
        if sampler is not None:
            kwargs = self.sampler.kwargs if sampler == self.sampler.name else {}
            update["sampler"] = SamplerSpec(name=sampler, kwargs=kwargs)
        if pruner is not None:
            kwargs = self.pruner.kwargs if pruner == self.pruner.name else {}
            update["pruner"] = PrunerSpec(name=pruner, kwargs=kwargs)
        if seed is not None:
            update["seed"] = seed
        if not update:
            return self
        options = " ".join(f"--{k} {getattr(v, 'name', v)}" for k, v in update.items())
        file = self._file().model_copy(update=update)
        run = _Run(Where(f"{self.source} with {options}", {}))
        file = _check_sampler_and_pruner(run, file, self.params)
        run.raise_if_any()
        changed = self.model_copy(update={**update, "pruner": file.pruner})
        changed._lines = self._lines
        return changed

    @property
    def grid_size(self) -> int | None:
        """Number of grid points for the grid sampler (None for other samplers)."""
        if self.sampler.name != "grid":
            return None
        return math.prod(len(v) for v in grid_space(self.params).values())

    def _file(self) -> SpaceFile:
        return SpaceFile.model_construct(
            study=self.study,
            sampler=self.sampler,
            pruner=self.pruner,
            budget=self.budget,
            array=self.array,
            data=self.data,
            training=self.training,
            model=self.model,
            pbt=self.pbt,
            seed=self.seed,
            params={},
        )


def _distribution(param: Distribution) -> BaseDistribution:
    if isinstance(param, Uniform):
        return FloatDistribution(param.min, param.max, step=param.step)
    if isinstance(param, LogUniform):
        return FloatDistribution(param.min, param.max, log=True)
    if isinstance(param, IntUniform):
        return IntDistribution(param.min, param.max, step=param.step)
    if isinstance(param, IntLogUniform):
        return IntDistribution(param.min, param.max, log=True)
    return CategoricalDistribution([encode_choice(v) for v in param.values])


def _decode_choice(param: Categorical, value: Any) -> Any:
    if isinstance(value, str):
        for choice in param.values:
            if not isinstance(choice, str) and encode_choice(choice) == value:
                return choice
    return value


def _plain(value: Any) -> Any:
    """NumPy scalars (from a sampler or a dataframe) as Python scalars; tuples as lists."""
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return value.item()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _choice_key(value: Any) -> Any:
    return encode_choice(value) if json_able(value) else ("not a choice", id(value))


def _checked_value(param: Distribution, value: Any) -> tuple[Any, str | None]:
    """(the value as the file writes it, or the problem with it)."""
    number = _plain(value)
    if isinstance(param, Categorical):
        key = _choice_key(_decode_choice(param, number))
        for choice in param.values:
            if _choice_key(choice) == key:
                return choice, None
        return value, f"{short(value)} is not one of the choices {short(param.values, 120)}"
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        return value, f"expected a number, got {short(value)} ({type(value).__name__})"
    if isinstance(param, (IntUniform, IntLogUniform)):
        if not float(number).is_integer():
            return value, f"expected an integer, got {short(value)}"
        number = int(number)
        step = param.step if isinstance(param, IntUniform) else 1
        if not param.min <= number <= param.max or (number - param.min) % step:
            grid = f" with step {step}" if step != 1 else ""
            return value, f"{number} is outside [{param.min}, {param.max}]{grid}"
        return number, None
    number = float(number)
    tolerance = 1e-12 * max(1.0, abs(param.min), abs(param.max))
    if not param.min - tolerance <= number <= param.max + tolerance:
        return value, f"{number} is outside [{param.min}, {param.max}]"
    return number, None


def parse_space(text: str, source: str = "<string>", overrides: Sequence[str] = ()) -> SearchSpace:
    """Validate search space YAML `text` (ours, or a W&B sweep file: see `notes`); `source` names it in errors.

    `overrides`: `key=value` settings over the file's (`training.epochs=2`,
    `params.training.optimizer.lr=1e-3`), validated with it; a problem with one names its `--set`.
    """
    located = parse_yaml(text, source)
    data, lines, where, notes = located.data, located.lines, Where(source, located.lines), []
    if is_sweep(data):
        sweep = translate_sweep(data, where)
        data, lines, where, notes = sweep.data, sweep.lines, sweep.where, sweep.notes
    sets = parse_overrides(overrides)
    if sets:
        data, where = apply_overrides(data, sets), OverriddenWhere(where, sets)
    checked = validate(data, where)
    file = checked.file
    space = SearchSpace(
        study=file.study,
        sampler=file.sampler,
        pruner=file.pruner,
        budget=file.budget,
        array=file.array,
        data=file.data,
        training=file.training,
        model=file.model,
        pbt=file.pbt,
        constraints=file.constraints,
        seed=file.seed,
        params=checked.params,
        text=text,
        source=source,
        notes=tuple(notes),
        overrides=tuple(overrides),
    )
    space._lines = lines
    return space


def load_space(path: str | Path, overrides: Sequence[str] = ()) -> SearchSpace:
    """Read and validate the search space file at `path` (with `overrides`, as `parse_space`);
    `SpaceError` names the file, line and key."""
    return parse_space(read_text(path), str(path), overrides)
