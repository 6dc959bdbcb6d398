"""Replaying a per-epoch hyper-parameter schedule (a PBT member's `pbt_schedule`): exact against a
plain PyTorch loop that sets its param groups at each epoch start (float64, 1e-10), other slots of
the array untouched, a killed run resumed bit-identically, carried by config files (refused in one
located line when it cannot be replayed), and end to end: the members of a PBT study re-trained
from scratch with their schedules end where PBT left them, and `hfta-nas stability --study` re-runs
the best one across seeds."""

import numpy as np
import optuna
import pytest
import torch
from click.testing import CliRunner
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import hfta_nas
from hfta_nas import HftaNasError
from hfta_nas.cli import main
from hfta_nas.data import load_dataset
from hfta_nas.search import open_storage
from hfta_nas.search._candidate import trial_seeds
from hfta_nas.search_spaces import ResolvedConfig, SpaceError
from hfta_nas.stability._configs import DEFAULT_CONFIG, load_config, top_k_configs
from hfta_nas.stability._design import SeedPlan
from hfta_nas.stability._runner import train_slots
from tests.test_stability import stability_json

EPOCHS, BATCH = 4, 16
SEEDS, DATA_SEEDS = [3, 1, 4], [10, 11, 12]


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(24, 16), nn.Tanh(), nn.Linear(16, 3))


# (optimizer, starting hyper-parameters, LR schedule, per-epoch schedule, lr factor of the LR schedule at epoch e)
CASES = {
    "sgd": (
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0},
        None,
        {"lr": [0.1, 0.05, 0.2, 0.02], "momentum": [0.9, 0.5, 0.7, 0.9], "weight_decay": [0.0, 1e-3, 1e-2, 0.0]},
        lambda e: 1.0,
    ),
    "adam": (  # under an LR schedule the schedule sets the base lr it scales
        {"lr": 1e-2, "weight_decay": 0.0},
        {"kind": "exponential", "gamma": 0.5},
        {"lr": [1e-2, 3e-2, 5e-3, 1e-2], "weight_decay": [0.0, 1e-2, 1e-3, 0.0], "beta1": [0.9, 0.8, 0.95, 0.9]},
        lambda e: 0.5**e,
    ),
}


def train_plain(data, slot, optimizer, hparams, schedule, factor):
    """One model alone: torch.optim, its param groups set at each epoch start, a shuffling DataLoader."""
    torch.manual_seed(SEEDS[slot])
    model = mlp().double()
    opt = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}[optimizer](model.parameters(), **hparams)
    loader = DataLoader(
        TensorDataset(data.x_train, data.y_train),
        batch_size=BATCH,
        shuffle=True,
        generator=torch.Generator().manual_seed(DATA_SEEDS[slot]),
    )
    for epoch in range(EPOCHS):
        for group in opt.param_groups:
            for name, values in schedule.items():
                if name == "lr":
                    group["lr"] = values[epoch] * factor(epoch)
                elif name == "beta1":
                    group["betas"] = (values[epoch], group["betas"][1])
                else:
                    group[name] = values[epoch]
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return model


def train_array(data, optimizer, hparams, lr_schedule, schedules, **options):
    return hfta_nas.train(
        mlp,
        dataset=data,
        seeds=SEEDS,
        data_seeds=DATA_SEEDS,
        optimizer=optimizer,
        hparams=hparams,
        schedule=lr_schedule,
        hparam_schedule=schedules,
        epochs=EPOCHS,
        batch_size=BATCH,
        dtype="float64",
        **options,
    )


def assert_close(state, model, rtol=1e-10):
    for key, expected in model.state_dict().items():
        torch.testing.assert_close(state[key], expected, rtol=rtol, atol=rtol * expected.abs().max().item())


@pytest.mark.parametrize("optimizer", sorted(CASES))
def test_a_scheduled_slot_equals_plain_pytorch_setting_its_param_groups_float64(tiny_data, optimizer):
    hparams, lr_schedule, schedule, factor = CASES[optimizer]
    run = train_array(tiny_data, optimizer, hparams, lr_schedule, [None, schedule, None])
    assert_close(run.array.slot_state_dict(1), train_plain(tiny_data, 1, optimizer, hparams, schedule, factor))
    # the schedule matters: the same slot without it ends elsewhere
    unscheduled = train_plain(tiny_data, 1, optimizer, hparams, {}, factor)
    assert not torch.allclose(run.array.slot_state_dict(1)["1.weight"], unscheduled.state_dict()["1.weight"])


@pytest.mark.parametrize("optimizer", sorted(CASES))
def test_the_other_slots_are_untouched(tiny_data, optimizer):
    hparams, lr_schedule, schedule, _ = CASES[optimizer]
    scheduled = train_array(tiny_data, optimizer, hparams, lr_schedule, [None, schedule, None])
    plain = train_array(tiny_data, optimizer, hparams, lr_schedule, None)
    # to rounding, not bitwise: CPU's fused Adam kernel updates the slots in blocks of equal hyper-parameters,
    # and a block's length changes how its elements are vectorised (differences ~1e-17)
    for slot in (0, 2):
        assert len(scheduled.results[slot].history) == len(plain.results[slot].history) == EPOCHS
        for got, want in zip(scheduled.results[slot].history, plain.results[slot].history):
            assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
        model = mlp().double()
        model.load_state_dict(plain.array.slot_state_dict(slot))
        assert_close(scheduled.array.slot_state_dict(slot), model, rtol=1e-12)


class Killed(Exception):
    pass


def test_a_killed_scheduled_run_resumes_bit_identically(tiny_data, tmp_path):
    hparams, lr_schedule, schedule, _ = CASES["adam"]
    path = tmp_path / "train.pt"

    def killed_in_epoch_3(report, trainer):
        if report.epoch == 3:  # epoch 2's checkpoint is written (with epoch 3's values set), epoch 3's not
            raise Killed

    with pytest.raises(Killed):
        train_array(tiny_data, "adam", hparams, lr_schedule, schedule, checkpoint=path, on_epoch=killed_in_epoch_3)
    other = {**schedule, "lr": [1e-3] * EPOCHS}  # another schedule: a new run, not this checkpoint's
    assert train_array(tiny_data, "adam", hparams, lr_schedule, other, checkpoint=path).resumed_epoch == 0
    assert not path.exists()
    with pytest.raises(Killed):
        train_array(tiny_data, "adam", hparams, lr_schedule, schedule, checkpoint=path, on_epoch=killed_in_epoch_3)
    resumed = train_array(tiny_data, "adam", hparams, lr_schedule, schedule, checkpoint=path)
    reference = train_array(tiny_data, "adam", hparams, lr_schedule, schedule)
    assert resumed.resumed_epoch == 2
    for slot in range(len(SEEDS)):
        assert resumed.results[slot].history == reference.results[slot].history
        for key, value in reference.array.slot_state_dict(slot).items():
            assert torch.equal(resumed.array.slot_state_dict(slot)[key], value)


def test_train_refuses_a_schedule_it_cannot_replay(tiny_data):
    cases = [
        ({"lr": [0.1] * 3}, r"hparam_schedule\['lr'\]: has 3 values for 4 epochs"),
        ({"momentum": [0.1] * 4}, r"hparam_schedule\['momentum'\]: Adam has no per-slot hyper-parameter 'momentum'"),
        ({"lr": [0.1, float("nan"), 0.1, 0.1]}, r"\['lr'\]\[1\]: epoch 2: expected a finite number >= 0, got nan"),
        ([{"lr": [0.1] * 4}], r"hparam_schedule has 1 entries for 3 slots"),
        ([None, {"lr": [0.1, 0.1, -1.0, 0.1]}, None], r"hparam_schedule\[1\]\['lr'\]\[2\]: epoch 3: .*got -1.0"),
    ]
    for schedule, message in cases:
        with pytest.raises(HftaNasError, match=message):
            train_array(tiny_data, "adam", {"lr": 1e-2}, None, schedule)


# ------------------------------------------------------------------ config files
@pytest.fixture
def config():
    base = load_config(DEFAULT_CONFIG)  # adam, 8 epochs
    schedule = {"lr": [3e-3 * 1.7**e for e in range(base.epochs)], "weight_decay": [1e-4] * base.epochs}
    return ResolvedConfig(**{**base.__dict__, "hparam_schedule": schedule})


def test_a_schedule_round_trips_through_a_config_file(config, tmp_path):
    path = config.save(tmp_path / "best_config.yaml", study="s", trial=3)
    again = load_config(path)
    assert again == config and again.hparam_schedule == config.hparam_schedule  # exact floats
    assert again.train_kwargs()["hparam_schedule"] == config.hparam_schedule
    assert "hparam_schedule" not in load_config(DEFAULT_CONFIG).to_yaml()  # written only where set


BAD = [
    ("lr: [0.1, 0.2]", "hparam_schedule.lr: has 2 values for 8 epochs; expected one per epoch"),
    ("momentum: [0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]", "Adam has no per-slot hyper-parameter 'momentum'"),
    ("lr: [0.1, 0.1, .nan, 0.1, 0.1, 0.1, 0.1, 0.1]", "hparam_schedule.lr[2]: epoch 3: expected a finite number"),
    ("lr: [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, .inf]", "hparam_schedule.lr[7]: epoch 8: expected a finite number"),
    ("weight_decay: [0, 0, 0, -1.0e-3, 0, 0, 0, 0]", "hparam_schedule.weight_decay[3]: epoch 4: expected a finite"),
    ("beta1: [0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 1.0]", "hparam_schedule.beta1[7]: epoch 8: expected a number in"),
    ("lr: fast", "hparam_schedule.lr: expected a list of 8 values (one per epoch), got 'fast'"),
    ("lr: [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, x]", "hparam_schedule.lr[7]: epoch 8: expected a number, got 'x'"),
]


@pytest.mark.parametrize("entry,message", BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_a_bad_schedule_is_refused_in_one_located_line(config, tmp_path, entry, message):
    head = ResolvedConfig(**{**config.__dict__, "hparam_schedule": None, "origin": {}}).to_yaml()
    path = tmp_path / "bad.yaml"
    path.write_text(f"{head}hparam_schedule:\n  {entry}\n")
    with pytest.raises(SpaceError) as error:
        load_config(path)
    where = f"{path}:{head.count(chr(10)) + 2}: "  # the entry's own line
    assert str(error.value).startswith(where) and message in str(error.value), str(error.value)
    assert "\n" not in str(error.value)


def test_a_schedule_longer_than_the_overridden_epochs_is_refused(config, tmp_path):
    path = config.save(tmp_path / "c.yaml")
    with pytest.raises(SpaceError, match=r"c\.yaml:\d+: hparam_schedule\.lr: has 8 values for 3 epochs"):
        load_config(path, overrides=["epochs=3"])


def test_a_schedule_that_is_not_a_mapping_is_refused(config, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(config.to_yaml().split("hparam_schedule:")[0] + "hparam_schedule: [0.1, 0.2]\n")
    with pytest.raises(SpaceError, match=r"c\.yaml:\d+: hparam_schedule: expected a mapping"):
        load_config(path)


# ------------------------------------------------------------------ end to end
PBT_SPACE = """\
study: {{name: tiny-pbt, metrics: [val_loss], directions: [minimize]}}
pbt:
  population: 4
  interval: 2
  quantile: 0.5            # the worst 2 copy one of the best 2, after epochs 2 and 4
  explore:
    training.optimizer.lr: {{factors: [0.5, 2.0]}}
    training.optimizer.weight_decay: {{factors: [0.5, 2.0]}}
data: {{dataset: {data}, batch_size: 20, val_fraction: 0.2, test_fraction: 0.2}}
training:
  epochs: 6
  optimizer: {{name: adam, lr: 1.0e-2}}
  schedule: {{kind: exponential, gamma: 0.8}}
model: {{family: mlp, config: {{width: 8, depth: 1}}}}
seed: 0
params:
  training.optimizer.lr: {{distribution: log_uniform, min: 1.0e-3, max: 1.0e-1}}
  training.optimizer.weight_decay: {{distribution: log_uniform, min: 1.0e-5, max: 1.0e-2}}
  training.optimizer.beta1: {{distribution: uniform, min: 0.8, max: 0.95}}   # searched, not explored
"""


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def pbt_study(tmp_path_factory):
    """A finished PBT run of a tiny MLP on 150 synthetic samples, in float64: (journal, study)."""
    folder = tmp_path_factory.mktemp("pbt")
    generator = np.random.default_rng(0)
    x = generator.normal(size=(150, 8))
    np.savez(folder / "data.npz", x=x, y=np.argmax(x[:, :3] + 0.5 * x[:, 3:6], axis=1))
    space = folder / "space.yaml"
    space.write_text(PBT_SPACE.format(data=folder / "data.npz"))
    journal = folder / "s.journal"
    ran = cli("search", space, "--storage", journal, "--out", folder / "best", "--dtype", "float64", "--quiet")
    assert ran.exit_code == 0, ran.output
    storage, _ = open_storage(str(journal))
    return journal, optuna.load_study(study_name="tiny-pbt", storage=storage)


def test_every_member_replayed_from_scratch_ends_where_pbt_left_it(pbt_study):
    """The members' configs from `top_k_configs`, each with its schedule and its root's seeds, trained in one
    array by the stability runner: each ends at its trial's value (and its values since its last exploit)."""
    journal, study = pbt_study
    members = {t.number: t for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))}
    assert len(members) == 4
    roots = {n: t.user_attrs["pbt_roots"][-1] for n, t in members.items()}
    assert any(root != n for n, root in roots.items())  # an exploit changed whose weights a member trains
    configs = top_k_configs(open_storage(str(journal))[0], "tiny-pbt", 4)
    assert [c.label for c in configs] == [
        f"trial {t.number} (PBT schedule)" for t in sorted(members.values(), key=lambda t: (t.value, t.number))
    ]
    slots = []
    for item in configs:
        trial = members[item.config.origin["trial"]]
        assert item.config.hparam_schedule == trial.user_attrs["pbt_schedule"]
        slots.append((item.config, SeedPlan("replay", trial.number, trial_seeds(0, roots[trial.number]))))
    config = configs[0].config
    data = load_dataset(config.dataset, **config.dataset_kwargs(), dtype=torch.float64)
    outcomes, _ = train_slots(slots, data, dtype="float64")
    for (item, _), outcome in zip(slots, outcomes):
        trial = members[item.origin["trial"]]
        last_exploit = max((e["epoch"] for e in trial.user_attrs["pbt_lineage"]), default=0)
        for row in outcome.history[last_exploit:]:
            assert row["val_loss"] == pytest.approx(trial.intermediate_values[row["epoch"]], rel=1e-10, abs=1e-12)
        assert outcome.history[-1]["val_loss"] == pytest.approx(trial.value, rel=1e-10)


def test_stability_study_reruns_the_best_members_schedule_across_seeds(pbt_study, tmp_path):
    journal, study = pbt_study
    (row,) = stability_json(journal, tmp_path / "r", "--study", "tiny-pbt", "--top-k", 1, "--seeds", 3)["configs"]
    assert row["config"] == f"trial {study.best_trial.number} (PBT schedule)" and row["n"] == 3
    stored = [
        s
        for s in optuna.get_all_study_summaries(open_storage(str(journal))[0])
        if s.study_name.startswith("stability:")
    ]
    assert len(stored) == 1 and "(PBT schedule)" in stored[0].study_name
