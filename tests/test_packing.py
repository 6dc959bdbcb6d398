"""The packing policy alone (no training): structures never mix, every proposal lands in
exactly one array, the waste bound holds, and the cut follows the device's step cost."""

import optuna
import pytest
import torch

from hfta_nas import Candidate
from hfta_nas.envelope._probe import model_macs
from hfta_nas.models import model_factory
from hfta_nas.search import StepCost
from hfta_nas.search._candidate import Proposal, example_input, meta_shell, trial_seeds
from hfta_nas.search._packing import pack, shape_key, structure_groups
from tests.conftest import synthetic_dataset

optuna.logging.set_verbosity(optuna.logging.WARNING)
DATA = synthetic_dataset(n_train=200, shape=(1, 40), classes=10)
LAUNCH_BOUND = StepCost(fixed_s=1e-2, per_gmac_s=0.0)  # a GPU with small models: every step costs the same
ARITHMETIC_BOUND = StepCost(fixed_s=0.0, per_gmac_s=1.0)  # a CPU: a step costs what it computes


def proposals(configs, family="cnn1d"):
    """One asked trial per model config, as the search makes them (meta-device models)."""
    study = optuna.create_study()
    made = []
    for config in configs:
        trial = study.ask()
        factory = model_factory(family, config, input_shape=DATA.input_shape, num_classes=DATA.num_classes)
        candidate = Candidate(factory, data=DATA, batch_size=50).checked(None)
        shell = meta_shell(candidate)
        made.append(
            Proposal(trial, candidate, trial_seeds(0, trial.number), shell, model_macs(shell, example_input(candidate)))
        )
    return made


TWO_LAYER = [{"channels": [c, c], "kernel_size": k, "pool": "max"} for c in (8, 16, 32) for k in (3, 5)]
THREE_LAYER = [{"channels": [16, 32, 32], "kernel_size": 5, "pool": "max"}]


def test_structures_never_mix_and_each_proposal_is_packed_once():
    asked = proposals(TWO_LAYER + THREE_LAYER + TWO_LAYER[:2])
    packs = pack(asked, max_slots=4, step_cost=ARITHMETIC_BOUND)
    numbers = sorted(p.number for planned in packs for p in planned.proposals)
    assert numbers == [p.number for p in asked]
    for planned in packs:
        depths = {sum(isinstance(m, torch.nn.Conv1d) for m in p.shell.modules()) for p in planned.proposals}
        assert len(depths) == 1  # a 3-layer CNN never shares an array with 2-layer ones
        assert len(planned.proposals) <= 4 and planned.useful_macs <= planned.executed_macs
    assert len(structure_groups(asked)) == 2


def test_a_launch_bound_device_packs_full_arrays_and_an_arithmetic_bound_one_cuts_by_size():
    asked = proposals(TWO_LAYER)
    launch = pack(asked, max_slots=6, step_cost=LAUNCH_BOUND)
    assert [len(p.proposals) for p in launch] == [6]  # padding is free there: one array
    arithmetic = pack(asked, max_slots=6, step_cost=ARITHMETIC_BOUND)
    assert len(arithmetic) > 1  # padding costs what it computes there: cheaper cut than one full array
    assert sum(p.seconds for p in arithmetic) < launch_total(asked)
    # each array of the cut holds neighbours in size: the small models are not padded to the big ones
    assert all(p.waste < launch[0].waste for p in arithmetic)


def launch_total(asked):
    """The arithmetic-bound time of the one full array the launch-bound device would train."""
    [one] = pack(asked, max_slots=len(asked), step_cost=StepCost(1.0, 0.0))
    return asked[0].steps * ARITHMETIC_BOUND.seconds(one.executed_macs, asked[0].candidate.batch_size)


@pytest.mark.parametrize("bound", [0.0, 0.2, 0.5])
def test_the_waste_bound_holds_and_zero_packs_equal_shapes_only(bound):
    asked = proposals(TWO_LAYER + TWO_LAYER)
    packs = pack(asked, max_slots=8, step_cost=LAUNCH_BOUND, max_waste=bound)
    assert all(p.waste <= bound + 1e-12 for p in packs)
    if bound == 0.0:
        assert all(len({shape_key(q) for q in p.proposals}) == 1 for p in packs)
        assert sorted(len(p.proposals) for p in packs) == [2] * 6  # the two copies of each shape together


def test_settings_an_array_shares_keep_candidates_apart():
    asked = proposals(TWO_LAYER[:2])
    asked[1].candidate = Candidate(asked[1].candidate.model, data=DATA, batch_size=25).checked(None)
    packs = pack(asked, max_slots=4, step_cost=LAUNCH_BOUND)
    assert len(packs) == 2  # one batch size per array


def test_an_envelope_is_counted_once_per_template_and_as_counted_alone(monkeypatch):
    """Sets of architectures with one envelope (an MLP's: its widest layer and its deepest stack) and the
    same skipped layers count its multiply-adds once, whatever their dropout rates, and each set gets what
    `envelope_macs` counts for it alone (None: the set cannot share an array)."""
    from hfta_nas.envelope import _probe
    from hfta_nas.errors import FusionError
    from hfta_nas.search import _shape_checks

    widths_depths = [(64, 3, 0.1), (256, 1, 0.2), (128, 2, 0.0), (256, 3, 0.3), (64, 1, 0.0), (128, 3, 0.2)]
    configs = [{"width": w, "depth": d, "dropout": p} for w, d, p in widths_depths]
    shells = [proposal.shell for proposal in proposals(configs, family="mlp")]
    # four sets 3 deep and 256 wide with gates on layers 2 and 3 (per-slot dropout rates, or one), one with
    # no gate, one 2 deep and 128 wide, and two that cannot share an array (depths 3 and 2)
    sets = [(0, 1), (1, 3), (3, 4), (1, 5), (0, 3), (2, 4), (0, 2), (2, 3)]
    counted = []
    real = _probe._sized
    monkeypatch.setattr(_probe, "_sized", lambda *a: counted.append(1) or real(*a))
    checks = _shape_checks.ShapeChecks()
    got = [checks.envelope_macs([shells[i] for i in s], DATA.input_shape) for s in sets]
    assert len(counted) == 3
    x = torch.empty(1, *DATA.input_shape, device="meta")

    def alone(indices):
        try:
            return _probe.envelope_macs([shells[i] for i in indices], x)
        except FusionError:
            return None

    assert got == [alone(s) for s in sets] and got[-2:] == [None, None]
    assert got[0] == got[3] > max(model_macs(shells[i], x) for i in (0, 1, 5))  # the envelope's, not a member's


class _Halves(torch.nn.Module):
    """A block whose forward halves the feature map: a skip gate cannot stand in for it (shapes differ)."""

    def __init__(self, channels):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))[..., ::2, ::2]


def test_a_set_whose_skipped_layer_changes_shapes_is_refused_whatever_was_counted_before():
    """Its envelope has the template of a set that needs no skip gate there, but running the gate refuses
    it: the count kept for the other set must not stand in for that refusal."""
    from hfta_nas.search import _shape_checks

    def net(channels, blocks):
        layers = [torch.nn.Conv2d(3, channels, 3, padding=1), *(_Halves(channels) for _ in range(blocks))]
        return torch.nn.Sequential(
            *layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(channels, 10)
        ).to("meta")

    shallow, deep, narrow_deep = net(16, 1), net(16, 2), net(8, 2)
    checks = _shape_checks.ShapeChecks()
    assert checks.envelope_macs([narrow_deep, deep], (3, 8, 8)) > 0
    assert checks.envelope_macs([shallow, deep], (3, 8, 8)) is None
