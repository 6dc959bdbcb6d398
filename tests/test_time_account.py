"""Where a search's wall time goes, and what it no longer pays twice.

The time account charges every moment to one phase and sums to the wall
time; a search reports it; a structure's step cost is measured once per
machine (a second search reads it from disk); work that depends only on an
architecture is done once per architecture.
"""

import optuna
import pytest

import hfta_nas
from hfta_nas._time_account import OTHER, PHASES, TimeAccount
from hfta_nas.data import load_dataset
from hfta_nas.models import model_factory
from hfta_nas.search import _optimize, _shape_checks

optuna.logging.set_verbosity(optuna.logging.WARNING)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_nested_phases_are_charged_once_and_the_phases_sum_to_the_wall_time(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr("hfta_nas._time_account.time.perf_counter", clock)
    account = TimeAccount()
    clock.now += 1.0  # in no phase: other
    with account.phase("training"):
        clock.now += 2.0
        with account.phase("storage"):  # interrupts training
            clock.now += 0.5
            with account.phase("ask"):  # a refill asking inside the epoch's bookkeeping
                clock.now += 0.25
            clock.now += 0.5
        clock.now += 3.0
    charged = account.seconds()
    assert charged["training"] == 5.0 and charged["storage"] == 1.0 and charged["ask"] == 0.25
    assert charged[OTHER] == 1.0
    assert sum(charged.values()) == pytest.approx(7.25)
    report = account.report()
    assert report["overhead"]["seconds"] == pytest.approx(2.25)  # all but training and evaluation
    assert set(report) == {*PHASES, OTHER, "overhead"}


def test_an_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="unknown phase"), TimeAccount().phase("lunch"):
        pass


def _build(digits):
    def build(trial):
        width = trial.suggest_categorical("width", [16, 32])
        depth = trial.suggest_int("depth", 1, 2)
        dropout = trial.suggest_float("dropout", 0.0, 0.3)
        model = model_factory(
            "mlp", {"depth": depth, "width": width, "dropout": dropout}, input_shape=digits.input_shape, num_classes=10
        )
        return hfta_nas.Candidate(model, hparams={"lr": 1e-2}, epochs=2, batch_size=128)

    return build


def _search(digits, n_trials=6, seed=0):
    study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.RandomSampler(seed=seed), pruner=optuna.pruners.NopPruner()
    )
    return hfta_nas.optimize(study, _build(digits), digits, n_trials=n_trials, array_size=4, seed=seed)


def test_a_search_reports_its_time_account_summing_to_its_wall_time(tmp_path, monkeypatch):
    monkeypatch.setenv("HFTA_NAS_CACHE_DIR", str(tmp_path / "cache"))
    summary = _search(load_dataset("digits"))
    account = summary.time_account
    assert set(account) == {*PHASES, OTHER, "overhead"}
    total = sum(account[name]["seconds"] for name in (*PHASES, OTHER))
    assert total == pytest.approx(summary.seconds, rel=0.05)
    assert sum(account[name]["share"] for name in (*PHASES, OTHER)) == pytest.approx(1.0, abs=0.01)
    assert account["training"]["seconds"] > 0 and account["evaluation"]["seconds"] > 0
    assert account["ask"]["seconds"] > 0 and account["storage"]["seconds"] > 0


def test_a_step_cost_is_measured_once_per_machine_and_read_from_disk_after(tmp_path, monkeypatch):
    monkeypatch.setenv("HFTA_NAS_CACHE_DIR", str(tmp_path / "cache"))
    # keep every curve, however busy this machine is: caching is under test here; a curve measured
    # under load is left out of the cache by design (tests/test_step_curve.py)
    monkeypatch.setattr("hfta_nas.search._cost.STEADY_DIP", 0.0)
    measured = []
    real = _optimize.measure_step_cost
    monkeypatch.setattr(_optimize, "measure_step_cost", lambda *a, **k: measured.append(1) or real(*a, **k))
    digits = load_dataset("digits")
    first = _search(digits)
    assert measured and (tmp_path / "cache" / "step_costs.json").is_file()  # a miss: measured, then kept
    count = len(measured)
    second = _search(digits)  # a new study, the same structures: every cost a hit
    assert len(measured) == count
    assert second.time_account["cost"]["seconds"] < first.time_account["cost"]["seconds"]
    monkeypatch.setenv("HFTA_NAS_CACHE_DIR", "off")  # no file cache: measured again
    _search(digits)
    assert len(measured) > count


def test_output_checks_and_multiply_adds_run_once_per_computation(tmp_path, monkeypatch):
    monkeypatch.setenv("HFTA_NAS_CACHE_DIR", str(tmp_path / "cache"))
    checked = []
    real = _shape_checks.check_outputs
    monkeypatch.setattr(_shape_checks, "check_outputs", lambda *a, **k: checked.append(1) or real(*a, **k))
    summary = _search(load_dataset("digits"), n_trials=12)
    # width x depth: at most 4 computations (dropout rates differ per trial but change no shape)
    assert summary.trials.get("COMPLETE", 0) == 12 and 1 <= len(checked) <= 4
