"""Checks that import the user's code a space names, before a search starts.

Validating a space never imports anything (a space can be checked on a machine
without the user's modules). A search, though, must not open its storage and
ask trials only to find the model factory or the data function missing: the
asked trials would be left behind. `check_sources` imports both (without
building a model or reading data) and reports problems at their file:line.
"""

from __future__ import annotations

from typing import Any

from hfta_nas.data import check_source
from hfta_nas.errors import HftaNasError
from hfta_nas.models import load_factory

from ._errors import SpaceError
from ._yaml import Where


def check_sources(space: Any) -> None:
    """Import `space`'s model factory and data function (if any) and check a data file exists.

    Raises `SpaceError` naming the file, line and key (`model.factory`, `data.dataset`).
    """
    where = Where(space.source, getattr(space, "_lines", None) or {})
    problems = []
    if space.model.factory is not None:
        try:
            load_factory(space.model.factory)
        except HftaNasError as error:
            problems.append(where.problem(("model", "factory"), str(error)))
    try:
        check_source(space.data.dataset)
    except HftaNasError as error:
        problems.append(where.problem(("data", "dataset"), str(error)))
    if problems:
        raise SpaceError(problems)
