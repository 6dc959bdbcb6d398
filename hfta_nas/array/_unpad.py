"""An envelope whose remaining slots share their shapes becomes an array of those shapes.

Slots of different sizes train padded into an envelope. When the slots that made it wide end
(pruned, stopped early, failed), the survivors would go on paying the padding at every step,
and a survivor left alone would pay an envelope's machinery for nothing: on a search's CPU that
made a pruned array slower than training its trial alone (issue 43). So once the survivors share
their shapes, the array rebuilds itself from their own models, and every number moves over:

- weights and buffers, through each slot's own state_dict;
- dropout counters, matched by each layer's path in the slot's own model, where its stream comes
  from, so every later mask is the one the envelope would have drawn (`own_counters`);
- whatever is attached and holds [B, P] rows of `flat`'s layout (optimizer state), through the
  conversion `own_rows` makes, each slot's own entries in the new layout.

Plain Python attributes a forward changed on the envelope's template (a step counter) are set on
the new template. Where the change cannot be exact, the envelope keeps its padding: buffers a
state_dict leaves out (persistent=False), per-slot dropout rates, survivors a one-shape array
refuses (settings that differ at equal shapes), a dropout layer without a counterpart, or a new
array that does not fit in memory.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from hfta_nas._python_state import PythonState, carry, changes
from hfta_nas.array._envelope_slots import EnvelopeSlots
from hfta_nas.array._layout import FlatLayout
from hfta_nas.array._signature import equal_shapes
from hfta_nas.envelope._probe import with_own_dropout
from hfta_nas.layers._slot_layers import own_dropout_path


def own_models(slots: EnvelopeSlots, states: Sequence[Mapping[str, torch.Tensor]]) -> list[nn.Module] | None:
    """Each slot's own model holding `states[slot]`, or None unless they all share their shapes."""
    models = []
    for slot, state in enumerate(states):
        if slot in slots.verified:  # the probe's copy, its dropout turned off
            model = with_own_dropout(copy.deepcopy(slots.verified[slot]))
        elif slot in slots.unverified:
            model = copy.deepcopy(slots.unverified[slot])
        else:
            return None
        model.load_state_dict(state)
        models.append(model)
    return models if equal_shapes(models) else None


def carry_python_state(template: nn.Module, initial: PythonState, slots: EnvelopeSlots, target: nn.Module) -> None:
    """Set on `target` (the own array's template) the plain Python attributes a forward changed on the
    envelope's `template` since `initial` (a step counter), module by module; the array's own marks
    (`_hfta_...`, such as where each slot sits in a convolution) stay the envelope's."""
    changed = {
        path: {name: value for name, value in values.items() if not name.startswith("_hfta")}
        for path, values in changes(template, initial).items()
    }
    own_to_envelope = dict(slots.embeddings[0].modules)  # the survivors share their shapes and places
    own_to_envelope.setdefault("", "")
    carry(changed, target, {own: env for own, env in own_to_envelope.items() if _has_module(target, own)})


def _has_module(root: nn.Module, path: str) -> bool:
    try:
        root.get_submodule(path)
    except AttributeError:
        return False
    return True


def keeps_unsaved_buffers(array_buffers: Mapping[str, torch.Tensor], state_keys: Sequence[str]) -> bool:
    """Whether the model has buffers its state_dict leaves out (registered with persistent=False):
    a slot's own state_dict cannot carry their values over."""
    return bool(set(array_buffers) - set(state_keys))


def own_rows(
    slots: EnvelopeSlots, layout: FlatLayout, own_layout: FlatLayout
) -> Callable[[torch.Tensor], torch.Tensor]:
    """rows [B, P] in the envelope's layout -> [B, P'] in `own_layout`: each slot's own entries."""

    def convert(rows: torch.Tensor) -> torch.Tensor:
        views = layout.views(rows)
        own = [slots.state_dict(slot, views, None) for slot in range(len(slots.embeddings))]
        return torch.stack([torch.cat([o[name].reshape(-1) for name, _, _ in own_layout.entries]) for o in own])

    return convert


def own_counters(
    slots: EnvelopeSlots, envelope_random: Mapping[str, torch.Tensor], own_random: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor] | None:
    """The own array's dropout state with the envelope's call counters: its `calls` [B] per layer,
    each slot's taken from the envelope layer that stands for it; None where a layer's key differs
    (another stream) or has no counterpart."""
    envelope_layers = [name.removesuffix("calls") for name in envelope_random if name.endswith("calls")]
    per_slot = [_own_to_envelope_layers(emb.modules, envelope_layers) for emb in slots.embeddings]
    result = dict(own_random)
    for name, own_calls in own_random.items():
        if not name.endswith("calls"):
            continue
        layer = name.removesuffix("calls")  # "path." or "" for the root
        if any(layer not in layers for layers in per_slot):
            return None
        places = [layers[layer] for layers in per_slot]
        keys = torch.stack([envelope_random[env + "slot_key"][slot] for slot, env in enumerate(places)])
        if not torch.equal(keys, own_random[layer + "slot_key"]):
            return None
        counts = [envelope_random[env + "calls"][slot] for slot, env in enumerate(places)]
        result[name] = torch.stack(counts).to(own_calls.dtype)
    return result


def _own_to_envelope_layers(own_to_envelope: Mapping[str, str], envelope_layers: Sequence[str]) -> dict[str, str]:
    """For a slot placed by `own_to_envelope` (its own module paths -> the envelope's): each envelope
    dropout layer's name prefix ("path." or "") under the prefix of the own layer whose stream it draws."""
    envelope_to_own = {env: own for own, env in own_to_envelope.items()}
    result = {}
    for env in envelope_layers:
        own = own_dropout_path(env.removesuffix("."), envelope_to_own)
        result[f"{own}." if own else ""] = env
    return result
