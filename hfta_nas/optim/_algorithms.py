"""SGD, Adam, AdamW, RMSprop and Adagrad over an array's [B, P] parameters.

Each `_update` mirrors torch.optim's single-tensor implementation of the same
name (torch 2.x), with every hyper-parameter a [B, 1] column so that slots
differ only in their numbers, never in code path. Where torch branches on a
hyper-parameter value (SGD momentum == 0), the branch is taken per slot with
`torch.where`.
"""

from __future__ import annotations

import torch

from hfta_nas.errors import HftaNasError
from hfta_nas.optim._optimizer import ArrayOptimizer


def _check_unit_interval(optimizer: ArrayOptimizer, name: str, values: torch.Tensor) -> None:
    if not ((values >= 0) & (values < 1)).all():
        raise HftaNasError(f"{type(optimizer).__name__}: '{name}' must be in [0, 1), got {values.tolist()}.")


def _blocks(tensor: torch.Tensor, runs: list[tuple[int, int]]) -> list[torch.Tensor]:
    """The contiguous row blocks tensor[a:b] of a [B, P] tensor."""
    return [tensor[start:end] for start, end in runs]


class SGD(ArrayOptimizer):
    """torch.optim.SGD per slot: lr, momentum, dampening, weight_decay per slot; nesterov, maximize shared."""

    defaults = {"lr": 1e-3, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0}
    flags = {"nesterov": False, "maximize": False}

    def _validate_all(self) -> None:
        super()._validate_all()
        if self.options["nesterov"] and (
            (self.hparams["momentum"] <= 0).any() or (self.hparams["dampening"] != 0).any()
        ):
            raise HftaNasError("SGD: nesterov momentum requires momentum > 0 and dampening = 0 in every slot.")

    def _fused_supported(self):
        return True

    def _fused_update(self, runs, param, grad, hp, step):
        momentum = hp["momentum"]
        buffers = [] if momentum == 0 else _blocks(self._state("momentum_buffer", param), runs)
        torch._fused_sgd_(
            _blocks(param, runs),
            _blocks(grad, runs),
            buffers,
            weight_decay=hp["weight_decay"],
            momentum=momentum,
            lr=hp["lr"],
            dampening=hp["dampening"],
            nesterov=self.options["nesterov"],
            maximize=self.options["maximize"],
            is_first_step=step == 1,
        )

    def _update(self, param, grad, hp):
        dtype = param.dtype
        if self.options["maximize"]:
            grad = -grad
        grad = grad + hp["weight_decay"].to(dtype) * param
        momentum = hp["momentum"].to(dtype)
        buf = self._state("momentum_buffer", param)
        # torch starts the buffer as a copy of the first gradient, then damps.
        buf.copy_(torch.where(self._first_step(), grad, buf * momentum + (1 - hp["dampening"]).to(dtype) * grad))
        nesterov = self.options["nesterov"]
        direction = grad + momentum * buf if nesterov else torch.where(hp["momentum"] == 0, grad, buf)
        param.sub_(hp["lr"].to(dtype) * direction)


class Adam(ArrayOptimizer):
    """torch.optim.Adam per slot: lr, betas, eps, weight_decay per slot; amsgrad, maximize shared."""

    defaults = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
    flags = {"amsgrad": False, "maximize": False}
    decoupled_weight_decay = False

    def _validate(self, name, values):
        super()._validate(name, values)
        if name in ("beta1", "beta2"):
            _check_unit_interval(self, name, values)

    def _fused_supported(self):
        return True

    def _fused_update(self, runs, param, grad, hp, step):
        states = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if self.options["amsgrad"] else [])
        blocks = [_blocks(self._state(name, param), runs) for name in states]
        kernel = torch._fused_adamw_ if self.decoupled_weight_decay else torch._fused_adam_
        kernel(
            _blocks(param, runs),
            _blocks(grad, runs),
            blocks[0],
            blocks[1],
            blocks[2] if len(blocks) > 2 else [],
            [torch.tensor(step, dtype=torch.float32)] * len(runs),
            lr=hp["lr"],
            beta1=hp["beta1"],
            beta2=hp["beta2"],
            weight_decay=hp["weight_decay"],
            eps=hp["eps"],
            amsgrad=self.options["amsgrad"],
            maximize=self.options["maximize"],
        )

    def _update(self, param, grad, hp):
        dtype = param.dtype
        if self.options["maximize"]:
            grad = -grad
        if self.decoupled_weight_decay:
            param.mul_((1 - hp["lr"] * hp["weight_decay"]).to(dtype))
        else:
            grad = grad + hp["weight_decay"].to(dtype) * param
        exp_avg = self._state("exp_avg", param)
        exp_avg_sq = self._state("exp_avg_sq", param)
        exp_avg.lerp_(grad, (1 - hp["beta1"]).to(dtype))
        exp_avg_sq.mul_(hp["beta2"].to(dtype)).add_(grad * grad * (1 - hp["beta2"]).to(dtype))
        step = self._step_count()
        bias_correction1 = 1 - hp["beta1"] ** step
        bias_correction2_sqrt = (1 - hp["beta2"] ** step) ** 0.5
        step_size = hp["lr"] / bias_correction1
        if self.options["amsgrad"]:
            max_exp_avg_sq = self._state("max_exp_avg_sq", param)
            torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
            second_moment = max_exp_avg_sq
        else:
            second_moment = exp_avg_sq
        denom = (second_moment.sqrt() / bias_correction2_sqrt.to(dtype)).add_(hp["eps"].to(dtype))
        param.sub_(exp_avg / denom * step_size.to(dtype))


class AdamW(Adam):
    """torch.optim.AdamW per slot: Adam with decoupled weight decay (default 1e-2)."""

    defaults = {**Adam.defaults, "weight_decay": 1e-2}
    decoupled_weight_decay = True


class RMSprop(ArrayOptimizer):
    """torch.optim.RMSprop per slot: lr, alpha, eps, weight_decay, momentum per slot; centered, maximize shared."""

    defaults = {"lr": 1e-2, "alpha": 0.99, "eps": 1e-8, "weight_decay": 0.0, "momentum": 0.0}
    flags = {"centered": False, "maximize": False}

    def _update(self, param, grad, hp):
        dtype = param.dtype
        if self.options["maximize"]:
            grad = -grad
        grad = grad + hp["weight_decay"].to(dtype) * param
        alpha = hp["alpha"].to(dtype)
        square_avg = self._state("square_avg", param)
        square_avg.mul_(alpha).add_(grad * grad * (1 - hp["alpha"]).to(dtype))
        if self.options["centered"]:
            grad_avg = self._state("grad_avg", param)
            grad_avg.lerp_(grad, (1 - hp["alpha"]).to(dtype))
            avg = (square_avg - grad_avg * grad_avg).sqrt_()
        else:
            avg = square_avg.sqrt()
        avg = avg.add_(hp["eps"].to(dtype))
        # With momentum 0 the buffer is just grad / avg, torch's other branch.
        buf = self._state("momentum_buffer", param)
        buf.mul_(hp["momentum"].to(dtype)).add_(grad / avg)
        param.sub_(hp["lr"].to(dtype) * buf)


class Adagrad(ArrayOptimizer):
    """torch.optim.Adagrad per slot: lr, lr_decay, weight_decay, initial_accumulator_value, eps per slot."""

    defaults = {"lr": 1e-2, "lr_decay": 0.0, "weight_decay": 0.0, "initial_accumulator_value": 0.0, "eps": 1e-10}
    flags = {"maximize": False}

    def _update(self, param, grad, hp):
        dtype = param.dtype
        if self.options["maximize"]:
            grad = -grad
        grad = grad + hp["weight_decay"].to(dtype) * param
        state_sum = self._state("sum", param, fill=hp["initial_accumulator_value"].to(dtype))
        clr = hp["lr"] / (1 + (self._step_count() - 1) * hp["lr_decay"])
        state_sum.add_(grad * grad)
        std = state_sum.sqrt().add_(hp["eps"].to(dtype))
        param.sub_(grad / std * clr.to(dtype))

    def _initial_state(self, name, slot):
        return self.hparams["initial_accumulator_value"][slot]
