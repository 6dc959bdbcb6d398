"""Where studies live: the embedded default storage and any Optuna storage URL.

The default is an Optuna journal file (`runs/hfta-nas.journal`): no server,
append-only writes under a file lock, safe for several processes on one
machine, and optuna-dashboard opens it directly. Measured on this project's
2-core CI machine (`python benchmarks/storage.py`): about 12 ms per trial of
21 writes for the journal file against 130 ms for SQLite, and 4 concurrent
writers lost nothing on either (the journal stayed ~10x cheaper). Any other
Optuna storage URL (sqlite:///..., postgresql://...) is accepted as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

import optuna
from optuna.storages import BaseStorage, JournalStorage
from optuna.storages.journal import JournalFileBackend

from hfta_nas.errors import HftaNasError

DEFAULT_STORAGE = "runs/hfta-nas.journal"
_URL_SCHEMES = ("sqlite:", "postgresql", "mysql", "oracle", "mssql", "redis:")


def open_storage(storage: str | None) -> tuple[BaseStorage | str, str]:
    """(the storage object or URL for Optuna, the string optuna-dashboard takes)."""
    location = storage or DEFAULT_STORAGE
    if location.startswith(_URL_SCHEMES):
        try:
            return optuna.storages.get_storage(location), location
        except Exception as error:  # SQLAlchemy/driver errors vary by backend
            raise HftaNasError(f"cannot open storage '{location}': {type(error).__name__}: {error}") from error
    path = Path(location)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.touch()
        if not os.access(path, os.W_OK):
            raise PermissionError(f"'{path}' is not writable")
        backend = JournalFileBackend(str(path))
    except OSError as error:
        raise HftaNasError(f"cannot use journal file '{location}' as storage: {error}") from error
    return JournalStorage(backend), str(path)


def dashboard_command(dashboard_location: str) -> str:
    """The exact command that shows this storage in optuna-dashboard."""
    return f"optuna-dashboard {dashboard_location}"
