"""The ported Optuna objectives in examples/ports run in their tiny modes: every trial ends,
and each port shows what it is there for."""

import importlib

import optuna
import pytest
from optuna.trial import TrialState

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.mark.parametrize(
    "name, trials", [("optuna_pytorch_simple", 6), ("optuna_lightning_simple", 6), ("optuna_pytorch_lstm", 4)]
)
def test_a_ported_objective_runs_in_its_tiny_mode(name, trials):
    study = importlib.import_module(f"examples.ports.{name}").main(["--tiny"])
    assert len(study.trials) == trials
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials)
    assert study.best_value > 0.1  # better than chance on 10 classes, at most a couple of epochs in


def test_the_lenet_search_packs_different_sizes_and_every_slot_trains():
    from examples.ports.lenet_search import main

    study = main(["--tiny"])
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 6
    assert len({(t.params["c1"], t.params["c2"], t.params["kernel"], t.params["hidden"]) for t in study.trials}) > 1


def test_the_lstm_port_keeps_the_habits_its_tiny_run_proves_work():
    """Its forward makes states with .to(DEVICE) and its init finds the LSTM by class, as such
    objectives are written: the tiny run above proves the array takes both."""
    import inspect

    from examples.ports import optuna_pytorch_lstm

    source = inspect.getsource(optuna_pytorch_lstm.LSTMClassifier)
    assert ".to(DEVICE)" in source and "isinstance(module, nn.LSTM)" in source
