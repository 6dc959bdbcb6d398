"""Long texts kept with a study without flooding its user attributes.

A study's user attributes are what `optuna studies` prints and what the
dashboard lists on the study page; a whole space file or config there makes
both unreadable. Such texts are stored as study system attributes (kept by
every storage, shown by neither) under an `hfta_nas:` key, and, where the
storage has an artifacts folder, also uploaded once as a file artifact of the
study, which the dashboard shows readably beside the study.
"""

from __future__ import annotations

import hashlib
import tempfile
import warnings
from pathlib import Path
from typing import Any

import optuna

from hfta_nas.search._optuna_private import storage_of, study_id

_PREFIX = "hfta_nas:"


def set_study_text(study: optuna.Study, key: str, value: Any) -> None:
    """Keep `value` (JSON-able) with `study` under `key`, out of its user attributes."""
    # The storage API, not Study.set_system_attr (deprecated): system attributes are the
    # storage's own, and optuna-dashboard reads studies through the same calls.
    storage_of(study).set_study_system_attr(study_id(study), _PREFIX + key, value)


def study_text(study: optuna.Study, key: str, default: Any = None) -> Any:
    """What `set_study_text` kept under `key`; studies stored by earlier versions kept it in the user attributes."""
    stored = storage_of(study).get_study_system_attrs(study_id(study))
    if _PREFIX + key in stored:
        return stored[_PREFIX + key]
    return study.user_attrs.get(key, default)


def attach_study_file(study: optuna.Study, file_name: str, text: str, folder: Path | None) -> bool:
    """Upload `text` as the study artifact `file_name` into `folder` (once per distinct text:
    a resumed run does not add a copy). False when there is no folder (a storage in memory)."""
    if folder is None:
        return False
    from optuna.artifacts import FileSystemArtifactStore, upload_artifact

    digest = hashlib.sha256(text.encode()).hexdigest()
    marker = f"{_PREFIX}artifact:{file_name}"
    if storage_of(study).get_study_system_attrs(study_id(study)).get(marker) == digest:
        return True
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / file_name
        path.write_text(text, encoding="utf-8")
        with warnings.catch_warnings():  # the artifact API is "experimental" in Optuna, stable in use
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            upload_artifact(
                artifact_store=FileSystemArtifactStore(str(folder)), file_path=str(path), study_or_trial=study
            )
    storage_of(study).set_study_system_attr(study_id(study), marker, digest)
    return True
