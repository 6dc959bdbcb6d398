"""Work that depends only on an architecture, done once per architecture.

Asking a trial checks its model's outputs against the data and counts its
multiply-adds, both with a forward on the meta device; packing counts the
multiply-adds of envelopes over sets of architectures. A search meets the
same computations again and again (TPE revisits what works), so each result
is kept under the model's `compute_key` (module structure and settings, and
tensor shapes, without dropout rates: a rate changes neither output shapes nor
multiply-adds) together with what else it depends on: the input shape, the
number of classes and the loss. Different sets of architectures often have one
envelope (an MLP's is its widest layer and its deepest stack), so an envelope's
multiply-adds are also kept under its template's key (`template_key`): counting them
(a forward on the meta device) costs about twice what building the template does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.modules.dropout import _DropoutNd

from hfta_nas.array._model_array import check_fusable
from hfta_nas.envelope._probe import envelope_template, model_macs, template_macs
from hfta_nas.errors import FusionError
from hfta_nas.layers import SlotDropout
from hfta_nas.search._candidate import Candidate, check_outputs, example_input, tensor_shapes

# Layers whose settings change neither output shapes nor multiply-adds (a dropout rate, or channel dims).
_RATE_ONLY = (_DropoutNd, SlotDropout)


def architecture_key(shell: nn.Module) -> str:
    """Equal for models of equal structure, settings and tensor shapes: one architecture."""
    text = repr(shell) + repr(tensor_shapes(shell))
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def compute_key(shell: nn.Module) -> str:
    """Equal for models that compute the same shapes with the same multiply-adds: module types
    and settings in order, and tensor shapes; dropout rates left out."""
    return _digest(shell, tensor_shapes(shell))


def template_key(template: nn.Module) -> str:
    """`compute_key` of an envelope's template, without the dropout layers' per-slot key, counter and
    rates, which change no multiply-add: sets of architectures with one envelope and the same skipped
    layers share it (an MLP's: its widest layer and deepest stack). Which layers have a skip gate stays
    in it: a gate refuses a skipped layer that changes its input's shape when the template runs."""
    owners = dict(template.named_modules())
    shapes = [
        (name, shape) for name, shape in tensor_shapes(template) if not isinstance(owners[_owner(name)], _RATE_ONLY)
    ]
    return _digest(template, shapes)


def _owner(tensor_name: str) -> str:
    """The path of the module a parameter or buffer belongs to ('' for the root's own)."""
    return tensor_name.rpartition(".")[0]


def _digest(model: nn.Module, shapes: list[tuple[str, tuple[int, ...]]]) -> str:
    parts = [
        f"{name}:{type(m).__name__}({'' if isinstance(m, _RATE_ONLY) else m.extra_repr()})"
        for name, m in model.named_modules()
    ]
    return hashlib.sha1((repr(parts) + repr(shapes)).encode()).hexdigest()[:12]


class ShapeChecks:
    """Per-architecture output checks and multiply-adds, each computed once per search."""

    def __init__(self) -> None:
        self._macs: dict[tuple, int] = {}
        self._envelopes: dict[tuple, int | None] = {}
        self._templates: dict[tuple, int] = {}  # (template_key, input shape) -> its multiply-adds
        self._keys: dict[int, tuple[nn.Module, str]] = {}  # id(shell) -> (shell, its compute_key)
        self._architectures: dict[int, tuple[nn.Module, str]] = {}  # id(shell) -> (shell, its shape key)
        self._fusable: dict[frozenset[str], bool] = {}

    def fusable(self, shells: Sequence[nn.Module]) -> bool:
        """Whether the models can share one array (`hfta_nas.check_fusable`), once per set of
        architectures (shape keys: dropout rates included, as the array's layers see them)."""
        distinct: dict[str, nn.Module] = {}
        for shell in shells:
            known = self._architectures.get(id(shell))
            if known is None:
                known = self._architectures[id(shell)] = (shell, architecture_key(shell))
            distinct[known[1]] = shell
        key = frozenset(distinct)
        if key not in self._fusable:
            try:
                check_fusable(list(distinct.values()))
                self._fusable[key] = True
            except FusionError:
                self._fusable[key] = False
        return self._fusable[key]

    def key(self, shell: nn.Module) -> str:
        """`compute_key(shell)`, once per model object (the shell is held, so its id stays its own)."""
        known = self._keys.get(id(shell))
        if known is None:
            known = self._keys[id(shell)] = (shell, compute_key(shell))
        return known[1]

    def checked_macs(self, candidate: Candidate, shell: nn.Module) -> int:
        """`check_outputs` (HftaNasError for outputs the loss cannot take), then the model's
        multiply-adds per sample; both once per computation, data shape and loss."""
        data = candidate.data
        key = (self.key(shell), tuple(data.input_shape), data.num_classes, candidate.loss_name())
        if key not in self._macs:
            x = example_input(candidate)
            check_outputs(candidate, shell, x.expand(2, *data.input_shape))
            self._macs[key] = model_macs(shell, x)
        return self._macs[key]

    def envelope_macs(self, shells: Sequence[nn.Module], input_shape: Sequence[int]) -> int | None:
        """Multiply-adds per sample of one slot of an envelope over `shells` (meta models); None
        when they cannot share an envelope. Once per set of computations and input shape."""
        distinct = {self.key(shell): shell for shell in shells}
        key = (frozenset(distinct), tuple(input_shape))
        if key not in self._envelopes:
            try:
                self._envelopes[key] = self._counted(list(distinct.values()), tuple(input_shape))
            except FusionError:  # a subset that cannot share an envelope (rare: the whole group could)
                self._envelopes[key] = None
        return self._envelopes[key]

    def _counted(self, shells: list[nn.Module], input_shape: tuple[int, ...]) -> int:
        """Multiply-adds per sample of one slot of the envelope over `shells` (distinct computations),
        counted once per template."""
        x = torch.empty(1, *input_shape, device="meta")
        if len(shells) == 1:
            return model_macs(shells[0], x)
        template = envelope_template(shells)
        key = (template_key(template), input_shape)
        if key not in self._templates:
            self._templates[key] = template_macs(template, x)
        return self._templates[key]
