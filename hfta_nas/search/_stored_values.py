"""Trial values as they are stored: numbers, or one line that names the trial holding something else.

SQLite keeps whatever is written into a column (its column types are only affinities) and a
journal is JSON, so a trial value written by hand or by another tool may be text. Optuna hands
it on as a value, and it fails far from its cause (a sampler's "'<' not supported between
instances of 'float' and 'str'") or is compared as text without a word. Every trial read
through an hfta-nas storage (`PatientStorage`) and every stored study copied for a dry run is
checked here: a value or an intermediate value that is not a number is refused, naming the
trial, and nothing is changed.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

from optuna.trial import FrozenTrial

from hfta_nas.errors import HftaNasError


class StoredValueError(HftaNasError):
    """A stored trial holds a value that is not a number (the storage was written by hand or by another tool)."""


def check_numbers(trial: FrozenTrial, study_name: Callable[[], str | None] = lambda: None) -> FrozenTrial:
    """`trial` when its values and intermediate values are numbers; else StoredValueError naming it
    (`study_name` is asked only then: it may cost a storage call)."""
    for value in [*(trial.values or []), *trial.intermediate_values.values()]:
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            name = study_name()
            of = f" of study '{name}'" if name is not None else ""
            step = [s for s, v in trial.intermediate_values.items() if v is value]
            what = f"the intermediate value at step {step[0]}" if step else "the value"
            raise StoredValueError(
                f"trial {trial.number}{of} holds {what} {value!r} in its storage, which is not a number (written "
                f"by hand or by another tool?); nothing was changed: correct or delete that trial (trial_id "
                f"{trial._trial_id}) and run again"
            )
    return trial
