"""Per-epoch checkpoints: a trainer restored from one, after a kill at any epoch, ends
bit-identical to the trainer that was never stopped (weights, optimizer, results)."""

import pytest
import torch
from torch import nn

import hfta_nas
from hfta_nas import ArrayTrainer, ModelArray
from hfta_nas.optim import LRSchedule
from hfta_nas.training._checkpoint import Checkpointer, enabled, load, save

EPOCHS = 4


def model(width: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv1d(2, width, 3, padding=1, bias=False),
        nn.BatchNorm1d(width),
        nn.ReLU(),
        nn.Dropout(0.3),
        nn.MaxPool1d(2),
        nn.Flatten(),
        nn.Linear(width * 6, 3),
    )


WIDTHS = {0: 4, 1: 6, 2: 3, 3: 5, "refill": 2}  # slot id -> width: one envelope of different sizes


def make_trainer(data):
    ids = [0, 1, 2, 3]
    arr = ModelArray([model(WIDTHS[i], i) for i in ids], dropout_seeds=[7, 8, 9, 10], dtype=torch.float64)
    opt = hfta_nas.optim.Adam(arr, lr=[1e-2, 3e-3, 2e-2, 5e-3])
    sched = LRSchedule(opt, ["cosine", "step", "constant", "step"], t_max=EPOCHS, step_size=1, gamma=0.7)
    return ArrayTrainer(arr, opt, data, batch_size=16, data_seeds=[1, 2, 3, 4], schedule=sched, slot_ids=ids)


def build(slot_id):
    return model(WIDTHS[slot_id], 99), {"data_seed": 42, "dropout_seed": 5, "hparams": {"lr": 4e-3}}


def on_epoch(report, trainer):
    """Surgery a search does: slot 1 pruned after epoch 1 and refilled, slot 2 dropped after epoch 2."""
    if report.epoch == 1 and 1 in trainer.slot_ids:
        trainer.results[1].status = "stopped"
        trainer.replace(1, "refill", *build("refill")[:1], **build("refill")[1])
    if report.epoch == 2 and 2 in trainer.slot_ids:
        trainer.stop([2], reason="pruned")


class Killed(Exception):
    pass


def snapshot(trainer):
    state = trainer.state_dict()
    return state["results"], [trainer.array.slot_state_dict(b) for b in range(len(trainer.slot_ids))]


@pytest.mark.parametrize("kill_after", [1, 2, 3])
def test_restored_trainer_ends_bit_identical(tiny_data, tmp_path, kill_after):
    reference = make_trainer(tiny_data)
    reference.fit(EPOCHS, on_epoch=on_epoch)

    checkpointer = Checkpointer(tmp_path / "array.pt")

    def save_then_kill(trainer):
        checkpointer(trainer)
        if trainer.epoch == kill_after:
            raise Killed

    with pytest.raises(Killed):
        make_trainer(tiny_data).fit(EPOCHS, on_epoch=on_epoch, checkpoint=save_then_kill)

    resumed = Checkpointer(tmp_path / "array.pt")
    trainer = resumed.resume(lambda: make_trainer(tiny_data), build)
    assert resumed.state is not None and trainer.epoch == kill_after
    trainer.fit(EPOCHS, on_epoch=on_epoch, checkpoint=resumed)
    resumed.finish()
    assert not (tmp_path / "array.pt").exists()

    (results, weights), (expected_results, expected_weights) = snapshot(trainer), snapshot(reference)
    assert results == expected_results  # every epoch's metrics of every slot, to the bit
    assert trainer.slot_ids == reference.slot_ids
    for got, want in zip(weights, expected_weights):
        assert got.keys() == want.keys()
        for key in want:
            assert torch.equal(got[key], want[key]), key


def test_checkpoint_of_another_array_is_ignored(tiny_data, tmp_path):
    path = tmp_path / "array.pt"
    other = make_trainer(tiny_data)
    other.initial_ids = ["a", "b", "c", "d"]
    save(path, {"trainer": other.state_dict()})
    checkpointer = Checkpointer(path)
    trainer = checkpointer.resume(lambda: make_trainer(tiny_data), build)
    assert checkpointer.state is None and trainer.epoch == 0 and not path.exists()


def test_damaged_checkpoint_is_ignored(tmp_path):
    path = tmp_path / "array.pt"
    path.write_bytes(b"not a checkpoint")
    assert load(path) is None and not path.exists()


def test_switch(monkeypatch):
    assert enabled()
    for value in ("off", "0", "False", "no"):
        monkeypatch.setenv("HFTA_NAS_CHECKPOINT", value)
        assert not enabled()


def test_train_continues_only_a_checkpoint_of_the_same_call(tiny_data, tmp_path):
    path = tmp_path / "train.pt"
    common = dict(
        model=lambda: model(4, 0),
        dataset=tiny_data,
        seeds=[1, 2],
        epochs=3,
        batch_size=16,
        dtype="float64",
        checkpoint=path,
    )

    def killed_after_epoch_1(report, trainer):
        if report.epoch == 2:  # epoch 1's checkpoint is written, epoch 2's not yet
            raise Killed

    with pytest.raises(Killed):
        hfta_nas.train(hparams={"lr": 1e-2}, on_epoch=killed_after_epoch_1, **common)
    other = hfta_nas.train(hparams={"lr": 3e-3}, **common)  # another learning rate: starts over
    assert other.resumed_epoch == 0 and not path.exists()

    with pytest.raises(Killed):
        hfta_nas.train(hparams={"lr": 1e-2}, on_epoch=killed_after_epoch_1, **common)
    resumed = hfta_nas.train(hparams={"lr": 1e-2}, **common)
    reference = hfta_nas.train(hparams={"lr": 1e-2}, **{**common, "checkpoint": None})
    assert resumed.resumed_epoch == 1 and not path.exists()
    for got, want in zip(resumed.results.values(), reference.results.values()):
        assert got.history == want.history


def test_checkpoint_folders_are_per_storage_and_study(tmp_path):
    from hfta_nas.search import checkpoint_folder

    a, b = str(tmp_path / "a.journal"), str(tmp_path / "b.journal")
    assert checkpoint_folder(a, "s").parent == checkpoint_folder(b, "s").parent == tmp_path / "checkpoints"
    assert len({checkpoint_folder(a, "s"), checkpoint_folder(b, "s"), checkpoint_folder(a, "t")}) == 3
    assert checkpoint_folder(f"sqlite:///{tmp_path / 'x.db'}", "s").parent == tmp_path / "checkpoints"
    assert checkpoint_folder("<in memory>", "s") is None


def test_only_retries_claim_a_checkpoint(tmp_path):
    """A fresh trial with the number and parameters of a checkpoint's slot (the same search started on
    another storage) never takes the slot over; its retry does."""
    import optuna

    from hfta_nas.search._candidate import Proposal
    from hfta_nas.search._resume import claim

    study = optuna.create_study()
    fresh = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    study.enqueue_trial(fresh.params, user_attrs={"retry_of": fresh.number})
    retry = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    trainer = {"epoch": 1, "slot_ids": [fresh.number], "results": {fresh.number: {"status": "running"}}}
    save(
        tmp_path / "c.pt",
        {
            "trainer": trainer,
            "slots": {fresh.number: {"origin": fresh.number, "params": fresh.params}},
            "device": "cpu",
            "dtype": "torch.float32",
        },
    )
    as_proposal = lambda trial: Proposal(trial, None, {}, None, 0)  # noqa: E731 - claim reads the trial only
    claims, rest = claim(tmp_path, [as_proposal(fresh)], "cpu", "torch.float32", dict)
    assert not claims and len(rest) == 1
    claims, rest = claim(tmp_path, [as_proposal(retry)], "cpu", "torch.float32", dict)
    assert [c.proposals[fresh.number].trial.number for c in claims] == [retry.number] and not rest
