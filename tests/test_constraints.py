"""A space file's `constraints:` block: each problem in one line at its key; in a real search each
bound is an Optuna constraint on its trial (system attribute `constraints:<metric>.max`), valued
against plain PyTorch's parameter count, read by Optuna's TPE sampler and best_trial, and the
exported best is the best feasible trial."""

import logging

import optuna
import pytest
import torch
import yaml
from click.testing import CliRunner

from hfta_nas.cli import main
from hfta_nas.search import open_storage
from hfta_nas.search_spaces import SpaceError, parse_space, run_search

optuna.logging.set_verbosity(optuna.logging.WARNING)
BOUND = 1500  # an MLP of width 16 on digits has 1210 parameters, of width 32 2410: only 16 is feasible
LATENCY_BOUND_MS = 1000.0


def space(**overrides) -> dict:
    text = {
        "study": {"name": "bounded", "metrics": ["val_acc"]},
        "sampler": {"name": "tpe", "kwargs": {"n_startup_trials": 2}},
        "pruner": {"name": "none"},
        "budget": {"n_trials": 6},
        "array": {"size": 3, "step_cost": {"fixed_s": 1e-4, "per_gmac_s": 0.1}},
        "data": {"dataset": "digits", "batch_size": 64},
        "training": {"epochs": 2, "optimizer": {"name": "adam", "lr": 1e-3}},
        "model": {"family": "mlp", "config": {"depth": 1}},
        "seed": 7,
        "params": {
            "training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 3e-2},
            "model.config.width": {"distribution": "categorical", "values": [16, 32]},
        },
        "constraints": {"params": {"max": BOUND}, "latency_ms": {"max": LATENCY_BOUND_MS}},
    }
    text.update(overrides)
    return text


def plain_parameter_count(width: int) -> int:
    """The family's MLP of depth 1 on digits (64 features, 10 classes), written in plain PyTorch."""
    return sum(
        p.numel() for p in torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.Linear(width, 10)).parameters()
    )


def test_each_bound_is_an_optuna_constraint_that_tpe_and_the_best_trial_read(tmp_path):
    summary = run_search(
        parse_space(yaml.safe_dump(space()), "space.yaml"),
        storage=str(tmp_path / "study.journal"),
        out_dir=tmp_path / "out",
    )
    study = optuna.load_study(study_name="bounded", storage=open_storage(str(tmp_path / "study.journal"))[0])
    trials = study.trials
    assert {t.params["model.config.width"] for t in trials} == {16, 32}
    for trial in trials:
        expected = plain_parameter_count(trial.params["model.config.width"]) - BOUND
        assert trial.system_attrs["constraints:params.max"] == expected
        latency = trial.user_attrs["final_metrics"]["latency_ms"]  # measured though no objective reads it
        assert latency > 0 and trial.constraints["latency_ms.max"] == latency - LATENCY_BOUND_MS

    feasible = [t for t in trials if t.params["model.config.width"] == 16]
    best = max(feasible, key=lambda t: (t.value, -t.number))
    assert study.best_trial.number == best.number  # Optuna's own reading of the constraints
    assert summary.best[0]["number"] == best.number
    assert yaml.safe_load((tmp_path / "out" / "best_config.yaml").read_text())["origin"]["trial"] == best.number

    # the search's TPE sampler read them too: every trial it drew after the first array ended is feasible,
    # though the infeasible width may have the best value
    later = [t for t in trials if t.number >= 3]
    assert {t.params["model.config.width"] for t in later} == {16}


def test_a_space_none_of_whose_trials_is_feasible_exports_nothing(tmp_path):
    bounds = {"params": {"max": 100}}
    summary = run_search(
        parse_space(yaml.safe_dump(space(constraints=bounds, budget={"n_trials": 2})), "space.yaml"),
        storage=str(tmp_path / "study.journal"),
        out_dir=tmp_path / "out",
    )
    assert summary.best == []
    assert not (tmp_path / "out" / "best_weights.pt").exists()


def test_the_command_says_why_a_study_has_no_best_trial(tmp_path):
    """It printed an empty best-trial table and no reason."""
    file = tmp_path / "space.yaml"
    file.write_text(yaml.safe_dump(space(constraints={"params": {"max": 100}}, budget={"n_trials": 2})))
    args = ["search", str(file), "--storage", str(tmp_path / "s.journal"), "--out", str(tmp_path / "out")]
    done = CliRunner().invoke(main, [*args, "--threads", "1"])
    assert done.exit_code == 0, done.output
    assert "no best trial: none of the 2 completed trials met the space's constraints" in " ".join(done.output.split())
    assert "best trial(s)" not in done.output


BAD = [
    # (id, the constraints block, the one line's key and message)
    ("unknown metric", {"val_los": {"max": 1}}, "constraints.val_los: metric 'val_los' is not measured here"),
    ("test metric", {"test_acc": {"min": 0.5}}, "constraints.test_acc: a constraint on test_acc would choose"),
    ("no bound", {"params": {}}, "constraints.params: give max, min or both"),
    ("crossing bounds", {"val_acc": {"min": 0.9, "max": 0.5}}, "constraints.val_acc: min 0.9 is above max 0.5"),
    ("infinite bound", {"val_loss": {"max": float("inf")}}, "constraints.val_loss.max: expected a finite number"),
    ("unknown key", {"params": {"maxx": 5}}, "constraints.params.maxx: unknown key 'maxx' (did you mean 'max'?)"),
]


@pytest.mark.parametrize(("bounds", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_constraints_block_is_one_line_at_its_key(bounds, message):
    with pytest.raises(SpaceError) as error:
        parse_space(yaml.safe_dump(space(constraints=bounds)), "space.yaml")
    lines = str(error.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith("space.yaml:") and message in lines[0], lines


def test_constraints_on_a_pbt_population_are_refused():
    pbt = {"population": 4, "interval": 1, "explore": {"training.optimizer.lr": {"factors": [0.8, 1.25]}}}
    with pytest.raises(SpaceError, match="constraints: a pbt population is not sampled"):
        parse_space(yaml.safe_dump(space(pbt=pbt)), "space.yaml")


def test_a_sampler_that_ignores_constraints_is_warned(caplog):
    with caplog.at_level(logging.WARNING, logger="hfta_nas"):
        parse_space(yaml.safe_dump(space(sampler={"name": "random"})), "space.yaml")
    assert "constraints: sampler 'random' does not sample by constraints" in caplog.text
