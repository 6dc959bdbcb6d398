"""The packing policy: asked candidates in, arrays out. Pure: nothing trains here.

1. Structures never mix. Candidates share an array only when their shared
   settings are equal (data, batch size, epochs, optimizer class and flags,
   loss) and the engine can pad their models into one envelope
   (`hfta_nas.check_fusable`, the one definition of "fusable"). Each
   candidate joins the first group, in ask order, that it fuses with.
2. Within a group, the packing that minimises the estimated time of the
   round wins. Candidates are sorted by their own multiply-adds, and arrays
   are runs of neighbours in that order (small with small, big with big);
   dynamic programming picks the cut points. An array of slots s costs its
   fixed `array_s` plus steps x the step seconds of |s| slots of its envelope
   (`_cost.StepCurve`, measured): on a device whose steps are launch-bound
   one full array wins; where arithmetic dominates,
   padding a small model into a big envelope costs what it computes and the
   policy cuts. Arrays hold at most `max_slots`, and none pads more than
   `max_waste` (the executed multiply-adds not needed by the slots' own models).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from hfta_nas.envelope._probe import padding_fraction
from hfta_nas.search._candidate import Proposal
from hfta_nas.search._cost import StepCost, StepCurve
from hfta_nas.search._shape_checks import ShapeChecks, architecture_key


@dataclass
class Pack:
    """One array the policy forms: its proposals and what it is expected to cost."""

    proposals: list[Proposal]
    useful_macs: int  # per sample, summed over slots: their own models
    executed_macs: int  # per sample, summed over slots: the envelope, once per slot
    seconds: float  # estimated training time
    array_size: int = 0  # the most slots the array may hold (its group's); 0: as many as it starts with

    @property
    def waste(self) -> float:
        """Fraction of the executed multiply-adds that is padding."""
        return padding_fraction(self.useful_macs, self.executed_macs)

    @property
    def architectures(self) -> int:
        """Distinct models among the slots (by tensor shapes and structure)."""
        return len({shape_key(p) for p in self.proposals})


def shape_key(proposal: Proposal) -> str:
    """Equal for proposals whose models have equal structure and tensor shapes (one architecture)."""
    return architecture_key(proposal.shell)


def structure_key(proposal: Proposal) -> str:
    """Layer types in order and the shared settings: what one step-cost measurement covers
    (stable across runs, so a resumed run finds the cost it measured)."""
    kinds = [type(m).__name__ for m in proposal.shell.modules()]
    return hashlib.sha1(repr((kinds, proposal.candidate.stable_settings())).encode()).hexdigest()[:12]


def cost_key(proposal: Proposal) -> str:
    """What a step's cost depends on: layer types in order, the data's shape, batch size,
    optimizer, loss, accumulation, augmentation and precision (not epochs or early stopping:
    a step costs the same however many there are). Stable across runs and searches."""
    candidate = proposal.candidate
    kinds = [type(m).__name__ for m in proposal.shell.modules()]
    settings = (
        tuple(candidate.data.input_shape),
        candidate.data.num_classes,
        candidate.batch_size,
        candidate.optimizer,
        tuple(sorted(candidate.flags().items())),
        candidate.loss_name(),
        candidate.accumulate,
        repr(candidate.augmentation),
        candidate.precision,
    )
    return hashlib.sha1(repr((kinds, settings)).encode()).hexdigest()[:12]


def structure_groups(proposals: Sequence[Proposal], shapes: ShapeChecks | None = None) -> list[list[Proposal]]:
    """Proposals split into groups that may share arrays (step 1 of the module docstring)."""
    shapes = shapes or ShapeChecks()
    groups: list[list[Proposal]] = []
    for proposal in proposals:
        for group in groups:
            if group[0].candidate.shared_settings() != proposal.candidate.shared_settings():
                continue
            if not shapes.fusable([p.shell for p in group] + [proposal.shell]):
                continue
            group.append(proposal)
            break
        else:
            groups.append([proposal])
    return groups


@dataclass(frozen=True)
class Group:
    """Proposals that may share arrays (`structure_groups`), with the numbers the policy needs:
    the most slots one of their arrays may have, and their structure's step cost on this device."""

    proposals: list[Proposal]
    max_slots: int
    cost: StepCost | StepCurve


def pack(
    proposals: Sequence[Proposal],
    *,
    max_slots: int,
    step_cost: StepCost | StepCurve,
    max_waste: float | None = None,
    shapes: ShapeChecks | None = None,
) -> list[Pack]:
    """`pack_groups` with the same array size and step cost for every group."""
    shapes = shapes or ShapeChecks()
    groups = [Group(g, max_slots, step_cost) for g in structure_groups(proposals, shapes)]
    return pack_groups(groups, max_waste=max_waste, shapes=shapes)


def pack_groups(
    groups: Sequence[Group], *, max_waste: float | None = None, shapes: ShapeChecks | None = None
) -> list[Pack]:
    """The arrays for the groups' proposals, each proposal in exactly one, in the order they train
    (by their earliest trial). Numbers in, arrays out: nothing is measured or written here; `shapes`
    keeps envelopes' multiply-adds from one call to the next."""
    shapes = shapes or ShapeChecks()
    packs: list[Pack] = []
    for group in groups:
        packs.extend(_cheapest_cut(group.proposals, group.max_slots, group.cost, max_waste, shapes))
    return sorted(packs, key=lambda p: min(q.number for q in p.proposals))


def _cheapest_cut(
    group: list[Proposal], max_slots: int, cost: StepCost | StepCurve, max_waste: float | None, shapes: ShapeChecks
) -> list[Pack]:
    """Step 2 of the module docstring: the cheapest cut of the sorted group into runs."""
    ordered = sorted(group, key=lambda p: (p.useful_macs, p.number))
    input_shape = ordered[0].candidate.data.input_shape
    batch, steps = ordered[0].candidate.batch_size, ordered[0].steps

    def per_slot_macs(run: list[Proposal]) -> int | None:
        return shapes.envelope_macs([p.shell for p in run], input_shape)

    def priced(run: list[Proposal]) -> Pack | None:
        per_slot = per_slot_macs(run)
        if per_slot is None:
            return None
        useful = sum(p.useful_macs for p in run)
        executed = per_slot * len(run)
        seconds = cost.array_s + steps * cost.seconds(executed, batch, len(run))
        result = Pack(list(run), useful, executed, seconds, max_slots)
        if max_waste is not None and len(run) > 1 and result.waste > max_waste + 1e-12:
            return None
        return result

    # Each array also costs a nanosecond here, so that on a tie (a step cost with no fixed
    # part, rounding) fewer arrays win and the cut does not depend on float noise.
    best: list[tuple[float, list[Pack]]] = [(0.0, [])]
    for end in range(1, len(ordered) + 1):
        options = []
        for start in range(max(0, end - max_slots), end):
            run = priced(ordered[start:end])
            if run is not None and best[start][0] != float("inf"):
                options.append((best[start][0] + run.seconds + 1e-9, best[start][1] + [run]))
        best.append(min(options, key=lambda o: o[0]) if options else (float("inf"), []))
    return best[-1][1]
