"""The one place that reads Optuna's private attributes.

The search writes trial attributes, states and heartbeats through the study's
storage directly (a trial held by another worker, a study's system
attributes), which Optuna's public API does not offer. Every such access goes
through these functions, so that an Optuna upgrade that renames them breaks
this file and nothing else.
"""

from __future__ import annotations

import optuna
from optuna.storages import BaseStorage
from optuna.storages._heartbeat import BaseHeartbeat as BaseHeartbeat  # storages with heartbeats inherit it


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
