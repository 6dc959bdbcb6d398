"""The search's fill policy, its --dry-run plan, the CLI overrides and the live progress.

Grouping: candidates of equal shape signature share arrays, different ones
never do, and every architecture the sampler proposes freely is trained as
proposed. A dry run writes nothing and its first array is the real first array.
"""

import json

import optuna
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

from cli import _SearchProgress, main
from hfta_nas.search import open_storage, plan_search, run_search, shape_signature
from search_spaces import parse_space
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


def test_grouping_puts_equal_signatures_together_and_never_fuses_different_ones(tmp_path):
    summary = run_search(space(tmp_path), storage=storage(tmp_path), out_dir=tmp_path / "out")
    trials = load(tmp_path).trials
    assert len(trials) == 12 and all(t.state == TrialState.COMPLETE for t in trials)
    by_array, width_of = {}, {}
    for trial in trials:
        attrs = trial.user_attrs
        by_array.setdefault(attrs["array_id"], []).append(trial)
        width_of.setdefault(attrs["signature"], set()).add(trial.params["model.config.width"])
    # one signature per width and one width per signature: the signature is the shape
    assert all(len(widths) == 1 for widths in width_of.values())
    assert len(width_of) == len({t.params["model.config.width"] for t in trials}) >= 2
    for members in by_array.values():  # never two signatures (or widths) in one array
        assert len({t.user_attrs["signature"] for t in members}) == 1
        assert len({t.params["model.config.width"] for t in members}) == 1
        assert sorted(t.user_attrs["slot"] for t in members) == list(range(len(members)))
    # the signature is what shape_signature says for that width
    sp = space(tmp_path)
    for trial in trials[:3]:
        config = sp.resolve(sp.decode(trial.params))
        from hfta_nas.models import resolve_model

        factory = resolve_model(config.model, config.model_config, input_shape=(1, 8, 8), num_classes=10)
        assert shape_signature(config, factory) == trial.user_attrs["signature"]
    # each array got as many slots as it has members; occupancy counts against array.size
    sizes = [len(m) for m in by_array.values()]
    assert summary.arrays == len(by_array)
    assert summary.mean_occupancy == pytest.approx(sum(sizes) / (4 * len(sizes)))
    assert summary.samples_per_s > 0


def test_the_pool_keeps_every_freely_asked_architecture(tmp_path):
    plan = plan_search(space(tmp_path, budget={"n_trials": 40}), storage=storage(tmp_path))
    asked = [(t["number"], t["params"]["model.config.width"]) for a in plan.arrays for t in a.trials if t["how"] == "asked"]
    assert len({w for _, w in asked}) >= 2  # the sampler's diversity survives grouping
    for array in plan.arrays:
        widths = {t["params"]["model.config.width"] for t in array.trials}
        assert len(widths) == 1 and array.architecture == {"model.config.width": widths.pop()}
        assert len(array.trials) <= array.size == 4
        # fills come after the free asks in the array, and are asked later
        first_filled = next((i for i, t in enumerate(array.trials) if t["how"] == "filled"), len(array.trials))
        assert all(t["how"] == "filled" for t in array.trials[first_filled:])
    numbers = sorted(t["number"] for a in plan.arrays for t in a.trials)
    assert numbers == list(range(40))  # the whole budget, each trial in one array
    assert plan.mean_occupancy == pytest.approx(1.0)  # 40 trials, arrays of 4: no shape is left short


def test_dry_run_writes_nothing_and_its_first_array_is_the_real_one(tmp_path):
    sp = space(tmp_path, budget={"n_trials": 8})
    plan = plan_search(sp, storage=storage(tmp_path))
    assert not (tmp_path / "study.journal").exists()  # not even an empty storage
    assert plan.done == 0 and plan.arrays and plan.n_trials == 8
    run_search(sp, storage=storage(tmp_path), out_dir=tmp_path / "out")
    trials = load(tmp_path).trials
    first_array = trials[plan.arrays[0].trials[0]["number"]].user_attrs["array_id"]
    real_first = sorted((t.number, t.params["model.config.width"]) for t in trials if t.user_attrs["array_id"] == first_array)
    planned_first = sorted((t["number"], t["params"]["model.config.width"]) for t in plan.arrays[0].trials)
    assert real_first == planned_first
    for planned in plan.arrays[0].trials:
        assert trials[planned["number"]].params == pytest.approx(planned["params"])
        assert planned["seeds"] == {s: trials[planned["number"]].user_attrs[f"seed_{s}"] for s in ("init", "data", "dropout")}


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
    assert all(len({t["params"]["model.config.width"] for t in a["trials"]}) == 1 for a in plan["arrays"])
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0, text.output
    assert "grouping plan" in text.output and "model.config.width=" in text.output and "nothing was written" in text.output
    assert not (tmp_path / "study.journal").exists()


def test_cli_overrides_sampler_pruner_and_seed(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(space_text(budget={"n_trials": 4}, sampler={"name": "tpe", "kwargs": {"n_startup_trials": 2}}))
    result = CliRunner().invoke(main, ["search", str(path), "--storage", storage(tmp_path), "--out", str(tmp_path / "o"),
                                       "--sampler", "random", "--pruner", "hyperband", "--seed", "11", "--json"])
    assert result.exit_code == 0, result.output
    study = load(tmp_path)
    assert (study.user_attrs["sampler"], study.user_attrs["pruner"], study.user_attrs["seed"]) == ("random", "hyperband", 11)
    from hfta_nas.search import trial_seeds

    assert study.trials[0].user_attrs["seed_init"] == trial_seeds(11, 0)["init"]


@pytest.mark.parametrize("args,message", [
    (["--sampler", "rnd"], "--sampler: expected one of tpe, random, cmaes, gp, grid, nsga2, got 'rnd' (did you mean 'random'?)"),
    (["--pruner", "early"], "--pruner: expected one of none, median, successive_halving, hyperband, got 'early'"),
    (["--seed", "-1"], "--seed: expected an integer >= 0"),
    (["--sampler", "grid"], "the grid sampler needs a finite set of values"),
])
def test_cli_bad_overrides_exit_2(tmp_path, args, message):
    path = tmp_path / "space.yaml"
    path.write_text(space_text())
    result = CliRunner().invoke(main, ["search", str(path), "--storage", storage(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "study.journal").exists()


def test_cli_overrides_are_checked_against_the_study(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(space_text(study={"name": "mo", "metrics": ["val_acc", "params"], "directions": ["maximize", "minimize"]}))
    for args, message in ((["--pruner", "median"], "Optuna prunes single-objective studies only"),
                          (["--sampler", "cmaes"], "optimises a single metric")):
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
    progress = _SearchProgress(enabled=False)
    progress.event("start", {"study": "s", "storage": "f", "dashboard": "d", "done": 2, "n_trials": 10,
                             "states": {"COMPLETE": 1, "PRUNED": 1}, "metrics": ["val_acc"], "directions": ["maximize"],
                             "best": 0.5, "best_values": [[0.5]]})
    assert progress.status() == "1 complete, 1 pruned, 0 failed | best val_acc 0.5 | 0 arrays running"
    progress.event("array", {"array": 1, "size": 3, "trials": [2, 3, 4], "signature": "abc", "array_size": 4})
    progress.event("epoch", {"array": 1, "epoch": 1, "running": 3, "occupancy": 0.75, "mean_occupancy": 0.75,
                             "samples": 3000, "samples_per_s": 1500.0})
    progress.event("trial", {"trial": 2, "state": "PRUNED", "epoch": 1})
    progress.event("trial", {"trial": 3, "state": "COMPLETE", "values": [0.75]})
    progress.event("trial", {"trial": 4, "state": "COMPLETE", "values": [0.25]})
    progress.event("trial", {"trial": 5, "state": "FAIL", "reason": "non-finite"})
    assert progress.status() == ("3 complete, 2 pruned, 1 failed | best val_acc 0.75 (trial 3) | "
                                 "1 array running (3/4 slots) | mean occupancy 75% | 1,500 samples/s")
    progress.event("array_done", {"array": 1, "mean_occupancy": 0.7})
    assert "0 arrays running | mean occupancy 70%" in progress.status()


def test_progress_counts_the_pareto_front_for_several_metrics():
    progress = _SearchProgress(enabled=False)
    progress.event("start", {"study": "s", "storage": "f", "dashboard": "d", "done": 0, "n_trials": 4, "states": {},
                             "metrics": ["val_acc", "params"], "directions": ["maximize", "minimize"], "best": None,
                             "best_values": []})
    for number, values in enumerate([[0.5, 100], [0.6, 200], [0.4, 300], [0.7, 50]]):
        progress.event("trial", {"trial": number, "state": "COMPLETE", "values": values})
    assert "pareto front 1" in progress.status()  # (0.7, 50) dominates the others
    progress.event("trial", {"trial": 9, "state": "COMPLETE", "values": [0.8, 500]})
    assert "pareto front 2" in progress.status()
