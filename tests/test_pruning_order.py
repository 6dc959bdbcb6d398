"""A search's pruner judges each trial against the trials asked before it, as study.optimize's
one-trial-at-a-time loop does (hfta_nas/search/_pruning.py): a trial asked first and trained
late is not pruned by trials asked after it."""

import optuna
import pytest

from hfta_nas.search._pruning import AskedBefore, should_prune

PRUNERS = {
    "median": lambda: optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
    "percentile": lambda: optuna.pruners.PercentilePruner(50.0, n_startup_trials=2),
    "successive_halving": lambda: optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=2),
    "hyperband": lambda: optuna.pruners.HyperbandPruner(min_resource=1, max_resource=4, reduction_factor=2),
    "patient": lambda: optuna.pruners.PatientPruner(optuna.pruners.MedianPruner(n_startup_trials=2), patience=0),
}


def _finished(study, trial, values):
    for step, value in enumerate(values):
        trial.report(value, step)
    study.tell(trial, values[-1])


def test_a_trial_asked_first_is_judged_by_no_later_trial_as_plain_optuna_judges_it():
    study = optuna.create_study(direction="maximize", pruner=PRUNERS["median"]())
    first, second, third = study.ask(), study.ask(), study.ask()
    _finished(study, second, [0.9, 0.95])  # trials asked after `first` complete before it trains
    _finished(study, third, [0.8, 0.9])
    first.report(0.1, 0)
    assert first.should_prune()  # Optuna's own view: two completed trials, first is below their median
    assert not should_prune(first)  # plain Optuna trains trial 0 first: nothing to compare it with
    fourth = study.ask()
    fourth.report(0.1, 0)
    assert should_prune(fourth) and fourth.should_prune()  # trials asked before it: the same view


@pytest.mark.parametrize("name", PRUNERS)
def test_every_optuna_pruner_runs_on_the_earlier_trials_view(name):
    study = optuna.create_study(direction="minimize", pruner=PRUNERS[name]())
    trials = [study.ask() for _ in range(6)]
    for trial, values in zip(trials[1:5], ([1.0, 0.9], [0.8, 0.7], [0.5, 0.4], [0.6, 0.5])):
        _finished(study, trial, values)
    late = trials[5]
    late.report(5.0, 0)
    late.report(5.0, 1)
    assert should_prune(late) == late.should_prune()  # asked last: every other trial is earlier
    trials[0].report(5.0, 0)
    assert not should_prune(trials[0])  # no trial was asked before it
    view = AskedBefore(study, 3)
    assert [t.number for t in view.get_trials(deepcopy=False)] == [0, 1, 2]
    assert view.direction == study.direction and view.trials == view.get_trials()
