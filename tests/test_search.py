"""The search against Optuna: every trial told and trained as proposed, results
equal to training the same candidate alone, resume and retry."""

import collections
import json
import time

import optuna
import pytest
import torch
import yaml
from click.testing import CliRunner
from optuna.trial import TrialState

import hfta_nas
from hfta_nas.cli import main
from hfta_nas.search import open_storage, study_text, trial_seeds
from hfta_nas.search_spaces import parse_space, run_search

optuna.logging.set_verbosity(optuna.logging.WARNING)


def space_text(**overrides):
    space = {
        "study": {"name": "tiny", "metrics": ["val_acc"]},
        "sampler": {"name": "tpe", "kwargs": {"n_startup_trials": 2}},
        "pruner": {"name": "none"},
        "budget": {"n_trials": 6},
        # a pinned cost line: the packing is the same on a busy machine (a measured one is a timing)
        "array": {"size": 3, "step_cost": {"fixed_s": 1e-4, "per_gmac_s": 0.1}},
        "data": {"dataset": "digits", "batch_size": 64},
        "training": {"epochs": 2, "optimizer": {"name": "adam", "lr": 1e-3}},
        "model": {"family": "mlp", "config": {"depth": 1}},
        "seed": 7,
        "params": {
            "training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 3e-2},
            "model.config.width": {"distribution": "categorical", "values": [16, 32]},
        },
    }
    for key, value in overrides.items():
        space[key] = value
    return yaml.safe_dump(space)


def search(tmp_path, text=None, **options):
    space = parse_space(text or space_text(), source=str(tmp_path / "space.yaml"))
    options.setdefault("storage", str(tmp_path / "study.journal"))
    options.setdefault("out_dir", tmp_path / "out")
    return run_search(space, **options)


def load_study(tmp_path, name="tiny"):
    from hfta_nas.search import open_storage

    return optuna.load_study(study_name=name, storage=open_storage(str(tmp_path / "study.journal"))[0])


def test_every_trial_is_told_with_its_attributes(tmp_path):
    summary = search(tmp_path)
    study = load_study(tmp_path)
    assert len(study.trials) == 6
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    for trial in study.trials:
        attrs = trial.user_attrs
        for key in (
            "array_id",
            "slot",
            "architecture",
            "seed_init",
            "seed_data",
            "seed_dropout",
            "epochs_run",
            "train_seconds",
            "train_start",
            "train_end",
        ):
            assert key in attrs, key
        assert attrs["epochs_run"] == 2
        assert sorted(trial.intermediate_values) == [1, 2]
        assert attrs["train_start"] <= attrs["train_end"]
    assert study.metric_names == ["val_acc"]
    # the space's text is kept with the study, out of the user attributes `optuna studies` prints
    assert "model" in study_text(study, "space_text") and "torch" in study.user_attrs["versions"]
    assert "space_text" not in study.user_attrs
    # every architecture the sampler proposed trained, in arrays of at most array.size slots
    assert (
        summary.architectures_trained
        == summary.architectures_proposed
        == len({t.params["model.config.width"] for t in study.trials})
    )
    by_array = {}
    for trial in study.trials:
        by_array.setdefault(trial.user_attrs["array_id"], []).append(trial.number)
    assert all(len(members) <= 3 for members in by_array.values())
    assert sum(a["slots"] for a in summary.arrays) == 6 and 0 < summary.mean_occupancy <= 1
    assert summary.trials == {"COMPLETE": 6} and summary.best[0]["number"] == study.best_trial.number


def test_each_trial_attribute_is_written_once(tmp_path):
    """Each user attribute is its own storage write (an fsynced append on a journal): a trial's worker is
    written when it is asked, not again when it starts training nor by the heartbeat."""
    from optuna.storages.journal._storage import JournalOperation

    search(tmp_path)
    writes = collections.Counter()
    for line in (tmp_path / "study.journal").read_text().splitlines():
        log = json.loads(line)
        if log["op_code"] == JournalOperation.SET_TRIAL_USER_ATTR:
            writes[(log["trial_id"], *log["user_attr"])] += 1
    repeated = {key: n for key, n in writes.items() if n > 1 and key[1] != "heartbeat"}  # a stamp per beat
    assert len({trial for trial, _ in writes}) == 6 and not repeated
    assert all(writes[(trial, "worker")] == writes[(trial, "worker_host")] == 1 for trial, _ in writes)


def test_a_trial_equals_its_candidate_trained_alone(tmp_path):
    search(tmp_path, dtype="float64")
    study = load_study(tmp_path)
    trial = study.trials[4]
    seeds = trial_seeds(7, trial.number)
    assert seeds == {s: trial.user_attrs[f"seed_{s}"] for s in ("init", "data", "dropout")}
    alone = hfta_nas.train(
        "mlp",
        model_config={"depth": 1, "width": trial.params["model.config.width"]},
        dataset="digits",
        seeds=[seeds["init"]],
        data_seeds=[seeds["data"]],
        dropout_seeds=[seeds["dropout"]],
        optimizer="adam",
        hparams={"lr": trial.params["training.optimizer.lr"]},
        epochs=2,
        batch_size=64,
        dtype="float64",
    )
    assert trial.value == pytest.approx(alone.results[0].final["val_acc"], abs=1e-12)
    assert trial.intermediate_values[1] == pytest.approx(alone.results[0].history[0]["val_acc"], abs=1e-12)


def test_best_trial_is_exported_as_config_and_weights(tmp_path):
    from hfta_nas.search_spaces import ResolvedConfig

    search(tmp_path)
    study = load_study(tmp_path)
    config = ResolvedConfig.from_file(tmp_path / "out" / "best_config.yaml")
    assert config.hparams["lr"] == pytest.approx(study.best_trial.params["training.optimizer.lr"])
    assert config.model_config["width"] == study.best_trial.params["model.config.width"]
    state = torch.load(tmp_path / "out" / "best_weights.pt")
    model = hfta_nas.models.build_model("mlp", config.model_config, input_shape=(1, 8, 8), num_classes=10)
    model.load_state_dict(state)


def test_rerun_resumes_and_the_budget_counts_finished_trials(tmp_path):
    search(tmp_path, n_trials=3)
    first = [(t.number, t.value) for t in load_study(tmp_path).trials]
    summary = search(tmp_path, n_trials=5)
    study = load_study(tmp_path)
    assert len(study.trials) == 5 and summary.trials == {"COMPLETE": 5}
    assert [(t.number, t.value) for t in study.trials[:3]] == first


def test_trials_left_running_by_a_killed_run_are_failed_and_retried(tmp_path):
    search(tmp_path, n_trials=2)
    study = load_study(tmp_path)
    orphan = study.ask()  # what a SIGKILL mid-array leaves behind
    orphan.suggest_float("training.optimizer.lr", 1e-3, 3e-2, log=True)
    orphan.set_user_attr("heartbeat", time.time() - 3600)  # its worker stopped beating an hour ago
    search(tmp_path, n_trials=4)
    study = load_study(tmp_path)
    states = [t.state for t in study.trials]
    assert TrialState.RUNNING not in states
    assert study.trials[orphan.number].state == TrialState.FAIL
    assert "interrupted" in study.trials[orphan.number].user_attrs["fail_reason"]
    assert sum(s == TrialState.COMPLETE for s in states) == 4  # the retry does not eat the budget
    retried = [
        t
        for t in study.trials
        if t.number > orphan.number and t.params.get("training.optimizer.lr") == orphan.params["training.optimizer.lr"]
    ]
    assert retried and retried[0].user_attrs["retry_of"] == orphan.number
    assert (
        retried[0].user_attrs["seed_init"] == trial_seeds(7, orphan.number)["init"]
    )  # it ends as the orphan would have


def test_pruned_slots_are_refilled_with_new_trials(tmp_path):
    text = space_text(
        pruner={"name": "successive_halving", "kwargs": {"min_resource": 1, "reduction_factor": 3}},
        training={"epochs": 3, "optimizer": {"name": "adam", "lr": 1e-3}},
        budget={"n_trials": 9},
    )
    summary = search(tmp_path, text)
    study = load_study(tmp_path)
    states = [t.state for t in study.trials]
    assert len(states) == 9 and TrialState.RUNNING not in states
    assert TrialState.PRUNED in states
    assert any("refilled_after" in t.user_attrs for t in study.trials)
    assert summary.trials.get("PRUNED", 0) == states.count(TrialState.PRUNED)


def test_diverging_trials_fail_with_a_reason():
    """A learning rate no model survives (1e12: past what a space file accepts, so given from Python)."""
    digits = hfta_nas.data.load_dataset("digits")

    def build(trial):
        lr = trial.suggest_categorical("lr", [1e-3, 1e12])
        factory = hfta_nas.models.model_factory(
            "mlp", {"depth": 1, "width": 16}, input_shape=digits.input_shape, num_classes=10
        )
        return hfta_nas.Candidate(factory, optimizer="sgd", hparams={"lr": lr}, epochs=2, batch_size=64)

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    hfta_nas.optimize(study, build, digits, n_trials=6, array_size=3, step_cost=hfta_nas.search.StepCost(1.0, 0.0))
    assert {t.params["lr"] for t in study.trials} == {1e-3, 1e12}
    for trial in study.trials:
        if trial.params["lr"] > 1:
            assert trial.state == TrialState.FAIL and "non-finite" in trial.user_attrs["fail_reason"]
        else:
            assert trial.state == TrialState.COMPLETE


def test_multi_objective_search_has_a_pareto_front(tmp_path):
    text = space_text(
        study={"name": "tiny", "metrics": ["val_acc", "params"], "directions": ["maximize", "minimize"]},
        sampler={"name": "nsga2", "kwargs": {"population_size": 4}},
    )
    summary = search(tmp_path, text)
    study = load_study(tmp_path)
    assert all(len(t.values) == 2 for t in study.trials)
    widths = {t.params["model.config.width"]: t.values[1] for t in study.trials}
    assert all(
        widths[w]
        == hfta_nas.models.count_parameters(
            hfta_nas.models.build_model("mlp", {"depth": 1, "width": w}, input_shape=(1, 8, 8), num_classes=10)
        )
        for w in widths
    )
    assert summary.best and all(set(b["values"]) == {"val_acc", "params"} for b in summary.best)


def test_cli_search_json_and_dashboard_hint(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(space_text(budget={"n_trials": 3}))
    result = CliRunner().invoke(
        main, ["search", str(path), "--storage", str(tmp_path / "s.journal"), "--out", str(tmp_path / "o"), "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["trials"] == {"COMPLETE": 3}
    assert summary["dashboard"] == f"optuna-dashboard {tmp_path / 's.journal'} --artifact-dir {tmp_path / 'artifacts'}"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--storage", "postgresql://nobody@127.0.0.1:1/none"], "cannot open storage"),
        (["--array-size", "many"], "expected an integer or 'auto'"),
        (["--n-trials", "0"], "n_trials must be a positive number"),
    ],
)
def test_cli_search_errors_exit_2(tmp_path, args, message):
    path = tmp_path / "space.yaml"
    path.write_text(space_text())
    result = CliRunner().invoke(main, ["search", str(path), "--storage", str(tmp_path / "s.journal"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_cli_search_bad_yaml_names_the_line(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(
        "study:\n  name: x\nparams:\n  training.optimizer.lr: {distribution: log_uniform, min: 0.1, max: 0.01}\n"
    )
    result = CliRunner().invoke(main, ["search", str(path)])
    assert result.exit_code == 2 and "space.yaml:4" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("pruner", ["none", "median"])
def test_a_search_stopped_mid_array_continues_it_from_its_checkpoint_bit_identically(
    tmp_path, every_epoch_checkpoints, pruner
):
    """Ctrl-C in epoch 3 of the second array, then the same search again: the retried trials
    take their slots from the epoch-2 checkpoint and end with the values (every epoch's, to the
    bit) that the same trials have in a search that was never stopped."""
    from hfta_nas.search import ArrayResumed, EpochEnded

    text = space_text(
        budget={"n_trials": 6},
        training={"epochs": 5, "optimizer": {"name": "adam", "lr": 1e-3}},
        pruner={"name": pruner, **({"kwargs": {"n_startup_trials": 1}} if pruner == "median" else {})},
        seed=1,  # a draw whose second array outlives the median pruner past epoch 3 (seed 7's is pruned in epoch 1)
    )
    reference = search(tmp_path / "ref", text)
    ref_trials = {
        t.number: t
        for t in optuna.load_study(
            study_name="tiny", storage=open_storage(str(tmp_path / "ref" / "study.journal"))[0]
        ).trials
    }

    def stop_in_epoch_3_of_array_2(event):
        if isinstance(event, EpochEnded) and event.array == 2 and event.epoch == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        search(tmp_path, text, on_event=stop_in_epoch_3_of_array_2)
    assert len(list((tmp_path / "checkpoints").rglob("*.pt"))) == 1

    events = []
    search(tmp_path, text, on_event=events.append)
    (resumed,) = [e for e in events if isinstance(e, ArrayResumed)]
    assert resumed.epoch == 2
    trials = optuna.load_study(study_name="tiny", storage=open_storage(str(tmp_path / "study.journal"))[0]).trials
    retries = [t for t in trials if "retry_of" in t.user_attrs and t.number in resumed.trials]
    assert retries and all(t.user_attrs["resumed_from_epoch"] == 2 for t in retries)
    for retry in retries:
        original = ref_trials[retry.user_attrs["retry_of"]]
        assert retry.params == original.params
        assert (retry.state, retry.values, retry.intermediate_values) == (
            original.state,
            original.values,
            original.intermediate_values,
        )
    assert not list((tmp_path / "checkpoints").rglob("*.pt"))  # removed when the array ended
    assert reference.trials == {"COMPLETE": 6} or pruner == "median"


def test_a_stop_between_the_tells_of_an_arrays_last_epoch_still_continues_from_the_checkpoint(
    tmp_path, every_epoch_checkpoints
):
    """Ctrl-C right after the first slot of array 1 is told COMPLETE in its last epoch: the others are
    retried, and the re-run continues the epoch-3 checkpoint with the told slot training on untold
    beside them (as it did), so the retries end with the values of a search never stopped."""
    from hfta_nas.search import ArrayResumed, TrialEnded

    text = space_text(  # a random sampler: one array of all 3 (TPE would hold its guided ask for its start's results)
        budget={"n_trials": 3},
        training={"epochs": 4, "optimizer": {"name": "adam", "lr": 1e-3}},
        sampler={"name": "random"},
    )
    search(tmp_path / "ref", text)
    reference = {
        t.number: t
        for t in optuna.load_study(
            study_name="tiny", storage=open_storage(str(tmp_path / "ref" / "study.journal"))[0]
        ).trials
    }

    def stop_after_the_first_completion(event):
        if isinstance(event, TrialEnded) and event.state == "COMPLETE":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        search(tmp_path, text, on_event=stop_after_the_first_completion)
    events = []
    search(tmp_path, text, on_event=events.append)
    (resumed,) = [e for e in events if isinstance(e, ArrayResumed)]
    assert resumed.epoch == 3 and len(resumed.trials) == 2
    trials = {t.number: t for t in load_study(tmp_path).trials}
    for number in resumed.trials:
        original = reference[trials[number].user_attrs["retry_of"]]
        assert (trials[number].values, trials[number].intermediate_values) == (
            original.values,
            original.intermediate_values,
        )
    assert sum(t.state == TrialState.COMPLETE for t in trials.values()) == 3
