"""How a search fills its arrays: rounds that grow until an array is full enough and then
train every array in ask order, refills that ask until a trial fits, and a sampler order that
a fixed seed reproduces."""

import optuna

import hfta_nas
from hfta_nas.data import load_dataset
from hfta_nas.models import model_factory
from hfta_nas.search import ArrayStarted, StepCost, _optimize

optuna.logging.set_verbosity(optuna.logging.WARNING)
ARITHMETIC_BOUND = StepCost(0.0, 1.0)  # padding costs what it computes: unequal shapes split


def _build(digits, widths=(8, 16, 32, 64)):
    def build(trial):
        width = trial.suggest_categorical("width", list(widths))
        lr = trial.suggest_float("lr", 1e-3, 3e-2, log=True)
        model = model_factory("mlp", {"depth": 1, "width": width}, input_shape=digits.input_shape, num_classes=10)
        return hfta_nas.Candidate(model, hparams={"lr": lr}, epochs=2, batch_size=256)

    return build


def _study(seed=0, pruner=None):
    return optuna.create_study(
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=4),
        pruner=pruner or optuna.pruners.NopPruner(),
    )


def test_a_round_grows_until_an_array_is_full_enough_then_trains_every_array_in_ask_order(tmp_path):
    digits = load_dataset("digits")
    started = []
    summary = hfta_nas.optimize(
        _study(),
        _build(digits, widths=(8, 64)),
        digits,
        n_trials=24,
        array_size=4,
        seed=1,
        step_cost=ARITHMETIC_BOUND,
        on_event=lambda e: isinstance(e, ArrayStarted) and started.append(e),
    )
    assert summary.trials == {"COMPLETE": 24}
    size = 4
    assert any(len(e.trials) >= _optimize.TARGET_OCCUPANCY * size for e in started)  # the pool grew to fill one
    # no array waits for a later round: a trial asked earlier never starts after one asked later, so the
    # sampler draws each later trial with the earlier ones training or done, as study.optimize does
    first_trials = [min(e.trials) for e in started]
    assert first_trials == sorted(first_trials), [sorted(e.trials) for e in started]


def test_every_proposal_trains_even_when_its_array_never_fills(tmp_path):
    digits = load_dataset("digits")
    # four widths, arithmetic-bound: the policy keeps shapes apart, so arrays of 4 rarely fill
    summary = hfta_nas.optimize(
        _study(), _build(digits), digits, n_trials=10, array_size=4, seed=1, step_cost=ARITHMETIC_BOUND
    )
    assert summary.trials == {"COMPLETE": 10}  # none left waiting for a fuller array


def test_a_fixed_seed_gives_the_same_trials_with_refills(tmp_path):
    digits = load_dataset("digits")

    def run():
        study = _study(seed=5, pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0))
        hfta_nas.optimize(study, _build(digits), digits, n_trials=14, array_size=4, seed=3, step_cost=ARITHMETIC_BOUND)
        return [
            (t.number, t.state, t.params, t.intermediate_values, t.values) for t in study.get_trials(deepcopy=False)
        ]

    first, second = run(), run()
    assert first == second
    assert any(t[1] == optuna.trial.TrialState.PRUNED for t in first)  # slots were freed and refilled


def _learning_rates(study):
    return [t.params["training.optimizer.lr"] for t in study.get_trials(deepcopy=False)]


def test_a_rerun_proposes_new_parameters_and_a_fresh_study_repeats_itself(tmp_path):
    """Trial k's sampler is seeded from (the space's seed, k): a re-run (trials already stored) asks
    new numbers, so it does not propose the parameters already tried again (a continuous lr: all
    distinct), and the same search on a fresh study proposes the same parameters (reproducible)."""
    from tests.test_search import load_study, search, space_text

    text = space_text(budget={"n_trials": 4}, sampler={"name": "random"})
    search(tmp_path, text)
    search(tmp_path, text, n_trials=8)  # a re-run of the same command, 4 more trials
    search(tmp_path, text, n_trials=12)  # and another
    rates = _learning_rates(load_study(tmp_path))
    assert len(rates) == 12 and len(set(rates)) == 12
    again = tmp_path / "again"
    again.mkdir()
    search(again, text, n_trials=12)
    assert _learning_rates(load_study(again)) == rates


def test_trial_k_draws_the_same_whichever_sampler_asks_it():
    """Two samplers on one study (two workers) asking in turn draw trial k's stream, not their own:
    the parameters are those of one sampler asking every trial, and all distinct."""
    from hfta_nas.search_spaces import parse_space
    from tests.test_search import space_text

    space = parse_space(space_text(sampler={"name": "tpe", "kwargs": {"n_startup_trials": 8}}), "space.yaml")
    lr = optuna.distributions.FloatDistribution(1e-3, 3e-2, log=True)

    def asked(samplers):
        study = optuna.create_study(direction="maximize")
        rates = []
        for number in range(8):
            study.sampler = samplers[number % len(samplers)]
            trial = study.ask({"lr": lr})
            rates.append(trial.params["lr"])
            study.tell(trial, 0.5)
        return rates

    two_workers = asked([space.make_sampler(), space.make_sampler()])
    assert two_workers == asked([space.make_sampler()]) and len(set(two_workers)) == 8


def test_three_workers_train_as_many_distinct_parameter_sets_as_trials(tmp_path):
    """`--workers 3` on one study: each trial drew from its own stream, so no parameter set is
    trained twice (before, workers seeded alike proposed the same values at the same time)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.test_search import load_study, space_text

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "space.yaml").write_text(space_text(budget={"n_trials": 6}, training={"epochs": 1}))
    done = subprocess.run(
        [sys.executable, "-m", "hfta_nas.cli", "search", "space.yaml", "--workers", "3", "--quiet"]
        + ["--storage", str(tmp_path / "study.journal"), "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    trials = [t for t in load_study(tmp_path).get_trials(deepcopy=False) if t.state.is_finished()]
    assert len(trials) == 6 and len({tuple(sorted(t.params.items())) for t in trials}) == 6


def _finished_before(trials, trial, states):
    return sum(t.state in states and t.datetime_complete <= trial.datetime_start for t in trials)


def test_no_trial_past_the_samplers_random_start_is_asked_before_that_many_have_finished(tmp_path):
    """TPE draws at random until n_startup_trials trials have finished (complete or pruned): a trial asked
    earlier to fill an array, or a slot, would spend one of its guided draws at random. With a random
    sampler every draw is at random, and a round grows to fill its arrays as before."""
    digits = load_dataset("digits")
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    tpe = _study()  # n_startup_trials=4
    options = {"n_trials": 12, "array_size": 4, "seed": 1, "step_cost": ARITHMETIC_BOUND}
    hfta_nas.optimize(tpe, _build(digits), digits, **options)  # four widths apart: rounds grow to fill arrays
    trials = tpe.get_trials()
    assert all(_finished_before(trials, t, states) >= 4 for t in trials[4:])
    random = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    hfta_nas.optimize(random, _build(digits), digits, **options)
    trials = random.get_trials()
    assert any(_finished_before(trials, t, states) < 4 for t in trials[4:])  # grown before any finished
