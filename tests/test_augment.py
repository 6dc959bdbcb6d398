"""On-device augmentation: reproducible from each slot's data seed, different across slots,
independent of the array around a slot, and each operation doing what it says."""

import copy

import numpy as np
import pytest
import torch

import hfta_nas
from hfta_nas import ArrayTrainer, HftaNasError, ModelArray
from hfta_nas.data import Augmentation, SlotAugmenter
from tests.test_trainer import conv_bn_model


def batch(slots=3, n=8, shape=(2, 12)):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, *shape, generator=g, dtype=torch.float64)
    return x.expand(slots, *x.shape).clone(), torch.arange(n).expand(slots, n).clone()


ALL = Augmentation(shift=2, flip=True, noise=0.1, mixup=0.4, cutmix=1.0)


def test_the_same_seed_gives_the_same_batches_and_slots_differ():
    x, y = batch()
    first = SlotAugmenter(ALL, [5, 6, 7])(x, y)
    again = SlotAugmenter(ALL, [5, 6, 7])(x, y)
    assert torch.equal(first.x, again.x) and torch.equal(first.y_partner, again.y_partner)
    assert not torch.equal(first.x[0], first.x[1]) and not torch.equal(first.x[1], first.x[2])


def test_a_slot_is_augmented_as_it_would_be_alone():
    """Slot 1 of [5, 6, 7] equals a one-slot augmenter with seed 6: no slot sees another's randomness."""
    x, y = batch()
    array = SlotAugmenter(ALL, [5, 6, 7])
    alone = SlotAugmenter(ALL, [6])
    for _ in range(3):  # several steps: the streams stay apart
        together, single = array(x, y), alone(x[1:2], y[1:2])
        torch.testing.assert_close(together.x[1], single.x[0], rtol=0, atol=0)
        assert torch.equal(together.y_partner[1], single.y_partner[0])
        assert together.strength[1] == single.strength[0]


def test_shift_is_a_random_crop_of_the_zero_padded_sample():
    x, y = batch(slots=1, n=50, shape=(1, 6, 6))
    out = SlotAugmenter(Augmentation(shift=1), [3])(x, y).x
    padded = torch.nn.functional.pad(x, [1, 1, 1, 1])
    for n in range(50):  # each output is one of the 9 crops of its padded sample
        crops = [padded[0, n, :, i : i + 6, j : j + 6] for i in range(3) for j in range(3)]
        assert any(torch.equal(out[0, n], crop) for crop in crops)
    assert not torch.equal(out, x)


def test_flip_mirrors_about_half_of_the_samples():
    x, y = batch(slots=2, n=400, shape=(1, 5))
    out = SlotAugmenter(Augmentation(flip=True), [1, 2])(x, y).x
    flipped = (out == x.flip(-1)).all(-1).all(-1)
    assert ((out == x).all(-1).all(-1) | flipped).all()
    assert 0.4 < flipped.double().mean() < 0.6


def test_noise_has_the_given_standard_deviation():
    x, y = batch(slots=2, n=200, shape=(1, 50))
    out = SlotAugmenter(Augmentation(noise=0.3), [1, 2])(x, y).x
    assert (out - x).std().item() == pytest.approx(0.3, rel=0.02)


def test_mixup_and_cutmix_mix_inputs_and_report_the_strength():
    x, y = batch(slots=2, n=16, shape=(1, 4, 4))
    mixed = SlotAugmenter(Augmentation(mixup=0.5), [1, 2])(x, y)
    for slot in range(2):
        lam = mixed.strength[slot].item()
        partner = x[slot][mixed.y_partner[slot]]  # y is the sample index here
        torch.testing.assert_close(mixed.x[slot], lam * x[slot] + (1 - lam) * partner)
    cut = SlotAugmenter(Augmentation(cutmix=1.0), [1, 2])(x, y)
    for slot in range(2):
        partner = x[slot][cut.y_partner[slot]]
        from_partner = (cut.x[slot] == partner) & (cut.x[slot] != x[slot])
        share = from_partner[0].double().mean().item()  # of sample 0's pixels
        assert 1 - cut.strength[slot].item() == pytest.approx(share, abs=1 / 16 + 1e-9) or share == 0


def test_training_with_augmentation_is_reproducible_and_resumes_bit_identically(tiny_data):
    augmentation = Augmentation(shift=1, flip=True, noise=0.05, mixup=0.2)

    def trainer(augment=augmentation):
        arr = ModelArray.from_factory(conv_bn_model, seeds=[0, 1, 2], dtype=torch.float64)
        return ArrayTrainer(
            arr, hfta_nas.optim.Adam(arr, lr=3e-3), tiny_data, batch_size=16, data_seeds=[0, 1, 2], augmentation=augment
        )

    a, b, plain = trainer(), trainer(), trainer(None)
    a.fit(3), b.fit(3), plain.fit(3)
    assert [a.results[s].history for s in range(3)] == [b.results[s].history for s in range(3)]
    assert [a.results[s].final["train_loss"] for s in range(3)] != [
        plain.results[s].final["train_loss"] for s in range(3)
    ]
    # saved after epoch 2 (of 3) and continued on a fresh trainer: the augmentation streams go on where they were
    saved = {}
    trainer().fit(3, checkpoint=lambda t: t.epoch == 2 and saved.update(state=copy.deepcopy(t.state_dict())))
    resumed = trainer()
    resumed.restore(saved["state"])
    resumed.fit(3)
    assert [resumed.results[s].history for s in range(3)] == [a.results[s].history for s in range(3)]


def test_train_and_a_space_take_an_augmentation(tiny_data):
    run = hfta_nas.train(
        conv_bn_model,
        dataset=tiny_data,
        seeds=[0, 1],
        epochs=1,
        batch_size=16,
        dtype="float64",
        augmentation=Augmentation(flip=True),
    )
    assert all(r.status == "completed" for r in run.results.values())


def test_bad_augmentations_are_clear_errors():
    with pytest.raises(HftaNasError, match="shift must be an integer >= 0"):
        Augmentation(shift=-1)
    with pytest.raises(HftaNasError, match="mixup must be a finite number >= 0"):
        Augmentation(mixup=float("nan"))
    x = torch.zeros(1, 4, 10, dtype=torch.float64)
    with pytest.raises(HftaNasError, match="need 1-D"):
        SlotAugmenter(Augmentation(flip=True), [0])(x, torch.zeros(1, 4, dtype=torch.long))
    assert np.isfinite(SlotAugmenter(Augmentation(noise=0.1, mixup=0.3), [0])(x, torch.zeros(1, 4)).x.numpy()).all()


def test_a_space_with_augmentation_searches_and_exports_it(tmp_path):
    from tests.test_search import search, space_text

    text = space_text(
        budget={"n_trials": 2},
        data={"dataset": "digits", "batch_size": 64},
        training={
            "epochs": 1,
            "optimizer": {"name": "adam", "lr": 1e-3},
            "augment": {"shift": 1, "flip": True, "mixup": 0.2},
        },
    )
    summary = search(tmp_path, text)
    assert summary.trials == {"COMPLETE": 2}
    exported = (tmp_path / "out" / "best_config.yaml").read_text()
    assert "augment:" in exported and "mixup: 0.2" in exported
