"""A sampler whose randomness for trial k comes from (the space's seed, k).

Several workers on one study, or a re-run after a stop, each hold a sampler of
their own. Seeded alike, they draw alike: two workers proposed the same
parameters for the trials they asked at the same time, and a re-run proposed
its first run's parameters again. Seeded by the trial's number instead, every
trial draws from a stream of its own, whichever worker or run asks it, so
parallel workers explore different points, a re-run continues where the study
is, and one worker's search stays reproducible: trial k of a fresh study gets
the same stream every time. (Model-based samplers still read the whole study's
history, which depends on when trials finish.)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

_KEPT = 64  # samplers of trials asked and not yet finished that one process holds at once (arrays ask many)


def trial_sampler_seed(seed: int | None, number: int) -> int | None:
    """The seed of trial `number`'s sampler in a space seeded `seed` (None: unseeded, drawn afresh)."""
    return None if seed is None else int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


class TrialSeededSampler(BaseSampler):
    """Delegates every call about trial k to `make(trial_sampler_seed(seed, k))`, made once per trial.

    `kind` is one sampler `make` builds (the class and settings every trial's sampler has)."""

    def __init__(self, make: Callable[[int | None], BaseSampler], seed: int | None) -> None:
        self._make, self._seed = make, seed
        self.kind = make(seed)
        self._by_trial: OrderedDict[int, BaseSampler] = OrderedDict()

    def _of(self, trial: FrozenTrial) -> BaseSampler:
        sampler = self._by_trial.get(trial.number)
        if sampler is None:
            sampler = self._make(trial_sampler_seed(self._seed, trial.number))
            self._by_trial[trial.number] = sampler
            while len(self._by_trial) > _KEPT:
                self._by_trial.popitem(last=False)
        return sampler

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self._of(trial).infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self._of(trial).sample_relative(study, trial, search_space)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self._of(trial).sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._of(trial).before_trial(study, trial)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: list[float] | None
    ) -> None:
        self._of(trial).after_trial(study, trial, state, values)
        self._by_trial.pop(trial.number, None)

    def reseed_rng(self) -> None:
        """Nothing to reseed: each trial's stream is fixed by the space's seed and the trial's number."""
