"""Shared fixtures: a tiny deterministic dataset so engine tests stay fast."""

import pytest
import torch

from hfta_nas.data import Dataset
from hfta_nas.errors import FusionError

# A refusal is read in a terminal, a log or a trial's attribute: one line of about 200 characters.
REFUSAL_LIMIT = 220


def refusal_problem(message):
    """Why a FusionError message is not one short line (None when it is)."""
    if "\n" in message:
        return "spans several lines"
    if len(message) > REFUSAL_LIMIT:
        return f"has {len(message)} characters (at most {REFUSAL_LIMIT})"
    return None


@pytest.fixture(autouse=True)
def _refusals_are_one_short_line(monkeypatch):
    """Every FusionError any test makes, anywhere in the suite, is held to one short line."""
    made = []
    original = FusionError.__init__

    def recording(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(str(self))

    monkeypatch.setattr(FusionError, "__init__", recording)
    yield
    problems = [f"{why}: {message[:300]!r}" for message in made if (why := refusal_problem(message))]
    assert not problems, "refusal messages must be one line of about 200 characters:\n" + "\n".join(problems)


def synthetic_dataset(n_train=60, n_eval=20, shape=(2, 12), classes=3, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)

    def part(n):
        return torch.randn(n, *shape, generator=g, dtype=dtype), torch.randint(0, classes, (n,), generator=g)

    (xt, yt), (xv, yv), (xs, ys) = part(n_train), part(n_eval), part(n_eval)
    return Dataset("synthetic", xt, yt, xv, yv, xs, ys, classes)


@pytest.fixture
def tiny_data():
    return synthetic_dataset()


@pytest.fixture(autouse=True, scope="session")
def _session_cache_dir(tmp_path_factory):
    """Step costs and generated data cached for this session only, not in the user's ~/.cache
    (subprocesses inherit the variable)."""
    import os

    folder = tmp_path_factory.mktemp("hfta-nas-cache")
    previous = os.environ.get("HFTA_NAS_CACHE_DIR")
    os.environ["HFTA_NAS_CACHE_DIR"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("HFTA_NAS_CACHE_DIR", None)
    else:
        os.environ["HFTA_NAS_CACHE_DIR"] = previous


@pytest.fixture
def every_epoch_checkpoints(monkeypatch):
    """Search arrays checkpoint at every epoch's end (not by their time budget), so a test can
    stop a search at a chosen epoch and know which checkpoint the re-run continues."""
    monkeypatch.setattr("hfta_nas.search._array_job.CHECKPOINT_SHARE", None)


@pytest.fixture
def postgres():
    """A throwaway PostgreSQL server on 127.0.0.1 (trust auth) that a test can stop and start;
    removed after the test, skipped where none can be started here."""
    from benchmarks._postgres import Unavailable, throwaway_server

    try:
        context = throwaway_server("hfta_nas_tests")
        server = context.__enter__()
    except Unavailable as why:
        pytest.skip(str(why))
    try:
        yield server
    finally:
        context.__exit__(None, None, None)
