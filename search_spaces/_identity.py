"""What a study remembers of its space, so that another space is not run on it by mistake.

A study's trials are rebuilt (`hfta-nas stability --study`) from the space it stores, so a
second space on the same study name must not add its trials and replace that space
silently. The comparison is over the space's *identity*: the validated settings that make
its trials (model, data, training, params and their distributions, sampler, seed, metrics
and directions, pbt), with defaults filled in and keys sorted. What does not make a trial
does not count: comments, key order, the study name, the budget, the array settings, the
pruner and the storage patience.

The identity is stored once, by the first process that finds none, under the study's lock
(`hfta_nas.search.study_lock`): PostgreSQL and MySQL hold it as an advisory lock, a journal
or SQLite file as a file lock beside it, so of two processes that open one study at once
with different spaces the first to store its space wins and the other is refused. A gRPC
proxy storage has no such lock: there two processes that both find no identity may both
store theirs (the later one wins); every later run is still compared with what is stored.
"""

from __future__ import annotations

import json
from typing import Any

import optuna

from hfta_nas.errors import HftaNasError
from hfta_nas.search import set_study_text, study_text

from ._schema import short
from ._space import SearchSpace, parse_space

IDENTITY_KEY = "space_identity"  # the identity of the space the study's trials came from
HISTORY_KEY = "space_history"  # earlier spaces (--new-space), each with the trial number it stopped at
_SECTIONS = ("model", "params", "training", "data", "sampler", "seed", "study", "pbt")
_FIRST = ("family", "factory", "name", "dataset", "distribution")


def space_identity(space: SearchSpace) -> dict[str, Any]:
    """The settings of `space` that make its trials, as plain JSON values with sorted keys."""
    dumped = space.model_dump(mode="json", include=set(_SECTIONS))
    dumped["study"] = {key: dumped["study"][key] for key in ("metrics", "directions")}
    return json.loads(json.dumps(dumped, sort_keys=True))


def first_difference(stored: Any, ours: Any, path: str = "") -> str | None:
    """The dotted key where two identities first differ, with both values; None when equal."""
    if isinstance(stored, dict) and isinstance(ours, dict):
        first = _SECTIONS if not path else _FIRST  # what names a space most plainly is said first
        keys = [k for k in first if k in stored or k in ours]
        keys += sorted(k for k in {*stored, *ours} if k not in keys)
        for key in keys:
            if key not in stored or key not in ours:
                where = "this space" if key in ours else "the study's space"
                return f"{path}{key} is only in {where}"
            found = first_difference(stored[key], ours[key], f"{path}{key}.")
            if found:
                return found
        return None
    if stored == ours:
        return None
    return f"{path.rstrip('.') or 'the space'} is {short(ours)} here but {short(stored)} in the study"


def stored_identity(study: optuna.Study) -> dict[str, Any] | None:
    """The identity the study keeps; for a study stored before identities were, that of its stored
    space text; None for a study without a space. HftaNasError when the stored text no longer parses."""
    identity = study_text(study, IDENTITY_KEY)
    if identity is not None:
        return identity
    text = study_text(study, "space_text")
    if text is None:
        return None
    source = study.user_attrs.get("space_source", study.study_name)
    try:
        return space_identity(parse_space(text, source, study_text(study, "space_overrides", [])))
    except HftaNasError as error:
        first = str(error).splitlines()[0]
        raise HftaNasError(
            f"study '{study.study_name}' keeps a space that no longer reads ({first}); give --new-space to "
            "search this space in it anyway, or another --study-name"
        ) from None


def check_same_space(study: optuna.Study, space: SearchSpace, location: str, *, new_space: bool) -> bool:
    """Refuse (HftaNasError, nothing written) a space other than the study's, unless `new_space`;
    True when this space is to be stored as the study's (it has none, or `new_space` replaces it).
    The caller holds the study's lock from this check to the write (`remember_space`)."""
    stored = stored_identity(study)
    if stored is None:
        return True
    difference = first_difference(stored, space_identity(space))
    if difference is None:
        return study_text(study, IDENTITY_KEY) is None  # an older study: store its identity now
    if new_space:
        return True
    raise HftaNasError(
        f"study '{study.study_name}' in {location} was searched with another space: {difference}; give "
        "--new-space to search this space in it anyway (its earlier trials keep theirs), or another --study-name"
    )


def remember_space(study: optuna.Study, space: SearchSpace) -> None:
    """Store `space` as the study's; a different earlier one joins the history with the number its
    trials stop at, so that `hfta-nas stability --study` rebuilds each trial with its own space."""
    previous = study_text(study, "space_text")
    if previous is not None and previous_identity_differs(study, space):
        history = list(study_text(study, HISTORY_KEY, []))
        history.append(
            {
                "text": previous,
                "overrides": study_text(study, "space_overrides", []),
                "source": study.user_attrs.get("space_source", study.study_name),
                "before_trial": len(study.get_trials(deepcopy=False)),
            }
        )
        set_study_text(study, HISTORY_KEY, history)
    set_study_text(study, IDENTITY_KEY, space_identity(space))


def previous_identity_differs(study: optuna.Study, space: SearchSpace) -> bool:
    try:
        stored = stored_identity(study)
    except HftaNasError:
        return True
    return stored is not None and first_difference(stored, space_identity(space)) is not None
