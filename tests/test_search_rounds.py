"""How a search fills its arrays: rounds that wait for fuller arrays, refills that ask
until a trial fits, and a sampler order that a fixed seed reproduces."""

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


def test_arrays_start_full_enough_while_trials_can_still_be_asked(tmp_path):
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
    full_enough = [len(e.trials) >= _optimize.TARGET_OCCUPANCY * size for e in started]
    # only the last arrays of the budget (nothing left to ask) may start under the target
    assert all(full_enough[: len(full_enough) - 2]), [len(e.trials) for e in started]


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


def test_a_rerun_proposes_new_parameters(tmp_path):
    """The sampler of a re-run (trials already stored) is seeded apart from the first run's, so it
    does not propose the parameters already tried again (a continuous lr: all distinct); a fresh
    study keeps the space's seed (reproducible)."""
    from search_spaces import sampler_seed
    from tests.test_search import load_study, search, space_text

    text = space_text(budget={"n_trials": 4}, sampler={"name": "random"})
    search(tmp_path, text)
    search(tmp_path, text, n_trials=8)  # a re-run of the same command, 4 more trials
    search(tmp_path, text, n_trials=12)  # and another
    rates = _learning_rates(load_study(tmp_path))
    assert len(rates) == 12 and len(set(rates)) == 12
    assert sampler_seed(7, 0) == 7 and len({sampler_seed(7, 4), sampler_seed(7, 8), 7}) == 3
