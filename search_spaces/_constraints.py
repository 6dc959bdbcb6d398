"""A space file's `constraints:` block: outcome constraints on a completed trial's measured values.

    constraints:
      params: {max: 50000}      # parameter count
      latency_ms: {max: 2.0}    # ms per one-sample forward, measured for every trial
      val_loss: {max: 0.4}      # any metric a trial's last epoch measured
      train_acc: {min: 0.5}

Each bound becomes one Optuna constraint, named `<metric>.max` or `<metric>.min`, whose value is
how far the trial is past it (`value - max`, `min - value`: feasible at <= 0), set with
`trial.set_constraint` before the trial is told (`hfta_nas.optimize(constraints=...)`). Optuna's
constraint-aware samplers (TPE, NSGA-II, GP) then sample away from infeasible trials, and a
study's best trial is its best feasible one. The block judges trials; it does not make them, so
it is not part of the space's identity (another bound does not make another study).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from ._schema import ConstraintSpec, SpaceFile
from ._yaml import Loc, Where

# samplers that read trial.constraints when they sample (Optuna 5); the others only record them
AWARE_SAMPLERS = ("tpe", "nsga2", "gp")


class OutcomeConstraints:
    """`optimize`'s `constraints`: a completed trial's final metrics -> {name: value}, feasible at <= 0.
    `metrics` names what it reads (a static one such as latency_ms is then measured for every trial)."""

    def __init__(self, bounds: Mapping[str, ConstraintSpec]) -> None:
        self.bounds = dict(bounds)
        self.metrics = tuple(self.bounds)

    def __call__(self, final: Mapping[str, float]) -> dict[str, float]:
        values = {}
        for metric, bound in self.bounds.items():
            if bound.max is not None:
                values[f"{metric}.max"] = final[metric] - bound.max
            if bound.min is not None:
                values[f"{metric}.min"] = bound.min - final[metric]
        return values


def check_constraints(
    add: Callable[[Loc, str], None], file: SpaceFile, known: list[str], unknown: Callable[[str, list[str]], str]
) -> None:
    """Each bound's problems at its key: a metric no trial measures (`unknown` words it), a test
    metric, no bound, bounds that cross; and a pbt block, which samples nothing to constrain."""
    if file.constraints and file.pbt is not None:
        add(("constraints",), "a pbt population is not sampled: constraints steer a search's sampler; remove one")
    for metric, bound in file.constraints.items():
        if metric not in known:
            add(("constraints", metric), unknown(metric, known))
        elif metric.startswith("test_"):
            add(
                ("constraints", metric),
                f"a constraint on {metric} would choose models by their test score; bound a val_ or train_ metric",
            )
        if bound.max is None and bound.min is None:
            add(("constraints", metric), "give max, min or both, e.g. {max: 50000}")
        elif bound.max is not None and bound.min is not None and bound.min > bound.max:
            add(("constraints", metric), f"min {bound.min:g} is above max {bound.max:g}: no trial could be feasible")


def warn_unaware_sampler(where: Where, file: SpaceFile) -> None:
    """One warning line when the sampler records constraints but does not sample by them."""
    if file.constraints and file.sampler.name not in AWARE_SAMPLERS:
        message = (
            f"sampler '{file.sampler.name}' does not sample by constraints: each trial records them and the "
            f"best trial is the best feasible one, but only {', '.join(AWARE_SAMPLERS)} steer away from "
            "infeasible trials"
        )
        logging.getLogger("hfta_nas").warning(f"warning: {where.problem(('constraints',), message)}")
