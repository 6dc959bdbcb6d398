"""A pytest plugin for Optuna's own storage tests: every storage their `StorageSupplier` makes is handed
to the test wrapped in `hfta_nas.search.PatientStorage`, so the suite checks the wrapper's contract."""

import optuna.testing.storages as supplied

from hfta_nas.search import PatientStorage

_bare_enter = supplied.StorageSupplier.__enter__


def _patient_enter(self):
    return PatientStorage(_bare_enter(self))  # __exit__ still closes the bare storage it keeps


supplied.StorageSupplier.__enter__ = _patient_enter
