"""The search's rounds, its --dry-run plan, the CLI overrides and the live progress.

Every architecture the sampler proposes is trained as proposed; a dry run
writes nothing and, with the same step cost, plans the arrays the run trains.
"""

import json

import optuna
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

from hfta_nas.cli import main
from hfta_nas.search import (
    ArrayEnded,
    ArrayStarted,
    EpochEnded,
    SearchStarted,
    TrialEnded,
    cost_from_dict,
    open_storage,
    optimize,
)
from hfta_nas.search_spaces import candidate_builder, open_space_study, parse_space, plan_search, run_search
from hfta_nas.search_spaces._search_output import SearchProgress
from tests.test_search import space_text as tiny_space_text

optuna.logging.set_verbosity(optuna.logging.WARNING)


def space_text(**overrides):
    """tests.test_search's tiny space, with 12 trials of 3 widths in arrays of 4, randomly sampled."""
    plan = {
        "study": {"name": "plan", "metrics": ["val_acc"]},
        "sampler": {"name": "random"},
        "budget": {"n_trials": 12},
        "array": {"size": 4},
        "training": {"epochs": 1, "optimizer": {"name": "adam", "lr": 1e-3}},
        "seed": 3,
        "params": {
            "training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 3e-2},
            "model.config.width": {"distribution": "categorical", "values": [8, 16, 32]},
        },
    }
    return tiny_space_text(**{**plan, **overrides})


def space(tmp_path, **overrides):
    return parse_space(space_text(**overrides), source=str(tmp_path / "space.yaml"))


def storage(tmp_path):
    return str(tmp_path / "study.journal")


def load(tmp_path, name="plan"):
    return optuna.load_study(study_name=name, storage=open_storage(storage(tmp_path))[0])


def test_every_trial_trains_as_the_sampler_proposed_it(tmp_path):
    summary = run_search(space(tmp_path), storage=storage(tmp_path), out_dir=tmp_path / "out")
    trials = load(tmp_path).trials
    assert len(trials) == 12 and all(t.state == TrialState.COMPLETE for t in trials)
    assert not any("fixed_params" in t.system_attrs for t in trials)  # nothing enqueued: every value is the sampler's
    assert (
        summary.architectures_trained
        == summary.architectures_proposed
        == len({t.params["model.config.width"] for t in trials})
    )
    by_array = {}
    for trial in trials:
        by_array.setdefault(trial.user_attrs["array_id"], []).append(trial)
    assert len(by_array) == len(summary.arrays) and all(len(m) <= 4 for m in by_array.values())
    for members in by_array.values():  # a trial's architecture attribute names its width
        assert len({t.user_attrs["architecture"] for t in members}) == len(
            {t.params["model.config.width"] for t in members}
        )


def test_a_plan_covers_the_budget_once(tmp_path):
    plan = plan_search(space(tmp_path, budget={"n_trials": 40}), storage=storage(tmp_path))
    numbers = sorted(t["number"] for a in plan.arrays for t in a.trials)
    assert numbers == list(range(40))  # the whole budget, each trial in one array
    assert all(len(a.trials) <= a.array_size == 4 for a in plan.arrays)
    assert all(a.useful_macs <= a.executed_macs for a in plan.arrays) and plan.step_costs


def test_dry_run_writes_nothing_and_its_first_round_is_the_real_one(tmp_path):
    sp = space(tmp_path, budget={"n_trials": 8})
    plan = plan_search(sp, storage=storage(tmp_path))
    assert not (tmp_path / "study.journal").exists()  # not even an empty storage
    assert plan.done == 0 and plan.arrays and plan.n_trials == 8
    # the same policy with the same step cost: the real run's arrays are the planned ones
    study = open_space_study(sp, storage(tmp_path))
    cost = cost_from_dict(next(iter(plan.step_costs.values())))
    build = candidate_builder(sp)
    optimize(study, build, n_trials=8, array_size=4, seed=3, step_cost=cost)
    trials = load(tmp_path).trials
    again = plan_search(sp, storage=storage(tmp_path), n_trials=8)
    assert again.done == 8 and not again.arrays
    real = {}
    for trial in trials:
        real.setdefault(trial.user_attrs["array_id"], []).append(trial.number)
    assert sorted(map(sorted, real.values())) == sorted(sorted(t["number"] for t in a.trials) for a in plan.arrays)
    for array in plan.arrays:
        for planned in array.trials:
            assert trials[planned["number"]].params == pytest.approx(planned["params"])
            assert planned["seeds"] == {
                s: trials[planned["number"]].user_attrs[f"seed_{s}"] for s in ("init", "data", "dropout")
            }


def test_dry_run_of_an_existing_study_leaves_it_as_it_was(tmp_path):
    sp = space(tmp_path, budget={"n_trials": 4})
    run_search(sp, storage=storage(tmp_path), out_dir=tmp_path / "out")
    before = [(t.number, t.state, t.value, t.params) for t in load(tmp_path).trials]
    journal = (tmp_path / "study.journal").read_bytes()
    plan = plan_search(sp, storage=storage(tmp_path), n_trials=10)
    assert (tmp_path / "study.journal").read_bytes() == journal
    assert [(t.number, t.state, t.value, t.params) for t in load(tmp_path).trials] == before
    assert plan.done == 4
    assert sorted(t["number"] for a in plan.arrays for t in a.trials) == list(range(4, 10))


def test_cli_dry_run_prints_the_plan(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(space_text(budget={"n_trials": 8}))
    args = ["search", str(path), "--storage", storage(tmp_path), "--dry-run"]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert sum(len(a["trials"]) for a in plan["arrays"]) == 8 and plan["mean_occupancy"] > 0
    assert all(a["useful_macs"] <= a["executed_macs"] for a in plan["arrays"]) and plan["estimated_s"] > 0
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output
    assert "packing plan" in text.output and "padding" in text.output and "nothing was written" in text.output
    assert not (tmp_path / "study.journal").exists()


def test_a_dry_run_over_optimizer_names_says_they_never_share_an_array(tmp_path):
    params = {
        "training.optimizer.name": {"distribution": "categorical", "values": ["adam", "sgd", "rmsprop"]},
        "training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 3e-2},
    }
    path = tmp_path / "space.yaml"
    path.write_text(space_text(budget={"n_trials": 12}, params=params))
    result = CliRunner().invoke(main, ["search", str(path), "--storage", storage(tmp_path), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "the trials use 3 optimizers (adam, rmsprop, sgd): trials of different optimizers never share" in (
        result.output.replace("\n", " ")
    )
    plan = json.loads(
        CliRunner().invoke(main, ["search", str(path), "--storage", storage(tmp_path), "--dry-run", "--json"]).stdout
    )
    for array in plan["arrays"]:  # ... as planned
        assert len({t["params"]["training.optimizer.name"] for t in array["trials"]}) == 1
    one = tmp_path / "one.yaml"
    one.write_text(space_text(budget={"n_trials": 4}))
    assert (
        "optimizers"
        not in CliRunner().invoke(main, ["search", str(one), "--storage", storage(tmp_path), "--dry-run"]).output
    )


def test_cli_overrides_sampler_pruner_and_seed(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(space_text(budget={"n_trials": 4}, sampler={"name": "tpe", "kwargs": {"n_startup_trials": 2}}))
    result = CliRunner().invoke(
        main,
        [
            "search",
            str(path),
            "--storage",
            storage(tmp_path),
            "--out",
            str(tmp_path / "o"),
            "--sampler",
            "random",
            "--pruner",
            "hyperband",
            "--seed",
            "11",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    study = load(tmp_path)
    assert (study.user_attrs["sampler"], study.user_attrs["pruner"], study.user_attrs["seed"]) == (
        "random",
        "hyperband",
        11,
    )
    from hfta_nas.search import trial_seeds

    assert study.trials[0].user_attrs["seed_init"] == trial_seeds(11, 0)["init"]


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--sampler", "rnd"],
            "--sampler: expected one of tpe, random, cmaes, gp, grid, nsga2, got 'rnd' (did you mean 'random'?)",
        ),
        (["--pruner", "early"], "--pruner: expected one of none, median, successive_halving, hyperband, got 'early'"),
        (["--seed", "-1"], "--seed: expected an integer >= 0"),
        (["--sampler", "grid"], "the grid sampler needs a finite set of values"),
    ],
)
def test_cli_bad_overrides_exit_2(tmp_path, args, message):
    path = tmp_path / "space.yaml"
    path.write_text(space_text())
    result = CliRunner().invoke(main, ["search", str(path), "--storage", storage(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "study.journal").exists()


def test_cli_overrides_are_checked_against_the_study(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(
        space_text(study={"name": "mo", "metrics": ["val_acc", "params"], "directions": ["maximize", "minimize"]})
    )
    for args, message in (
        (["--pruner", "median"], "Optuna prunes single-objective studies only"),
        (["--sampler", "cmaes"], "optimises a single metric"),
    ):
        result = CliRunner().invoke(main, ["search", str(path), "--storage", storage(tmp_path), "--dry-run", *args])
        assert result.exit_code == 2 and message in result.output and "with " + " ".join(args) in result.output


def test_cli_quiet_shows_no_progress_but_the_summary(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(space_text(budget={"n_trials": 2}, array={"size": 2}))
    base = ["search", str(path), "--storage", storage(tmp_path), "--out", str(tmp_path / "o")]
    quiet = CliRunner().invoke(main, [*base, "--quiet"])
    assert quiet.exit_code == 0, quiet.output
    assert "watch it live" not in quiet.output and "array 1:" not in quiet.output
    assert "best trial(s)" in quiet.stdout and "mean occupancy" in quiet.stdout and "samples/s" in quiet.stdout
    loud = CliRunner().invoke(main, [*base, "--n-trials", "4"])
    assert loud.exit_code == 0, loud.output
    assert "watch it live" in loud.stderr and "array 1:" in loud.stderr and "(2 trials already done)" in loud.stderr


def test_progress_status_counts_best_arrays_occupancy_and_throughput():
    progress = SearchProgress(enabled=False)
    progress.event(
        SearchStarted("s", "f", "d", 2, 10, None, {"COMPLETE": 1, "PRUNED": 1}, ["val_acc"], ["maximize"], [[0.5]])
    )
    assert progress.status() == "1 complete, 1 pruned, 0 failed | best val_acc 0.5 | 0 arrays running"
    progress.event(ArrayStarted(1, [2, 3, 4], 4, 2, 300, 400, 1.0))
    progress.event(EpochEnded(1, 1, 3, 4, 0.75, 0.75, 1500.0))
    progress.event(TrialEnded(2, "PRUNED"))
    progress.event(TrialEnded(3, "COMPLETE", [0.75]))
    progress.event(TrialEnded(4, "COMPLETE", [0.25]))
    progress.event(TrialEnded(5, "FAIL", reason="non-finite"))
    assert progress.status().startswith(
        "3 complete, 2 pruned, 1 failed | best val_acc 0.75 (trial 3) | "
        "1 array running (3/4 slots) | mean occupancy 75% | 1,500 samples/s | ETA "
    )
    assert progress.status().endswith(" s")  # 4 of this run's 8 trials ended: as long again at this pace
    progress.event(ArrayEnded(1, 0.7))
    assert "0 arrays running | mean occupancy 70%" in progress.status()


def test_progress_counts_the_pareto_front_for_several_metrics():
    progress = SearchProgress(enabled=False)
    progress.event(SearchStarted("s", "f", "d", 0, 4, None, {}, ["val_acc", "params"], ["maximize", "minimize"], []))
    for number, values in enumerate([[0.5, 100], [0.6, 200], [0.4, 300], [0.7, 50]]):
        progress.event(TrialEnded(number, "COMPLETE", values))
    assert "pareto front 1" in progress.status()  # (0.7, 50) dominates the others
    progress.event(TrialEnded(9, "COMPLETE", [0.8, 500]))
    assert "pareto front 2" in progress.status()


def test_auto_array_sizes_read_as_a_person_reads_them(tmp_path):
    """`array.size: auto`: the dry run says how large its arrays are (not 'arrays of up to auto'),
    and a search's line about the size it chose names no structure hash and rounds the measured
    step times (not '{1: 0.011306810999485606, ...}')."""
    import re

    path = tmp_path / "space.yaml"
    path.write_text(space_text(budget={"n_trials": 2}, array={"size": "auto"}))
    args = ["search", str(path), "--storage", storage(tmp_path), "--threads", "1"]
    dry = CliRunner().invoke(main, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "up to auto" not in dry.output
    assert re.search(r"arrays of up to \d+ \(auto: measured per layer structure\)", dry.output), dry.output
    run = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "out")])
    assert run.exit_code == 0, run.output
    chosen = [line for line in run.stderr.splitlines() if line.startswith("array size auto")]
    assert chosen and chosen[0].startswith("array size auto, layer structure 1: "), run.stderr
    for line in chosen:
        assert not re.search(r"\b[0-9a-f]{12}\b", line) and not re.search(r"\d\.\d{4,}", line), line


def test_a_measured_step_curve_is_printed_in_rounded_milliseconds():
    progress = SearchProgress(enabled=False)
    reason = "throughput knee of the measured step curve {1: 0.011306810999485606, 2: 0.03452618500068638}"
    first = progress._on_ArraySizeChosen(type("E", (), {"structure": "c40da0a96d2f", "size": 1, "reason": reason}))
    again = progress._on_ArraySizeChosen(type("E", (), {"structure": "5463a8d46e45", "size": 4, "reason": "memory"}))
    assert first == (
        "array size auto, layer structure 1: 1 model per array "
        "(throughput knee of the measured step curve: 11.3 ms a step with 1 model, 34.5 ms with 2)"
    )
    assert again == "array size auto, layer structure 2: 4 models per array (memory)"
