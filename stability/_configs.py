"""Where a stability study's configurations come from.

- a config file exported by `hfta-nas search` (or written by hand, same format);
- a search space file with every searched parameter fixed by `--params key=value`;
- the K best trials of a search study (`--study NAME --top-k K`), rebuilt from
  the space text the search stored in the study; a population-based training member
  comes with its per-epoch schedule (`pbt_schedule`), re-run from scratch;
- nothing: the shipped default `stability/configs/mnist1d_cnn.yaml`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

from hfta_nas.errors import HftaNasError
from hfta_nas.optim import OPTIMIZERS, hparam_schedule_problems
from hfta_nas.search import study_text
from hfta_nas.search_spaces import ResolvedConfig, SearchSpace, parse_space, read_text

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "mnist1d_cnn.yaml"
_SPACE_KEYS = {"study", "sampler", "pruner", "budget", "array", "training", "params", "seed"}


@dataclass(frozen=True)
class LabelledConfig:
    label: str
    config: ResolvedConfig


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    """['training.optimizer.lr=3e-3', 'model.config.channels=[32, 32]'] -> values (read as YAML)."""
    values: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise HftaNasError(f"--params expects key=value (a dotted path of the space), got {item!r}.")
        values[key.strip()] = _value(text)
    return values


def _value(text: str) -> Any:
    """YAML's reading of one value, except that '3e-3' is a number (YAML 1.1 wants '3.0e-3')."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def load_config(
    path: str | Path, params: Mapping[str, Any] | None = None, overrides: Sequence[str] = ()
) -> ResolvedConfig:
    """A config file, or a search space with its searched parameters fixed by `params`;
    `overrides` (`--set key=value`) over the file's settings."""
    text = read_text(path)
    try:
        top = yaml.safe_load(text)
    except yaml.YAMLError:
        top = None  # the located parser below reports the syntax error
    if isinstance(top, dict) and _SPACE_KEYS & set(top):
        space = parse_space(text, str(path), overrides)
        values = dict(params or {})
        if not values and space.searched:
            raise HftaNasError(
                f"{path} is a search space with searched parameters ({', '.join(space.searched)}); "
                "fix each with --params key=value, or pass the config a search exported "
                "(runs/<study>/best_config.yaml)."
            )
        return space.resolve(values)
    if params:
        raise HftaNasError(f"--params fixes the searched parameters of a search space file; {path} is a config file.")
    return ResolvedConfig.from_yaml(text, str(path), overrides)


def label_for(path: str | Path, taken: Sequence[str] = ()) -> str:
    """A short unique label: the file stem, numbered when two files share it."""
    stem = Path(path).stem
    label, n = stem, 2
    while label in taken:
        label, n = f"{stem}-{n}", n + 1
    return label


def top_k_configs(storage: Any, study_name: str, k: int) -> list[LabelledConfig]:
    """The K best COMPLETE trials of a search study, as configs labelled 'trial N' ('trial N (PBT
    schedule)' for a population-based training member, which carries its schedule)."""
    if k < 1:
        raise HftaNasError(f"--top-k must be at least 1, got {k}.")
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        names = ", ".join(s.study_name for s in optuna.get_all_study_summaries(storage)) or "none"
        raise HftaNasError(f"no study named '{study_name}' in this storage (studies: {names}).") from None
    space_for = _spaces_of(study, study_name)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        raise HftaNasError(f"study '{study_name}' has no completed trial to re-run.")
    if len(study.directions) > 1:
        ranked = sorted(study.best_trials, key=lambda t: t.number)  # the Pareto front
    else:
        sign = -1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0
        ranked = sorted(complete, key=lambda t: (sign * t.value, t.number))
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    return [_trial_config(space_for(trial.number), study_name, trial, by_number) for trial in ranked[:k]]


def _spaces_of(study: optuna.Study, study_name: str) -> Callable[[int], SearchSpace]:
    """The space each trial number was searched with: the study's, or for a trial from before a
    `search --new-space`, the earlier space kept in its history (in the order they were replaced)."""
    text = study_text(study, "space_text")
    if text is None:
        raise HftaNasError(f"study '{study_name}' was not made by `hfta-nas search` (it has no stored search space).")
    current = parse_space(
        text, study.user_attrs.get("space_source", study_name), study_text(study, "space_overrides", [])
    )
    earlier = study_text(study, "space_history", [])

    def space_for(number: int) -> SearchSpace:
        for entry in earlier:
            if number < entry["before_trial"]:
                return parse_space(entry["text"], entry["source"], entry["overrides"])
        return current

    return space_for


def _trial_config(
    space: SearchSpace, study_name: str, trial: optuna.trial.FrozenTrial, by_number: Mapping[int, Any]
) -> LabelledConfig:
    """One trial as a config; a PBT member's with the schedule its weights trained with."""
    origin = {"study": study_name, "trial": trial.number, "values": list(trial.values)}
    schedule = trial.user_attrs.get("pbt_schedule")
    if not schedule:
        config = space.resolve(space.decode(trial.params))
        return LabelledConfig(f"trial {trial.number}", dataclasses.replace(config, origin=origin))
    # An exploit copies every hyper-parameter with the weights and explore changes only the scheduled
    # ones, so the others are those of the member whose initial weights these descend from (its root).
    root = (trial.user_attrs.get("pbt_roots") or [trial.number])[-1]
    config = space.resolve(space.decode(by_number.get(root, trial).params))
    problems = hparam_schedule_problems(OPTIMIZERS[config.optimizer], schedule, config.epochs)
    if problems:
        (loc, message), *_ = problems
        raise HftaNasError(
            f"trial {trial.number} of study '{study_name}' has a pbt_schedule that cannot be replayed: "
            f"{'.'.join(str(part) for part in loc)}: {message}."
        )
    schedule = {name: [float(v) for v in values] for name, values in schedule.items()}
    if root != trial.number:
        origin["pbt_root"] = root
    config = dataclasses.replace(config, hparam_schedule=schedule, origin=origin)
    return LabelledConfig(f"trial {trial.number} (PBT schedule)", config)
