"""Out of memory: an array that does not fit is split in halves and retried down to one
model, with nothing lost; the CPU budget is checked before anything is allocated."""

import logging

import pytest
import torch

from hfta_nas import train
from hfta_nas.errors import HftaNasError
from hfta_nas.models import resolve_model
from hfta_nas.search import ArraySizeChosen, ArraySplit, ArrayStarted
from hfta_nas.stability._configs import LabelledConfig
from hfta_nas.stability._runner import run_stability
from hfta_nas.training._oom import ArrayOutOfMemory, estimate_array_bytes, parse_bytes, train_in_halves
from tests.conftest import synthetic_dataset
from tests.test_stability import mlp_config


def test_sizes_parse_with_units():
    assert parse_bytes("8GiB") == 8 * 2**30 and parse_bytes("500 MB") == 500 * 10**6 and parse_bytes("1e6") == 10**6
    with pytest.raises(HftaNasError, match="expected e.g. 8GiB"):
        parse_bytes("lots")


def test_the_estimate_grows_with_slots_and_counts_weights_grads_and_state():
    factory = resolve_model("mlp", {"width": 16, "depth": 1}, input_shape=(64,), num_classes=10)
    one = estimate_array_bytes(factory, (64,), batch_size=10, slots=1, dtype=torch.float64, optimizer="sgd")
    parameters = sum(p.numel() for p in factory().parameters())
    activations = 10 * (64 + 16 + 16 + 10)  # flatten, linear, relu, linear outputs for a batch of 10
    assert one == 8 * (parameters * 3 + 2 * activations)
    assert estimate_array_bytes(factory, (64,), batch_size=10, slots=6, dtype=torch.float64, optimizer="sgd") == 6 * one


def test_halves_are_retried_down_to_one_and_a_model_too_big_alone_is_reported():
    calls, splits = [], []

    def train_part(part):
        calls.append(list(part))
        if len(part) > 2 or 4 in part:  # model 4 never fits, not even alone
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return sum(part)

    done = train_in_halves([0, 1, 2, 3, 4], train_part, on_split=lambda n, half, reason: splits.append((n, half)))
    assert [chunk for chunk, _ in done] == [[0, 1], [2], [3], [4]]
    assert [result for _, result in done[:3]] == [1, 2, 3]
    assert done[3][1].startswith("out of memory even alone: OutOfMemoryError")
    assert splits == [(5, 3), (3, 2), (2, 1)]


def test_the_cpu_allocators_out_of_memory_is_split_too():
    """On the CPU, torch reports exhausted memory as a plain RuntimeError from its allocator."""

    def train_part(part):
        if len(part) > 1:
            torch.empty(2**62, dtype=torch.uint8)  # the real allocator's error, not a hand-written one
        return sum(part)

    done = train_in_halves([1, 2, 3], train_part)
    assert [result for _, result in done] == [1, 2, 3]


def test_other_errors_are_not_mistaken_for_out_of_memory():
    with pytest.raises(ValueError):
        train_in_halves([1, 2], lambda part: (_ for _ in ()).throw(ValueError("bug")))


def test_train_refuses_an_array_over_the_budget_before_allocating():
    data = synthetic_dataset(n_train=40, shape=(64,), classes=10)
    factory = resolve_model("mlp", {"width": 8, "depth": 1}, input_shape=(64,), num_classes=10)
    four = estimate_array_bytes(factory, (64,), batch_size=20, slots=4, dtype=torch.float64, optimizer="sgd")
    kwargs = dict(
        model="mlp",
        model_config={"width": 8, "depth": 1},
        dataset=data,
        optimizer="sgd",
        hparams={"lr": 0.05},
        epochs=1,
        batch_size=20,
        dtype="float64",
    )
    with pytest.raises(ArrayOutOfMemory, match="an array of 4 models needs about"):
        train(seeds=[0, 1, 2, 3], memory_budget=four - 1, **kwargs)
    assert train(seeds=[0, 1, 2, 3], memory_budget=four, **kwargs).results


def test_a_stability_run_over_the_budget_splits_and_matches_the_unsplit_run(monkeypatch, caplog):
    config = mlp_config()
    whole, _ = run_stability([LabelledConfig("m", config)], n_seeds=4, dtype="float64")
    factory = resolve_model(config.model, config.model_config, input_shape=(64,), num_classes=10)
    two = estimate_array_bytes(factory, (64,), batch_size=20, slots=2, dtype=torch.float64, optimizer=config.optimizer)
    monkeypatch.setenv("HFTA_NAS_MEMORY_BUDGET", str(two))
    events = []
    with caplog.at_level(logging.WARNING, logger="hfta_nas"):
        split, _ = run_stability(
            [LabelledConfig("m", config)],
            n_seeds=4,
            dtype="float64",
            on_event=lambda kind, info: events.append((kind, info)),
        )
    assert [a["size"] for a in split.metadata["arrays"]] == [2, 2]
    assert [info["size"] for kind, info in events if kind == "split"] == [4]
    assert "out of memory" in caplog.text
    columns = ["seed_index", "status", "test_acc", "train_loss"]
    assert split.seeds[columns].equals(whole.seeds[columns])  # float64: the split changes nothing


def test_a_seed_that_does_not_fit_alone_is_a_counted_failure(monkeypatch):
    monkeypatch.setenv("HFTA_NAS_MEMORY_BUDGET", "1KiB")
    result, _ = run_stability([LabelledConfig("m", mlp_config())], n_seeds=2, dtype="float64")
    assert list(result.seeds["status"]) == ["failed", "failed"]
    assert all(reason.startswith("out of memory even alone") for reason in result.seeds["reason"])


def test_a_search_array_over_the_budget_is_split_and_every_trial_trains(tmp_path, monkeypatch):
    from optuna.trial import TrialState

    from hfta_nas.data import load_dataset
    from tests.test_search import load_study, search, space_text

    params = {"training.optimizer.lr": {"distribution": "log_uniform", "min": 1e-3, "max": 3e-2}}
    # a random sampler: TPE would hold its guided asks until its random start has results, and the first
    # array would hold 2 trials, not 3
    text = space_text(
        params=params, model={"family": "mlp", "config": {"depth": 1, "width": 16}}, sampler={"name": "random"}
    )
    data = load_dataset("digits")
    factory = resolve_model(
        "mlp", {"depth": 1, "width": 16}, input_shape=data.input_shape, num_classes=data.num_classes
    )
    one = estimate_array_bytes(factory, data.input_shape, batch_size=64, slots=1, dtype=torch.float32, optimizer="adam")
    monkeypatch.setenv("HFTA_NAS_MEMORY_BUDGET", str(one))  # only arrays of one model fit
    events = []
    search(tmp_path, text, on_event=events.append)
    trials = load_study(tmp_path).trials
    assert len(trials) == 6 and all(t.state == TrialState.COMPLETE for t in trials)
    assert [(e.slots, e.half) for e in events if isinstance(e, ArraySplit)] == [(3, 2), (2, 1)]
    assert {len(e.trials) for e in events if isinstance(e, ArrayStarted)} == {1}


def test_a_search_array_out_of_memory_while_training_is_retried_in_halves(tmp_path, monkeypatch):
    from optuna.trial import TrialState

    from hfta_nas.training._trainer import ArrayTrainer
    from tests.test_search import load_study, search, space_text

    epochs = ArrayTrainer.epochs  # the loop a search's array job drives

    def epochs_like_a_small_gpu(self, *args, **kwargs):  # what CUDA raises for an array of more than one model
        if len(self.array) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        yield from epochs(self, *args, **kwargs)

    monkeypatch.setattr(ArrayTrainer, "epochs", epochs_like_a_small_gpu)
    events = []
    random_sampler = space_text(sampler={"name": "random"})  # rounds of 3: no TPE start to wait for
    search(tmp_path, random_sampler, on_event=events.append)
    trials = load_study(tmp_path).trials
    assert len(trials) == 6 and all(t.state == TrialState.COMPLETE for t in trials)  # none lost, none retried anew
    split = [t for t in trials if "out_of_memory" in t.user_attrs]  # the trials of arrays that ran out
    assert split and all("out of memory" in t.user_attrs["out_of_memory"] for t in split)
    sizes = [len(e.trials) for e in events if isinstance(e, ArrayStarted)]
    assert max(sizes) > 1 and 1 in sizes and sum(isinstance(e, ArraySplit) for e in events) >= 2
    assert all(list(t.intermediate_values) == [1, 2] for t in trials)


def test_auto_array_size_stops_at_the_throughput_knee_or_the_memory_limit():
    from hfta_nas.training._autosize import choose_array_size

    def saturating(slots):  # seconds per step: flat up to 8 models, then linear (the device is full)
        return max(1.0, slots / 8)

    assert choose_array_size(64, saturating, batch_size=100)[0] == 8
    assert choose_array_size(6, saturating, batch_size=100)[0] == 6  # still rising at the memory limit
    assert choose_array_size(64, lambda slots: float(slots), batch_size=100)[0] == 1  # no gain from fusing


def test_auto_array_size_respects_the_memory_budget(monkeypatch):
    from hfta_nas.training._autosize import auto_array_size

    factory = resolve_model("mlp", {"width": 8, "depth": 1}, input_shape=(64,), num_classes=10)
    three = estimate_array_bytes(factory, (64,), batch_size=20, slots=3, dtype=torch.float32, optimizer="adam")
    monkeypatch.setenv("HFTA_NAS_MEMORY_BUDGET", str(three))
    chosen = auto_array_size(factory, (64,), 10, batch_size=20, dtype=torch.float32, optimizer="adam", device="cpu")
    assert chosen.memory_limit == 3 and 1 <= chosen.size <= 3 and chosen.reason


def test_a_search_with_array_size_auto_sizes_each_shape(tmp_path, monkeypatch):
    from optuna.trial import TrialState

    from hfta_nas.data import load_dataset
    from tests.test_search import load_study, search

    data = load_dataset("digits")
    factory = resolve_model(
        "mlp", {"depth": 1, "width": 32}, input_shape=data.input_shape, num_classes=data.num_classes
    )
    two = estimate_array_bytes(factory, data.input_shape, batch_size=64, slots=2, dtype=torch.float32, optimizer="adam")
    monkeypatch.setenv("HFTA_NAS_MEMORY_BUDGET", str(two))  # width 32: two fit; width 16: more
    events = []
    search(tmp_path, array_size="auto", on_event=events.append)
    assert all(t.state == TrialState.COMPLETE for t in load_study(tmp_path).trials)
    chosen = {e.structure: e.size for e in events if isinstance(e, ArraySizeChosen)}
    arrays = [e for e in events if isinstance(e, ArrayStarted)]
    assert chosen and all(len(e.trials) <= e.array_size and e.array_size in chosen.values() for e in arrays)
    assert all(size <= 4 for size in chosen.values())
    stored = load_study(tmp_path).user_attrs  # each choice and its reason kept in the study
    assert {key: stored[f"array_size:{key}"]["size"] for key in chosen} == chosen
