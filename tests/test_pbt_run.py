"""`hfta_nas.pbt` end to end: each member is a trial whose attributes hold its schedule and lineage as
they happened, a stopped run resumes bit-identically, space files and the CLI run it, and bad
settings are refused in one line (located in a space file)."""

import math
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from conftest import synthetic_dataset
from torch import nn

import hfta_nas
from hfta_nas import Candidate, Explore, HftaNasError
from hfta_nas.search import PBTExploited
from hfta_nas.search_spaces import SpaceError, load_space, parse_space, pbt_notes, pbt_options

EPOCHS, POPULATION, INTERVAL = 6, 4, 2
SPACE = Path(__file__).resolve().parents[1] / "search_spaces" / "mnist1d_cnn_pbt.yaml"


def build(trial, width=16, augmentation=None):
    lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
    return Candidate(
        augmentation=augmentation,
        model=lambda: nn.Sequential(
            nn.Flatten(), nn.Linear(24, width), nn.ReLU(), nn.Dropout(0.1), nn.Linear(width, 3)
        ),
        optimizer="sgd",
        hparams={"lr": lr, "momentum": 0.9},
        schedule={"kind": "cosine", "t_max": EPOCHS},
        epochs=EPOCHS,
        batch_size=16,
    )


def study_in(path, name="pbt"):
    path.mkdir(parents=True, exist_ok=True)
    return optuna.create_study(
        direction="maximize",
        storage=f"sqlite:///{path / 'study.db'}",
        study_name=name,
        sampler=optuna.samplers.RandomSampler(seed=0),
        load_if_exists=True,
    )


LR = {"lr": Explore(1e-3, 1e-1, log=True)}
# every kind of value a slot keeps for itself: the optimizer's, the dropout rate, an augmentation's strength
EVERYTHING = {**LR, "momentum": Explore(0.5, 0.99), "dropout": Explore(0.0, 0.5), "augment.noise": Explore(0.01, 0.5)}


def build_one_diverging(trial, **options):
    candidate = build(trial, **options)
    if trial.number == 1:  # a learning rate no model survives
        candidate.hparams = {"lr": 1e12, "momentum": 0.9}
    return candidate


def run(study, out, explore=LR, builder=build, **extra):
    data = synthetic_dataset(n_train=96, dtype=torch.float64)
    augmentation = hfta_nas.data.Augmentation(noise=0.1) if "augment.noise" in explore else None
    options = dict(population=POPULATION, interval=INTERVAL, explore=explore, seed=3)
    return hfta_nas.pbt(
        study,
        lambda trial: builder(trial, augmentation=augmentation),
        data,
        dtype="float64",
        out_dir=out,
        **{**options, **extra},
    )


def test_members_are_trials_with_their_schedule_and_lineage(tmp_path):
    events = []
    study = study_in(tmp_path)
    summary = run(study, tmp_path / "out", on_event=events.append)
    trials = {t.number: t for t in study.trials}
    assert sorted(trials) == summary.trials and all(t.state.name == "COMPLETE" for t in trials.values())
    exploits = [e for e in events if isinstance(e, PBTExploited)]
    assert summary.exploits == len(exploits) == (EPOCHS // INTERVAL - 1) * 1  # 1 mover of 4 per round
    # the schedules the records should hold, rebuilt from the events alone
    slot_values = {n: [] for n in trials}
    schedules = {n: [] for n in trials}
    current = {n: trials[n].params["lr"] for n in trials}
    for epoch in range(1, EPOCHS + 1):
        for n in trials:
            slot_values[n].append(current[n])
            schedules[n].append(current[n])
        for e in (e for e in exploits if e.epoch == epoch):
            schedules[e.target] = list(schedules[e.source])
            current[e.target] = e.changes["lr"][1]
            assert e.changes["lr"][0] == current[e.source]  # copied from the source, then explored
    for n, trial in trials.items():
        assert trial.user_attrs["pbt_slot_values"]["lr"] == pytest.approx(slot_values[n], rel=1e-12)
        assert trial.user_attrs["pbt_schedule"]["lr"] == pytest.approx(schedules[n], rel=1e-12)
        lineage = [(x["epoch"], x["from_trial"]) for x in trial.user_attrs["pbt_lineage"]]
        assert lineage == [(e.epoch, e.source) for e in exploits if e.target == n]
        assert sorted(trial.intermediate_values) == list(range(1, EPOCHS + 1))
        assert trial.value == trial.intermediate_values[EPOCHS]
    best = max(trials.values(), key=lambda t: (t.value, -t.number))
    assert summary.best["number"] == best.number
    written = yaml.safe_load((tmp_path / "out" / "best_schedule.yaml").read_text())
    assert written["schedule"]["lr"] == pytest.approx(schedules[best.number], rel=1e-12)
    assert (tmp_path / "out" / "pbt.png").stat().st_size > 0 and (tmp_path / "out" / "best_weights.pt").exists()


@pytest.mark.parametrize(
    "explore,builder",
    [(LR, build), (EVERYTHING, build), (LR, build_one_diverging)],
    ids=["lr", "lr+momentum+dropout+noise", "a member diverged"],
)
def test_a_stopped_run_resumes_bit_identically(tmp_path, explore, builder):
    whole = run(study_in(tmp_path / "a"), tmp_path / "a" / "out", explore, builder)

    def stop_at_the_second_exploit(event):
        if isinstance(event, PBTExploited) and event.epoch == 2 * INTERVAL:
            raise KeyboardInterrupt

    stopped = study_in(tmp_path / "b")
    with pytest.raises(KeyboardInterrupt):
        run(stopped, tmp_path / "b" / "out", explore, builder, on_event=stop_at_the_second_exploit)
    assert {t.state.name for t in stopped.trials} - {"FAIL"} == {"RUNNING"}  # left for the next call to continue
    resumed = run(study_in(tmp_path / "b"), tmp_path / "b" / "out", explore, builder)
    assert resumed.resumed_from_epoch == 2 * INTERVAL - 1
    a, b = study_in(tmp_path / "a").trials, study_in(tmp_path / "b").trials
    for x, y in zip(a, b):
        assert (x.state, x.value, x.intermediate_values) == (y.state, y.value, y.intermediate_values)
        assert x.user_attrs["pbt_schedule"] == y.user_attrs["pbt_schedule"]
        assert x.user_attrs["pbt_lineage"] == y.user_attrs["pbt_lineage"]
    weights_a = torch.load(tmp_path / "a" / "out" / "best_weights.pt")
    weights_b = torch.load(tmp_path / "b" / "out" / "best_weights.pt")
    assert whole.best["number"] == resumed.best["number"]
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"population": 1}, "population must be an integer of at least 2"),
        ({"quantile": 0.7}, r"quantile must be in \(0, 0.5\]"),
        ({"explore": {}}, "explore names no hyper-parameter"),
        ({"explore": {"width": Explore(1, 2)}}, "cannot explore 'width'.*change the model's shapes"),
        ({"explore": {"nesterov": Explore(0, 1)}}, "cannot explore 'nesterov'"),
        ({"interval": EPOCHS}, f"interval {EPOCHS} is not below the members' {EPOCHS} epochs"),
    ],
)
def test_bad_settings_are_one_line_and_leave_no_trial_running(tmp_path, settings, message):
    study = study_in(tmp_path)
    with pytest.raises(HftaNasError, match=message) as error:
        run(study, None, **settings)
    assert "\n" not in str(error.value)
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))


def test_a_metric_other_than_the_studys_named_one_is_refused(tmp_path):
    study = study_in(tmp_path)
    study.set_metric_names(["val_acc"])
    with pytest.raises(HftaNasError, match="ranks members by 'val_loss' but the study's metric is 'val_acc'"):
        run(study, None, metric="val_loss")
    assert not study.trials


def test_explore_bounds_are_checked():
    with pytest.raises(HftaNasError, match="finite low < high"):
        Explore(1.0, 1.0)
    with pytest.raises(HftaNasError, match="log-scale explore needs low > 0"):
        Explore(0.0, 1.0, log=True)
    with pytest.raises(HftaNasError, match="factors must be positive"):
        Explore(0.1, 1.0, factors=(0.0,))


def test_members_of_different_architectures_are_refused(tmp_path):
    study = study_in(tmp_path)
    widths = iter([16, 16, 32, 16])
    with pytest.raises(HftaNasError, match="share one architecture; trials 0 and 2 build different models"):
        hfta_nas.pbt(
            study,
            lambda trial: build(trial, width=next(widths)),
            synthetic_dataset(),
            population=4,
            explore={"lr": Explore(1e-3, 1e-1, log=True)},
        )
    assert {t.state.name for t in study.trials} == {"FAIL"}


def test_a_multi_objective_study_is_refused():
    study = optuna.create_study(directions=["maximize", "minimize"])
    with pytest.raises(HftaNasError, match="ranks members by one metric"):
        hfta_nas.pbt(study, build, synthetic_dataset(), explore={"lr": Explore(1e-3, 1e-1)})


# ------------------------------------------------------------------------ space files
PBT_FILE = """\
study: {{metrics: [val_acc]}}
pbt:
  population: 4
  interval: 2
  explore:
    {explored}: {{factors: [0.8, 1.25]}}
training: {{epochs: 4, optimizer: {{name: adam, lr: 1.0e-3}}}}
params:
  training.optimizer.lr: {{distribution: log_uniform, min: 1.0e-4, max: 1.0e-2}}
{extra}"""


def pbt_file(explored="training.optimizer.lr", extra=""):
    return PBT_FILE.format(explored=explored, extra=extra)


@pytest.mark.parametrize(
    "text,line,key,message",
    [
        (pbt_file("model.config.channels"), 6, "pbt.explore.model.config.channels", "changes the model's shapes"),
        (
            pbt_file("training.optimizer.amsgrad"),
            6,
            "pbt.explore.training.optimizer.amsgrad",
            "is not a value a slot keeps for itself",
        ),
        (
            pbt_file(extra="  model.config.kernel_size: {distribution: int_uniform, min: 3, max: 7, step: 2}\n"),
            10,
            "params.model.config.kernel_size",
            "one architecture",
        ),
        (pbt_file().replace("population: 4", "population: 1"), 3, "pbt.population", "expected a value >= 2"),
        (
            pbt_file().replace("  interval: 2", "  interval: 2\n  quantle: 0.2"),
            5,
            "pbt.quantle",
            "did you mean 'quantile'",
        ),
        (pbt_file().replace("interval: 2", "interval: 4"), 4, "pbt.interval", "it would never exploit"),
        (
            pbt_file().replace("{factors: [0.8, 1.25]}", "{factors: []}"),
            6,
            "pbt.explore.training.optimizer.lr.factors",
            "at least 1 item",
        ),
    ],
)
def test_bad_pbt_blocks_are_located(text, line, key, message):
    with pytest.raises(SpaceError) as error:
        parse_space(text, "space.yaml")
    problem = error.value.problems[0]
    assert (problem.key, message in problem.message) == (key, True), problem
    assert problem.line == line


def test_dropout_and_augmentation_are_explored_from_a_starting_value_above_0():
    off = pbt_file().replace(
        "    training.optimizer.lr: {factors: [0.8, 1.25]}",
        "    model.config.dropout: {min: 0.0, max: 0.6}\n    training.augment.noise: {min: 0.01, max: 0.5}",
    )
    with pytest.raises(SpaceError) as error:
        parse_space(off, "space.yaml")
    keys = {p.key: p.message for p in error.value.problems}
    assert "is 0 (off) in every member" in keys["pbt.explore.model.config.dropout"]
    assert "is 0 (off) in every member" in keys["pbt.explore.training.augment.noise"]
    on = off.replace("training: {", "model: {family: mlp, config: {dropout: 0.2}}\ntraining: {augment: {noise: 0.1}, ")
    options = pbt_options(parse_space(on, "space.yaml"))
    assert options["explore"] == {"dropout": Explore(0.0, 0.6), "augment.noise": Explore(0.01, 0.5)}


def test_the_shipped_pbt_space_explores_within_its_searched_bounds():
    space = load_space(SPACE)
    options = pbt_options(space)
    assert options["explore"]["lr"] == Explore(1e-4, 3e-2, log=True, factors=(0.8, 1.25))
    assert space.pruner.name == "none" and not any("pruner" in n for n in pbt_notes(space))
    with_pruner = parse_space(pbt_file().replace("params:", "pruner: median\nparams:"))
    assert any("pruner 'median' does not apply" in n for n in pbt_notes(with_pruner))


def test_hfta_nas_search_runs_a_pbt_space(tmp_path):
    """The CLI end to end: members told COMPLETE, files written, the summary names the best."""
    command = [
        sys.executable,
        "-m",
        "cli",
        "search",
        str(SPACE),
        "--storage",
        str(tmp_path / "study.journal"),
        "--out",
        str(tmp_path / "out"),
        "--set",
        "training.epochs=4",
        "--set",
        "pbt.interval=2",
        "--set",
        "pbt.population=3",
        "--set",
        "data.num_samples=600",
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert "best: trial" in done.stdout and "population plot (pbt.png)" in done.stdout
    for name in ("best_weights.pt", "best_config.yaml", "best_schedule.yaml", "pbt.png"):
        assert (tmp_path / "out" / name).exists(), name
    schedule = yaml.safe_load((tmp_path / "out" / "best_schedule.yaml").read_text())
    config = yaml.safe_load((tmp_path / "out" / "best_config.yaml").read_text())
    assert config["hparam_schedule"] == schedule["schedule"]  # what `hfta-nas stability` of it replays
    assert config["origin"]["seeds"] == schedule["seeds"]  # the root's seeds
    study = optuna.load_study(
        study_name="mnist1d-cnn-pbt",
        storage=optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(tmp_path / "study.journal"))
        ),
    )
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    assert all(math.isfinite(t.value) for t in study.trials)


@pytest.mark.parametrize("option", [["--workers", "2"], ["--dry-run"]])
def test_workers_and_dry_run_are_refused_for_pbt(tmp_path, option):
    command = [
        sys.executable,
        "-m",
        "hfta_nas.cli",
        "search",
        str(SPACE),
        "--storage",
        str(tmp_path / "s.journal"),
        *option,
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 2 and "pbt block" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "s.journal").exists()


def test_a_two_epoch_run_writes_its_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "EPOCHS", 2)  # build() reads it: the shortest run that exploits
    run(study_in(tmp_path), tmp_path / "out", interval=1)
    assert (tmp_path / "out" / "pbt.png").stat().st_size > 0


def test_a_diverging_member_fails_alone_and_is_never_copied(tmp_path):
    study = study_in(tmp_path)
    events = []
    hfta_nas.pbt(
        study,
        build_one_diverging,
        synthetic_dataset(n_train=96, dtype=torch.float64),
        population=POPULATION,
        interval=INTERVAL,
        explore=LR,
        dtype="float64",
        on_event=events.append,
    )
    states = {t.number: t.state.name for t in study.trials}
    assert states == {0: "COMPLETE", 1: "FAIL", 2: "COMPLETE", 3: "COMPLETE"}
    assert "non-finite" in study.trials[1].user_attrs["fail_reason"]
    assert all(1 not in (e.source, e.target) for e in events if isinstance(e, PBTExploited))


def test_members_of_a_run_stopped_before_its_first_checkpoint_are_failed_and_a_new_population_trains(tmp_path):
    def stop_before_training(event):
        if type(event).__name__ == "PBTStarted":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(study_in(tmp_path), None, on_event=stop_before_training)
    run(study_in(tmp_path), None)
    trials = study_in(tmp_path).trials
    assert [t.state.name for t in trials] == ["FAIL"] * POPULATION + ["COMPLETE"] * POPULATION
    assert "no checkpoint that can continue it (it stopped before its first" in trials[0].user_attrs["fail_reason"]


# ------------------------------------------------------------ review: edges of a run and of its resume
def test_members_that_differ_only_in_a_dropout_rate_are_refused_before_training(tmp_path):
    study = study_in(tmp_path)

    def rates_differ(trial):
        candidate = build(trial)
        rate = 0.5 if trial.number == 2 else 0.1
        candidate.model = lambda: nn.Sequential(nn.Flatten(), nn.Linear(24, 16), nn.Dropout(rate), nn.Linear(16, 3))
        return candidate

    with pytest.raises(HftaNasError, match="trials 0 and 2 build different models"):
        hfta_nas.pbt(study, rates_differ, synthetic_dataset(), population=4, explore=LR)
    assert {t.state.name for t in study.trials} == {"FAIL"}


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"metric": "val_lss"}, "'val_lss' is not one"),
        ({"explore": {"augment.mixup": Explore(0.0, 1.0)}}, "cannot explore 'augment.mixup'"),
        ({"explore": {"dropout": Explore(0.1, 1.0)}}, r"a dropout rate is in \[0, 1\)"),
        ({"explore": {"initial_accumulator_value": Explore(0.1, 1.0)}}, "cannot explore"),
    ],
)
def test_metrics_and_bounds_a_run_cannot_use_are_refused_before_training(settings, message):
    study = optuna.create_study()  # no metric names: pbt's metric is what each trial is told
    with pytest.raises(HftaNasError, match=message):
        hfta_nas.pbt(study, build, synthetic_dataset(), population=4, **{"explore": LR, **settings})


def test_a_minimizing_study_without_metric_names_ranks_by_the_metric_given(tmp_path):
    study = optuna.create_study(direction="minimize")
    summary = hfta_nas.pbt(study, build, synthetic_dataset(), population=2, interval=2, metric="val_loss", explore=LR)
    assert summary.metric == "val_loss" and summary.best["value"] == min(t.value for t in study.trials)


def test_dropout_layers_of_different_rates_cannot_be_given_one(tmp_path):
    def two_rates(trial):
        candidate = build(trial)
        candidate.model = lambda: nn.Sequential(nn.Flatten(), nn.Dropout(0.1), nn.Linear(24, 3), nn.Dropout(0.5))
        return candidate

    with pytest.raises(HftaNasError, match="dropout layers have different rates"):
        hfta_nas.pbt(
            study_in(tmp_path), two_rates, synthetic_dataset(), population=2, explore={"dropout": Explore(0, 0.6)}
        )


def test_a_stopped_run_is_not_continued_with_other_settings(tmp_path):
    def stop_at_the_first_exploit(event):
        if isinstance(event, PBTExploited):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(study_in(tmp_path), None, on_event=stop_at_the_first_exploit)
    with pytest.raises(HftaNasError, match="has a PBT run stopped after epoch 1 with other interval"):
        run(study_in(tmp_path), None, interval=3)
    assert {t.state.name for t in study_in(tmp_path).trials} == {"RUNNING"}  # the stopped run stays as it was
    run(study_in(tmp_path), None)  # with its own settings it continues
    assert {t.state.name for t in study_in(tmp_path).trials} == {"COMPLETE"}


def test_a_run_stopped_while_telling_its_members_is_finished_by_the_next_call(tmp_path):
    whole = run(study_in(tmp_path / "a"), tmp_path / "a" / "out")
    told = []

    def stop_after_two_are_told(event):
        if type(event).__name__ == "TrialEnded":
            told.append(event.trial)
            if len(told) == 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(study_in(tmp_path / "b"), tmp_path / "b" / "out", on_event=stop_after_two_are_told)
    resumed = run(study_in(tmp_path / "b"), tmp_path / "b" / "out")
    assert [(t.state.name, t.value) for t in study_in(tmp_path / "b").trials] == [
        (t.state.name, t.value) for t in study_in(tmp_path / "a").trials
    ]
    assert resumed.best["number"] == whole.best["number"] and resumed.resumed_from_epoch == EPOCHS


@pytest.mark.parametrize(
    "optimizer,augmentation,explore,message",
    [
        ("sgd", {"mixup": 0.4}, {"augment.mixup": Explore(0.0, 1.0)}, "a Beta alpha is above 0"),
        ("adagrad", None, {"initial_accumulator_value": Explore(0.1, 1.0)}, "cannot explore"),
    ],
)
def test_values_explore_cannot_set_are_refused(optimizer, augmentation, explore, message):
    def candidate(trial):
        built = build(trial, augmentation=hfta_nas.data.Augmentation(**augmentation) if augmentation else None)
        built.optimizer, built.hparams = optimizer, {"lr": built.hparams["lr"]}
        return built

    with pytest.raises(HftaNasError, match=message):
        hfta_nas.pbt(optuna.create_study(direction="maximize"), candidate, synthetic_dataset(), explore=explore)


def test_members_whose_metric_is_not_finite_are_not_ranked():
    """A NaN or infinite metric neither copies nor is copied, and is never the best; ties go to the lower
    trial number; with fewer than two finite members nothing is exploited (no ranking falls back to numbers)."""
    from hfta_nas.search._pbt import ranked_members

    values = {0: 0.5, 1: float("nan"), 2: 0.9, 3: 0.5, 4: float("inf")}
    assert ranked_members(values, "maximize") == [2, 0, 3]
    assert ranked_members(values, "minimize") == [0, 3, 2]
    assert ranked_members({0: float("nan"), 1: float("nan")}, "maximize") == []
