"""`hfta_nas.optimize(study, build, data)`: the Python core under the YAML front-end.

The same space written as a YAML file and as a `build(trial)` function gives the
same trials for the same seed; a freed slot takes a trial of another
architecture that fits the array; the example runs in its tiny mode.
"""

import math

import optuna
import pytest
import torch
import torch.utils.checkpoint
from optuna.trial import TrialState
from torch import nn

import hfta_nas
from hfta_nas.data import load_dataset
from hfta_nas.models import model_factory
from hfta_nas.search import StepCost, trial_seeds
from hfta_nas.search_spaces import parse_space, run_search
from tests.test_search import space_text

optuna.logging.set_verbosity(optuna.logging.WARNING)
COST = {"fixed_s": 1e-3, "per_gmac_s": 0.1}  # pinned: both runs pack alike whatever this machine measures


def test_the_same_space_as_yaml_and_as_python_gives_the_same_trials(tmp_path):
    text = space_text(array={"size": 3, "step_cost": COST}, pruner={"name": "median"})
    run_search(
        parse_space(text, source=str(tmp_path / "space.yaml")),
        storage=str(tmp_path / "yaml.journal"),
        out_dir=tmp_path / "out",
    )
    from_yaml = optuna.load_study(
        study_name="tiny", storage=hfta_nas.search.open_storage(str(tmp_path / "yaml.journal"))[0]
    )

    digits = load_dataset("digits")

    def build(trial):  # the file's params in its order (yaml.safe_dump sorted them)
        width = trial.suggest_categorical("model.config.width", [16, 32])
        lr = trial.suggest_float("training.optimizer.lr", 1e-3, 3e-2, log=True)
        model = model_factory("mlp", {"depth": 1, "width": width}, input_shape=digits.input_shape, num_classes=10)
        return hfta_nas.Candidate(model, hparams={"lr": lr}, epochs=2, batch_size=64)

    # the sampler a space file gets: trial k's TPE seeded from (7, k)
    sampler = hfta_nas.search.TrialSeededSampler(
        lambda seed: optuna.samplers.TPESampler(seed=seed, n_startup_trials=2, constant_liar=True, multivariate=True), 7
    )
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=optuna.pruners.MedianPruner())
    summary = hfta_nas.optimize(study, build, digits, n_trials=6, array_size=3, seed=7, step_cost=StepCost(**COST))
    assert sum(summary.trials.values()) == 6  # every trial trained and told (the median pruner may stop one)

    def described(s):
        return [(t.number, t.state, t.params, t.intermediate_values, t.values) for t in s.get_trials(deepcopy=False)]

    assert described(study) == described(from_yaml)


class PruneTrialZero(optuna.pruners.BasePruner):
    def prune(self, study, trial):
        return trial.number == 0


def test_a_freed_slot_takes_a_trial_of_another_architecture_that_fits(tmp_path):
    digits = load_dataset("digits")

    def build(trial):  # two wide trials of different widths (an envelope), then narrow ones that fit it
        if trial.number < 2:
            width = trial.suggest_int(f"width{trial.number}", 32 - 8 * trial.number, 32 - 8 * trial.number)
        else:
            width = trial.suggest_int("narrow", 8, 16, step=8)
        model = model_factory("mlp", {"depth": 1, "width": width}, input_shape=digits.input_shape, num_classes=10)
        return hfta_nas.Candidate(model, hparams={"lr": 3e-3}, epochs=3, batch_size=64)

    study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0), pruner=PruneTrialZero()
    )
    summary = hfta_nas.optimize(
        study, build, digits, n_trials=3, array_size=2, seed=5, dtype="float64", step_cost=StepCost(1.0, 0.0)
    )  # launch-bound: one array of two
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.PRUNED, TrialState.COMPLETE, TrialState.COMPLETE]
    refill = trials[2]
    assert (
        refill.user_attrs["refilled_after"] == 0 and refill.user_attrs["array_id"] == trials[0].user_attrs["array_id"]
    )
    assert refill.user_attrs["architecture"] != trials[0].user_attrs["architecture"]
    assert len(summary.arrays) == 1 and summary.architectures_trained == summary.architectures_proposed == 3
    # the narrow model padded into the wide slot trains exactly as it trains alone
    seeds = trial_seeds(5, 2)
    alone = hfta_nas.train(
        "mlp",
        model_config={"depth": 1, "width": refill.params["narrow"]},
        dataset="digits",
        seeds=[seeds["init"]],
        data_seeds=[seeds["data"]],
        dropout_seeds=[seeds["dropout"]],
        optimizer="adam",
        hparams={"lr": 3e-3},
        epochs=3,
        batch_size=64,
        dtype="float64",
    )
    assert refill.value == pytest.approx(alone.results[0].final["val_acc"], abs=1e-12)


def test_the_define_by_run_example_runs_in_its_tiny_mode():
    from examples.define_by_run import main

    summary = main(["--tiny"])
    assert summary.trials == {"COMPLETE": 4}
    assert summary.architectures_trained == summary.architectures_proposed >= 2


def test_build_errors_are_one_clear_line_and_leave_nothing_running():
    study = optuna.create_study()

    def build(trial):
        trial.suggest_float("x", 0, 1)
        return "not a candidate"

    with pytest.raises(hfta_nas.HftaNasError, match="must return a hfta_nas.Candidate, got str"):
        hfta_nas.optimize(study, build, load_dataset("digits"), n_trials=2, array_size=2)
    assert all(t.state == TrialState.FAIL for t in study.trials)


class PruneTrialOneAtItsFirstEpoch(optuna.pruners.BasePruner):
    def prune(self, study, trial):
        return trial.number == 1 and trial.last_step == 1


def test_a_stopped_array_whose_slot_was_refilled_continues_with_its_envelope_rebuilt(tmp_path, every_epoch_checkpoints):
    """Trial 1 is pruned after epoch 1 and its slot refilled; Ctrl-C in epoch 3; the re-run
    rebuilds the array from its first occupants (trial 1's model from its stored parameters, for
    the envelope of widths 16/24/32), refills it as it was and continues to the values of a
    search never stopped."""
    digits = load_dataset("digits")

    def build(trial):
        width = trial.suggest_int("width", 16, 32, step=8)
        lr = trial.suggest_float("lr", 1e-3, 3e-2, log=True)
        model = model_factory("mlp", {"depth": 1, "width": width}, input_shape=digits.input_shape, num_classes=10)
        return hfta_nas.Candidate(model, hparams={"lr": lr}, epochs=4, batch_size=64)

    def run(folder, on_event=None):
        storage = hfta_nas.search.open_storage(str(folder / "s.journal"))[0]
        study = optuna.create_study(
            study_name="s",
            storage=storage,
            direction="maximize",
            load_if_exists=True,
            sampler=optuna.samplers.RandomSampler(seed=3),
            pruner=PruneTrialOneAtItsFirstEpoch(),
        )
        hfta_nas.optimize(
            study, build, digits, n_trials=5, array_size=3, seed=7, step_cost=StepCost(**COST), on_event=on_event
        )
        return {t.number: t for t in study.get_trials(deepcopy=False)}

    reference = run(tmp_path / "ref")
    assert [reference[n].params["width"] for n in (0, 1, 2)] == [24, 16, 32]  # one array, an envelope

    def stop(event):
        if isinstance(event, hfta_nas.search.EpochEnded) and event.array == 1 and event.epoch == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, stop)
    events = []
    trials = run(tmp_path, events.append)
    (resumed,) = [e for e in events if isinstance(e, hfta_nas.search.ArrayResumed)]
    assert resumed.epoch == 2 and len(resumed.trials) == 3
    assert trials[1].state == TrialState.PRUNED  # ended before the stop: rebuilt, not retrained
    for number in resumed.trials:
        original = reference[trials[number].user_attrs["retry_of"]]
        assert trials[number].params == original.params
        assert (trials[number].values, trials[number].intermediate_values) == (
            original.values,
            original.intermediate_values,
        )
    assert {reference[trials[n].user_attrs["retry_of"]].number for n in resumed.trials} == {0, 2, 3}


class CentredUnits(nn.Module):
    """Subtracts the mean over its hidden units: padded into a wider envelope, that mean also counts the
    padding's zeros, so the array's first-call check refuses every narrower slot's place (not the model)."""

    def __init__(self, width, inputs, classes):
        super().__init__()
        self.fc, self.out = nn.Linear(inputs, width), nn.Linear(width, classes)

    def forward(self, x):
        h = self.fc(x.flatten(1))
        return self.out(torch.relu(h - h.mean(-1, keepdim=True)))


def test_a_refused_slot_trains_apart_and_the_search_goes_on():
    """One candidate whose place in its array fails the check never ends the search nor fails its
    array-mates: the refused ones train again in arrays of their own, and say so."""
    digits = load_dataset("digits")
    widths = [32, 16, 32, 24]

    def build(trial):
        width = widths[trial.number]  # by number (a parameter's choices may not change between trials)
        model = lambda: CentredUnits(width, math.prod(digits.input_shape), 10)  # noqa: E731
        return hfta_nas.Candidate(model, hparams={"lr": 3e-3}, epochs=2, batch_size=64)

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    events = []
    summary = hfta_nas.optimize(
        study, build, digits, n_trials=4, array_size=4, seed=5, step_cost=StepCost(1.0, 0.0), on_event=events.append
    )  # launch-bound: the four in one array first
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    assert sorted(summary.trained_apart) == [1, 3]
    for number in (1, 3):
        attribute = trials[number].user_attrs["trained_apart"]
        assert attribute.startswith("array ") and "differs from its own model in the envelope" in attribute
        assert attribute == summary.trained_apart[number]
        others = [t.number for t in trials if t.user_attrs["array_id"] == trials[number].user_attrs["array_id"]]
        assert others == [number]  # it trained alone
    refusals = [e for e in events if isinstance(e, hfta_nas.search.ArrayRefused)]
    assert [r.refused for r in refusals] == [[1], [3]]
    assert trials[0].user_attrs["array_id"] == trials[2].user_attrs["array_id"]  # the equal ones share one still


def test_a_model_refused_even_alone_fails_its_trial_only():
    """A refusal of the model itself (here: activation checkpointing) fails its trials, one line each;
    the search ends normally."""
    digits = load_dataset("digits")

    class Checkpointed(CentredUnits):
        def forward(self, x):
            return self.out(torch.utils.checkpoint.checkpoint(self.fc, x.flatten(1), use_reentrant=False))

    def build(trial):
        kind = Checkpointed if trial.number == 1 else CentredUnits
        model = lambda: kind(16, math.prod(digits.input_shape), 10)  # noqa: E731
        return hfta_nas.Candidate(model, hparams={"lr": 3e-3}, epochs=1, batch_size=64)

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    summary = hfta_nas.optimize(study, build, digits, n_trials=3, array_size=4, seed=5, step_cost=StepCost(1.0, 0.0))
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert "torch.utils.checkpoint" in trials[1].user_attrs["fail_reason"] and 1 in summary.trained_apart


def test_optuna_callbacks_and_constraints_work_as_in_study_optimize():
    """`callbacks=` are called as study.optimize calls them (study, a frozen copy of each told trial), and
    `study.stop()` in one (Optuna's MaxTrialsCallback) stops asking; `constraints=` sets each completed
    trial's constraints from its measured metrics before it is told, where constraint-aware samplers read them."""
    digits = load_dataset("digits")
    limit = 1500  # parameters: width 16 fits (1210), width 32 does not (2410)

    def build(trial):
        width = trial.suggest_categorical("width", [16, 32])
        model = lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))  # noqa: E731
        return hfta_nas.Candidate(model, hparams={"lr": 3e-3}, epochs=1, batch_size=64)

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=2))
    seen = []

    def record(study_seen, frozen):
        assert study_seen is study and isinstance(frozen, optuna.trial.FrozenTrial)
        seen.append((frozen.number, frozen.state, dict(frozen.system_attrs)))

    stop_at_3 = optuna.study.MaxTrialsCallback(3, states=(TrialState.COMPLETE,))
    hfta_nas.optimize(
        study, build, digits, n_trials=8, array_size=1, seed=5, step_cost=StepCost(1.0, 0.0),
        callbacks=[record, stop_at_3], constraints=lambda metrics: {"size": metrics["params"] - limit},
    )  # fmt: skip
    trials = study.get_trials(deepcopy=False)
    told = [(t.number, t.state) for t in trials if t.state != TrialState.FAIL]
    assert sorted(n for n, _, _ in seen) == sorted(n for n, _ in told) and len(seen) == 3  # as optimize would
    for trial in trials:
        params = trial.user_attrs["final_metrics"]["params"]
        assert params == (1210 if trial.params["width"] == 16 else 2410)
        assert trial.system_attrs["constraints:size"] == params - limit  # Optuna's record of set_constraint
    assert all("constraints:size" in attrs for _, _, attrs in seen)  # set before the trial was told
