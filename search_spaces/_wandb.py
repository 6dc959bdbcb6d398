"""Weights & Biases sweep files read as search spaces.

A sweep file (`method`, `metric`, `parameters`, ...) is translated into this
package's own file layout before validation, so every check and every error
message of a space applies to it. Each sweep key is mapped to ours and said
so in one line (`SearchSpace.notes`); what has no counterpart either changes
nothing (`program`, `project`, ... : notes say they are not used) or would
change what is sampled (weighted choices, normal distributions): those are
errors at their line, never silently approximated.

Parameter names: a dotted path of ours (`training.optimizer.lr`) is kept;
nested `parameters:` blocks join with dots; the usual bare names map to our
settings (`learning_rate` -> training.optimizer.lr, `epochs` ->
training.epochs, ...); any other bare name is read as a model config key
(`dropout` -> model.config.dropout), checked against the model like any other.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from ._errors import Problem, SpaceError
from ._schema import short
from ._yaml import Loc, Where

SWEEP_ONLY_KEYS = ("method", "metric", "parameters", "early_terminate", "run_cap")
_UNUSED_KEYS = {
    "program": "hfta-nas trains the model itself",
    "command": "hfta-nas trains the model itself",
    "project": "results go to the Optuna storage",
    "entity": "results go to the Optuna storage",
    "description": "not stored",
}
_OUR_SECTIONS = ("study", "sampler", "pruner", "budget", "array", "data", "training", "model", "seed", "params")
_METHODS = {
    "bayes": ("tpe", "Optuna's TPE; W&B's bayes is a Gaussian process: --sampler gp is the closer match"),
    "random": ("random", "Optuna's RandomSampler"),
    "grid": ("grid", "Optuna's GridSampler"),
}
_METRICS = {
    "accuracy": "val_acc",
    "acc": "val_acc",
    "val_accuracy": "val_acc",
    "validation_accuracy": "val_acc",
    "loss": "val_loss",
    "validation_loss": "val_loss",
    "test_accuracy": "test_acc",
    "train_accuracy": "train_acc",
    "training_loss": "train_loss",
}
_METRIC_KEYS_NOT_USED = {
    "target": "the search runs its whole budget",
    "impute": "every trial reports its metric each epoch; a trial that fails is marked failed, not imputed",
    "impute_while_running": "pruning reads the epochs a trial has reported, never imputed ones",
}
_NAMES = {
    "lr": "training.optimizer.lr",
    "learning_rate": "training.optimizer.lr",
    "weight_decay": "training.optimizer.weight_decay",
    "wd": "training.optimizer.weight_decay",
    "momentum": "training.optimizer.momentum",
    "optimizer": "training.optimizer.name",
    "epochs": "training.epochs",
    "batch_size": "data.batch_size",
    "dataset": "data.dataset",
    "model": "model.family",
    "family": "model.family",
    "seed": "seed",
}
_PREFIXES = {"optimizer": "training.optimizer", "schedule": "training.schedule", "config": "model.config"}
_OUR_ROOTS = ("data", "training", "model")
# Settings a sweep may fix but not search: they live in the file's sections, not in params.
_SECTION_ONLY_ROOTS = ("study", "sampler", "pruner", "budget", "array", "seed")
_SECTION_ONLY = ("data.dataset", "model.family", "model.factory")
_UNSUPPORTED = (
    "q_log_uniform",
    "q_log_uniform_values",
    "inv_log_uniform",
    "inv_log_uniform_values",
    "normal",
    "q_normal",
    "log_normal",
    "q_log_normal",
    "beta",
    "q_beta",
)


def is_sweep(data: Any) -> bool:
    """Whether parsed YAML is a W&B sweep file (our files have no such keys), or one nested under `sweep:`."""
    return isinstance(data, dict) and (
        any(key in data for key in SWEEP_ONLY_KEYS) or (set(data) == {"sweep"} and is_sweep(data["sweep"]))
    )


@dataclass
class Translated:
    """A sweep file in our layout, the lines of its keys, and one note per sweep key."""

    data: dict[str, Any]
    lines: dict[Loc, int]
    where: Where
    notes: list[str] = field(default_factory=list)


class _SweepWhere(Where):
    """Names a problem found in the translated file by the sweep key it came from."""

    def __init__(self, source: str, lines: dict[Loc, int], origins: dict[Loc, tuple[Loc, str]]) -> None:
        super().__init__(source, lines)
        self.origins = origins  # our loc prefix -> (the sweep's loc, what it was read as, whether it has parts)

    def problem(self, loc: Loc, message: str) -> Problem:
        loc = tuple(str(part) for part in loc)
        for end in range(len(loc), 0, -1):
            if loc[:end] in self.origins:
                theirs, read_as, has_parts = self.origins[loc[:end]]
                base = super().problem((*theirs, *loc[end:]) if has_parts else theirs, message)
                return Problem(base.source, base.line, base.key, f"(read as {read_as}) {message}")
        return super().problem(loc, message)


class _Translation:
    def __init__(self, data: dict[str, Any], where: Where) -> None:
        self.sweep = data
        self.where = where
        self.out: dict[str, Any] = {}
        self.lines: dict[Loc, int] = {}
        self.origins: dict[Loc, tuple[Loc, str]] = {}
        self.notes: list[str] = []
        self.problems: list[Problem] = []

    def fail(self, loc: Loc, message: str) -> None:
        self.problems.append(self.where.problem(loc, message))

    def warn(self, loc: Loc, message: str) -> None:
        """One line on the `hfta_nas` logger: legal, but rarely what is meant."""
        logging.getLogger("hfta_nas").warning(f"warning: {self.where.problem(loc, message)}")

    def place(self, ours: Loc, value: Any, theirs: Loc, read_as: str, has_parts: bool = True) -> None:
        """Put `value` at our loc `ours`, remembering the sweep's lines under `theirs`
        (`has_parts`: a part of `value` is the same part of the sweep's value)."""
        target = self.out
        for part in ours[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                self.fail(theirs, f"conflicts with another key that sets {'.'.join(ours[:-1])}")
                return
        if ours[-1] in target:
            self.fail(theirs, f"sets {read_as}, which another key of the file sets too; give it once")
            return
        target[ours[-1]] = value
        if not theirs:  # a default the translation adds: no line of its own
            return
        self.origins[tuple(ours)] = (theirs, read_as, has_parts)
        width = len(theirs)
        for loc, line in self.where.lines.items():
            if loc[:width] == tuple(theirs):
                self.lines[(*ours, *loc[width:])] = line
        self.lines.setdefault(tuple(ours), self.where.line(theirs) or 0)

    # ------------------------------------------------------------------ keys
    def run(self) -> None:
        for key, value in self.sweep.items():
            if key in _OUR_SECTIONS:
                self.place((key,), value, (key,), f"hfta-nas section '{key}'")
                self.notes.append(f"{key}: kept (an hfta-nas section)")
            elif key in _UNUSED_KEYS:
                self.notes.append(f"{key}: not used ({_UNUSED_KEYS[key]})")
        if "method" not in self.sweep:
            self.fail((), "a sweep file needs 'method' (bayes, random or grid)")
        self.method(self.sweep.get("method"))
        self.metric(self.sweep.get("metric"))
        self.name(self.sweep.get("name"))
        self.run_cap(self.sweep.get("run_cap"))
        self.early_terminate(self.sweep.get("early_terminate"))
        parameters = self.sweep.get("parameters")
        if parameters is None:
            self.fail((), "a sweep file needs 'parameters' (the settings to search)")
        elif not isinstance(parameters, dict):
            self.fail(("parameters",), f"expected a mapping of parameter names, got {short(parameters)}")
        else:
            self.parameters(parameters, ("parameters",), ())
        known = {*_OUR_SECTIONS, *_UNUSED_KEYS, *SWEEP_ONLY_KEYS, "name"}
        for key in self.sweep:
            if key not in known:
                self.fail(
                    (key,),
                    f"unknown sweep key '{key}'; a W&B sweep file has {', '.join(sorted(known - set(_OUR_SECTIONS)))}"
                    f", and may carry hfta-nas sections ({', '.join(_OUR_SECTIONS)})",
                )

    def method(self, method: Any) -> None:
        if method is None:
            return
        if method not in _METHODS:
            self.fail(("method",), f"expected one of {', '.join(_METHODS)}, got {short(method)}")
            return
        name, meaning = _METHODS[method]
        self.place(("sampler",), name, ("method",), f"sampler: {name}", has_parts=False)
        self.notes.append(f"method: {method} -> sampler: {name} ({meaning})")

    def metric(self, metric: Any) -> None:
        if metric is None:
            self.notes.append("metric: not given -> study.metrics: [val_acc] (maximize), the hfta-nas default")
            return
        if not isinstance(metric, dict) or "name" not in metric:
            self.fail(("metric",), f"expected a mapping with 'name' and 'goal', got {short(metric)}")
            return
        name = metric["name"]
        ours = _METRICS.get(name, name) if isinstance(name, str) else name
        goal = metric.get("goal", "minimize")
        if goal not in ("minimize", "maximize"):
            self.fail(("metric", "goal"), f"expected minimize or maximize, got {short(goal)}")
            return
        self.place(("study", "metrics"), [ours], ("metric", "name"), f"study.metrics: [{ours}]", has_parts=False)
        self.place(
            ("study", "directions"),
            [goal],
            ("metric", "goal") if "goal" in metric else ("metric",),
            f"study.directions: [{goal}]",
            has_parts=False,
        )
        default = "" if "goal" in metric else " (W&B's default goal)"
        self.notes.append(f"metric: {name} {goal} -> study.metrics: [{ours}], directions: [{goal}]{default}")
        for key in metric:
            if key in _METRIC_KEYS_NOT_USED:
                self.notes.append(f"metric.{key}: not used ({_METRIC_KEYS_NOT_USED[key]})")
            elif key not in ("name", "goal"):
                self.fail(
                    ("metric", key),
                    f"unknown metric key '{key}'; expected name, goal, {', '.join(_METRIC_KEYS_NOT_USED)}",
                )

    def name(self, name: Any) -> None:
        if name is not None:
            self.place(("study", "name"), name, ("name",), "study.name")
            self.notes.append(f"name: {name} -> study.name")

    def run_cap(self, cap: Any) -> None:
        if cap is None:
            if "budget" not in self.sweep:
                self.notes.append("run_cap: not given -> budget.n_trials: 32, the hfta-nas default (or --n-trials)")
            return
        self.place(("budget", "n_trials"), cap, ("run_cap",), "budget.n_trials")
        self.notes.append(f"run_cap: {cap} -> budget.n_trials: {cap}")

    def early_terminate(self, rule: Any) -> None:
        if rule is None:
            if "pruner" not in self.sweep:
                self.place(("pruner",), "none", (), "pruner: none")
                self.notes.append("early_terminate: not given -> pruner: none (no run is stopped early)")
            return
        if not isinstance(rule, dict) or rule.get("type") != "hyperband":
            self.fail(("early_terminate",), f"expected {{type: hyperband, ...}}, got {short(rule)}")
            return
        kwargs = {}
        for theirs, ours in (("min_iter", "min_resource"), ("max_iter", "max_resource"), ("eta", "reduction_factor")):
            if theirs in rule:
                kwargs[ours] = rule[theirs]
        first_band = _first_band(rule)
        if first_band is not None:
            kwargs["min_resource"] = first_band
        self.place(
            ("pruner",),
            {"name": "hyperband", "kwargs": kwargs},
            ("early_terminate",),
            "pruner: hyperband",
            has_parts=False,
        )
        mapped = ", ".join(f"{k}: {v}" for k, v in kwargs.items())
        self.notes.append(
            f"early_terminate: hyperband -> pruner: hyperband ({mapped or 'its defaults'}; a step is an epoch)"
        )
        for key in rule:
            if key == "s" and first_band is not None:
                self.notes.append(
                    f"early_terminate.s: {rule['s']} -> min_resource: {first_band} (W&B's first band, "
                    "max_iter / eta^s epochs; Optuna's HyperbandPruner makes its brackets from there up)"
                )
            elif key in ("s", "strict"):
                self.notes.append(
                    f"early_terminate.{key}: not used (Optuna's HyperbandPruner makes its brackets from "
                    "min_resource, max_resource and reduction_factor; its first bracket starts at epoch "
                    f"{kwargs.get('min_resource', 1)}, where W&B's may start later)"
                )
            elif key not in ("type", "min_iter", "max_iter", "eta"):
                self.fail(
                    ("early_terminate", key),
                    f"unknown early_terminate key '{key}'; expected type, min_iter, max_iter, eta, s, strict",
                )

    # ------------------------------------------------------------ parameters
    def parameters(self, block: dict[str, Any], theirs: Loc, prefix: tuple[str, ...]) -> None:
        for name, spec in block.items():
            loc = (*theirs, name)
            if isinstance(spec, dict) and "parameters" in spec:
                if not isinstance(spec["parameters"], dict):
                    self.fail((*loc, "parameters"), f"expected a mapping, got {short(spec['parameters'])}")
                else:
                    self.parameters(spec["parameters"], (*loc, "parameters"), (*prefix, str(name)))
                continue
            dotted = ".".join((*prefix, str(name)))
            path = our_path(dotted)
            value, how = self.distribution(spec, loc)
            if how is None:
                continue
            if how == "fixed":
                in_section = path.split(".")[0] in _SECTION_ONLY_ROOTS or path in _SECTION_ONLY
                self.place(tuple(path.split(".")) if in_section else ("params", path), value, loc, path)
                self.notes.append(f"parameters.{dotted}: value {short(value, 40)} -> {path} (fixed)")
            else:
                self.place(("params", path), value, loc, f"params '{path}'")
                self.notes.append(f"parameters.{dotted}: {how} -> params.{path}")

    def distribution(self, spec: Any, loc: Loc) -> tuple[Any, str | None]:
        """(our param value, how it was read) or (None, None) after a problem."""
        if not isinstance(spec, dict):
            return spec, "fixed"
        kind = spec.get("distribution")
        if "probabilities" in spec:
            self.fail(
                (*loc, "probabilities"),
                "weighted choices are not supported (Optuna samples categorical "
                "choices without weights); remove 'probabilities'",
            )
            return None, None
        if kind in _UNSUPPORTED:
            self.fail(
                (*loc, "distribution"),
                f"distribution '{kind}' is not supported (Optuna samples bounded "
                "ranges); use uniform, log_uniform_values or int_uniform over min..max",
            )
            return None, None
        if "value" in spec or kind == "constant":
            return spec.get("value"), "fixed"
        if "values" in spec or kind == "categorical":
            return {"distribution": "categorical", "values": spec.get("values")}, "categorical"
        if "min" not in spec or "max" not in spec:
            self.fail(loc, "expected 'value', 'values', or 'min' and 'max' (with an optional 'distribution')")
            return None, None
        low, high, step = spec["min"], spec["max"], spec.get("q")
        if kind == "q_uniform" and step is None:
            step = 1  # W&B's default q: whole numbers
        if kind is None:
            kind = (
                "int_uniform" if all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)) else "uniform"
            )
        if kind == "log_uniform":  # W&B's bounds are natural-log exponents here
            try:
                exponents, (low, high) = (low, high), (math.exp(low), math.exp(high))
            except (TypeError, OverflowError):
                self.fail(loc, f"log_uniform takes exponents: expected numbers, got {short(low)} and {short(high)}")
                return None, None
            if _value_like(*exponents):
                self.warn(
                    (*loc, "distribution"),
                    f"log_uniform takes natural-log exponents: min {exponents[0]:g}, max {exponents[1]:g} give "
                    f"values in [{low:.6g}, {high:.6g}]; for values in [{exponents[0]:g}, {exponents[1]:g}] write "
                    "distribution: log_uniform_values",
                )
            return {"distribution": "log_uniform", "min": low, "max": high}, "log_uniform (exp(min)..exp(max))"
        ours = {
            "int_uniform": "int_uniform",
            "uniform": "uniform",
            "q_uniform": "uniform",
            "log_uniform_values": "log_uniform",
        }.get(kind)
        if ours is None:
            self.fail(
                (*loc, "distribution"),
                f"unknown distribution {short(kind)}; expected one of constant, "
                "categorical, int_uniform, uniform, q_uniform, log_uniform, "
                "log_uniform_values",
            )
            return None, None
        value = {"distribution": ours, "min": low, "max": high}
        if step is not None:
            value["step"] = step
        how = ours if kind == ours else f"{kind} -> {ours}"
        default_q = " (W&B's default q)" if kind == "q_uniform" and "q" not in spec else ""
        return value, how + (f" with step {step} from min{default_q}" if step is not None else "")


def _value_like(low: float, high: float) -> bool:
    """Whether log_uniform's bounds look like the values meant rather than exponents: both in (0, 1]
    and a decade or more apart (1e-5..1e-2, a learning rate's range), which as exponents sample
    only [1.00001, 1.01]. Exponents meant as such are mostly negative (-9.2..-2.3 for that range)."""
    return 0 < low < high <= 1 and high / low >= 10


def _first_band(rule: dict[str, Any]) -> int | None:
    """The epoch of W&B's first hyperband band when the rule gives max_iter and s but no min_iter:
    W&B puts its bands at max_iter / eta, max_iter / eta^2, ... (s of them, whole epochs, at least
    1; eta 3 unless given). None when the rule says no such thing or its numbers are not numbers."""
    if "min_iter" in rule or "max_iter" not in rule or "s" not in rule:
        return None
    max_iter, s, eta = rule["max_iter"], rule["s"], rule.get("eta", 3)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (max_iter, s, eta)) or eta <= 1:
        return None  # our own checks of the pruner's kwargs then name the bad number
    bands = [int(max_iter / eta**i) for i in range(1, int(s) + 1) if max_iter / eta**i >= 1]
    return min(bands) if bands else None


def our_path(dotted: str) -> str:
    """The setting a sweep parameter name stands for (see the module docstring)."""
    if dotted in _NAMES:
        return _NAMES[dotted]
    first, _, rest = dotted.partition(".")
    if first in _OUR_ROOTS or first in _SECTION_ONLY_ROOTS:
        return dotted
    if rest and first in _PREFIXES:
        return f"{_PREFIXES[first]}.{rest}"
    return f"model.config.{dotted}"


def translate_sweep(data: dict[str, Any], where: Where) -> Translated:
    """`data` (a parsed sweep file) in our layout; `SpaceError` at the sweep's lines for what cannot be read."""
    nested = set(data) == {"sweep"}
    if nested:  # a sweep nested under `sweep:` (as some configs keep it): its lines, without the prefix
        data = data["sweep"]
        where = Where(where.source, {loc[1:]: line for loc, line in where.lines.items() if loc[:1] == ("sweep",)})
    translation = _Translation(data, where)
    if nested:
        translation.notes.append("sweep: the sweep file nested under it is read")
    translation.run()
    if translation.problems:
        raise SpaceError(sorted(translation.problems, key=lambda p: p.line or 0))
    lines = {**translation.lines, (): where.line(()) or 1}
    # Problems found later name the sweep's keys (their lines) or, for added defaults, ours.
    sweep_where = _SweepWhere(where.source, {**where.lines, **lines}, translation.origins)
    return Translated(translation.out, lines, sweep_where, translation.notes)
