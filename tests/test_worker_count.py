"""`search --workers K` starts no more workers than trials left, and says when they oversubscribe the machine."""

import os
import subprocess
import sys
from pathlib import Path

from hfta_nas.search_spaces._cli import workers_to_start

ROOT = Path(__file__).resolve().parents[1]


def test_no_more_workers_than_trials_left():
    assert workers_to_start(40, 2, 1, 40, 0) == (2, ["--workers 40: 2 trial(s) left in the budget, so 2 started"])
    count, notes = workers_to_start(4, 0, 1, 8, 0)  # nothing left: one worker reports the study
    assert count == 1 and "0 trial(s) left" in notes[0]
    assert workers_to_start(4, None, 1, 8, 0) == (4, [])  # a timeout-only budget: as asked
    assert workers_to_start(3, 10, 2, 8, 0) == (3, [])


def test_no_more_workers_than_the_memory_holds():
    """`--workers 2**40` with a timeout-only budget started processes until memory ran out."""
    count, notes = workers_to_start(2**40, None, 1, 2, 0, memory_bytes=6 * 2**30)
    assert count == 12 and notes[0] == (
        "--workers 1099511627776: the 6.0 GiB of memory available holds 12 worker(s) of 512 MiB each, so 12 started"
    )
    assert workers_to_start(4, 10, 1, 8, 0, memory_bytes=2**40) == (4, [])
    assert workers_to_start(4, 10, 1, 8, 0, memory_bytes=2**20)[0] == 1  # never fewer than one


def test_oversubscription_is_said_not_refused():
    count, notes = workers_to_start(8, 100, None, 2, 0)  # one thread each, as worker_commands shares 2 cores
    assert count == 8 and notes == [
        "--workers 8 x 1 thread(s) = 8 threads on 2 core(s): they compete for the cores; fewer workers or threads "
        "are faster"
    ]
    count, notes = workers_to_start(3, 100, None, 16, 2)
    assert count == 3 and notes == ["--workers 3 on 2 GPU(s): workers share GPUs (worker i uses GPU i mod 2)"]


def test_forty_workers_for_two_trials_start_two(tmp_path):
    """The review's case: `--workers 40 --n-trials 2` started 42 processes; now 2 workers run the 2 trials."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "search",
            str(ROOT / "search_spaces" / "mnist1d_mlp.yaml"),
            "--workers",
            "40",
            "--n-trials",
            "2",
            "--set",
            "training.epochs=1",
            "--storage",
            str(tmp_path / "s.journal"),
            "--quiet",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--workers 40: 2 trial(s) left in the budget, so 2 started" in done.stderr
    workers = [line for line in done.stdout.splitlines() if line.startswith("worker ")]
    assert len(workers) == 2, done.stdout
