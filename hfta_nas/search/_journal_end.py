"""Where a journal file ended when hfta-nas last wrote to it, kept beside it, so that a journal cut
short at a line's end (a backup restored over it, a copy that stopped, a truncation) says what it lost.

Optuna's journal records carry no sequence numbers: a file cut exactly between two records reads
as a whole, shorter journal, and the records after the cut are gone without a word (a cut inside a
record is mended and said by `_storage.repair_torn_tail`). So after each of its own appends, under
the journal's write lock, hfta-nas records in `.<journal>.end` (hidden, beside it): the size of the
journal up to its last newline, the number of records (lines) up to there, and the length and
SHA-256 of the last one. Opening a journal compares, under the same lock:

- shorter than recorded: "the journal is N bytes shorter than hfta-nas last wrote it: its last M
  record(s) were lost";
- as long or longer, but the recorded last record is not where it was: records before that end were
  changed or replaced (a file cut and then appended to again, an older copy with other records);

then records the journal as it is, so each loss is said once. What this guarantees, with any number
of hfta-nas processes appending: every append is followed by a record made under the same lock that
orders the appends, from the file itself (bytes up to its last newline; the records counted are
those between the previous record and the new end, whoever wrote them), so the record never runs
ahead of what is in the file, and the file never legitimately shrinks below it. Records other
programs (plain Optuna, optuna-dashboard) append are counted at hfta-nas's next append or open; a
cut that takes only such records, before hfta-nas wrote after them, is not seen. The record is written
in place, without fsync (the journal's own write is synced first): after a crash it is at worst
older, or fails its own checksum and is made again, never ahead of the journal. A journal with no record yet (made by
another program, or before this record existed) gets one at its first open.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from optuna.storages.journal import JournalFileBackend

_log = logging.getLogger("hfta_nas")


def end_file(journal: Path) -> Path:
    """The hidden file that records where `journal` ended at hfta-nas's last write."""
    return journal.with_name(f".{journal.name}.end")


class RecordedJournal(JournalFileBackend):
    """Optuna's journal file backend whose every append is followed by a record of the file's end
    (see the module docstring). `lock` is the journal's write lock (not re-entrant: taken twice)."""

    def __init__(self, path: str, lock: Any) -> None:
        super().__init__(path, lock_obj=lock)
        self._journal, self._end_lock = Path(path), lock

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        super().append_logs(logs)
        self._end_lock.acquire()
        try:
            _record(self._journal, _read_end(self._journal))
        finally:
            self._end_lock.release()


def check_end(journal: Path, lock: Any) -> str | None:
    """Compare `journal` with where hfta-nas last left it (see the module docstring), say what was lost
    (a warning, returned), and record it as it is now; None when nothing was lost."""
    lock.acquire()
    try:
        recorded = _read_end(journal)
        message = None
        if recorded is not None:
            with open(journal, "rb") as handle:
                size = _whole_size(handle)
                if size < recorded["size"]:
                    handle.seek(0)
                    lost = recorded["records"] - handle.read(size).count(b"\n")
                    message = (
                        f"journal '{journal}' is {recorded['size'] - size} bytes shorter than hfta-nas last wrote "
                        f"it: its last {lost} record(s) were lost (cut off at a record's end: a restored copy, a "
                        "truncation); the studies in it go on from what is left"
                    )
                    recorded = None  # counted again below
                else:
                    start = recorded["size"] - recorded["last_len"]
                    handle.seek(start)
                    if hashlib.sha256(handle.read(recorded["last_len"])).hexdigest() != recorded["last_sha256"]:
                        message = (
                            f"journal '{journal}' was changed before the end hfta-nas last wrote (byte "
                            f"{recorded['size']}): records written then were lost or replaced; the studies in it "
                            "go on from what it holds now"
                        )
                        recorded = None
        _record(journal, recorded)
    finally:
        lock.release()
    if message is not None:
        _log.warning(message)
    return message


def _whole_size(handle: Any) -> int:
    """The size of the open file up to (and with) its last newline."""
    end = handle.seek(0, os.SEEK_END)
    position = end
    while position > 0:
        step = max(0, position - 65536)
        handle.seek(step)
        newline = handle.read(position - step).rfind(b"\n")
        if newline != -1:
            return step + newline + 1
        position = step
    return 0


def _record(journal: Path, previous: dict[str, Any] | None) -> None:
    """Record where `journal` ends now, counting the records written since `previous` (all of them
    when None, or when the file is shorter than `previous` says)."""
    with open(journal, "rb") as handle:
        size = _whole_size(handle)
        if previous is None or size < previous["size"]:
            previous = {"size": 0, "records": 0, "last_len": 0, "last_sha256": hashlib.sha256(b"").hexdigest()}
        handle.seek(previous["size"])
        added = handle.read(size - previous["size"])
    if added:
        last = added[added.rfind(b"\n", 0, len(added) - 1) + 1 :]
        previous = {
            "size": size,
            "records": previous["records"] + added.count(b"\n"),
            "last_len": len(last),
            "last_sha256": hashlib.sha256(last).hexdigest(),
        }
    else:
        previous = {**previous, "size": size}
    body = json.dumps(previous, sort_keys=True)
    text = json.dumps({**previous, "check": _check(body)}, sort_keys=True).encode()
    try:  # written in place (a rename costs a millisecond an append); a torn write fails its check
        handle = os.open(end_file(journal), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(handle, text, 0)
            os.ftruncate(handle, len(text))
        finally:
            os.close(handle)
    except OSError:  # (a full disk): the record is a help, not the storage; the next write tries again
        pass


def _check(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def _read_end(journal: Path) -> dict[str, Any] | None:
    """The recorded end of `journal`, or None when there is none or it cannot be read."""
    try:
        recorded = json.loads(end_file(journal).read_text())
    except (OSError, ValueError):
        return None
    keys = {"size": int, "records": int, "last_len": int, "last_sha256": str}
    if not isinstance(recorded, dict) or any(not isinstance(recorded.get(k), t) for k, t in keys.items()):
        return None
    check = recorded.pop("check", None)
    if check != _check(json.dumps(recorded, sort_keys=True)):  # a write torn by a crash
        return None
    if recorded["last_len"] > recorded["size"] or min(recorded["size"], recorded["records"], recorded["last_len"]) < 0:
        return None
    return recorded
