"""The one place that reads Optuna's private attributes.

The search writes trial attributes, states and heartbeats through the study's
storage directly (a trial held by another worker, a study's system
attributes), which Optuna's public API does not offer. Every such access goes
through these functions, so that an Optuna upgrade that renames them breaks
this file and nothing else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import optuna
from optuna.storages import BaseStorage
from optuna.storages._heartbeat import BaseHeartbeat as BaseHeartbeat
from optuna.trial import TrialState

from hfta_nas.errors import HftaNasError  # storages with heartbeats inherit it


@contextlib.contextmanager
def optimize_loop(study: optuna.Study) -> Iterator[None]:
    """While the block runs, `study.stop()` works as inside `study.optimize` (a callback may call it, as
    Optuna's MaxTrialsCallback does); `stop_requested` then says so."""
    if study._thread_local.in_optimize_loop:
        raise HftaNasError("hfta_nas.optimize was called inside another study.optimize or optimize of this study.")
    study._stop_flag = False
    study._thread_local.in_optimize_loop = True
    try:
        yield
    finally:
        study._thread_local.in_optimize_loop = False


def stop_requested(study: optuna.Study) -> bool:
    """Whether `study.stop()` was called in this optimize loop."""
    return bool(study._stop_flag)


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage a study reads and writes."""
    return study._storage


def study_id(study: optuna.Study) -> int:
    """The study's id in its storage."""
    return study._study_id


def grpc_proxy_server(storage: BaseStorage, host: str, port: int):
    """Optuna's gRPC storage proxy server for `storage`, not started: what `run_grpc_proxy_server`
    runs, without its blocking wait (so the caller can say when it listens, and stop it)."""
    from optuna.storages._grpc.server import make_server

    return make_server(storage, host, port)


def trial_id(trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
    """A trial's id in its storage (unique across the storage's studies, unlike its number)."""
    return trial._trial_id


def random_startup(sampler: optuna.samplers.BaseSampler) -> tuple[int, tuple[TrialState, ...]] | None:
    """How many finished trials, in which states, the sampler waits for before its draws follow results
    (TPE, GP and CMA-ES draw at random until then); None for a sampler without such a start."""
    if isinstance(sampler, optuna.samplers.TPESampler):
        return sampler._n_startup_trials, (TrialState.COMPLETE, TrialState.PRUNED)
    if isinstance(sampler, optuna.samplers.GPSampler | optuna.samplers.CmaEsSampler):
        return sampler._n_startup_trials, (TrialState.COMPLETE,)
    return None
