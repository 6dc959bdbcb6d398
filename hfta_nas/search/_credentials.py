"""Storage URLs as they may be shown: every password masked.

A database URL carries its password (`postgresql://user:secret@host/db`), and
what a command prints lands in Slurm logs, CI output and JSON files. Every
storage URL shown to a user (errors, hints, summaries, logs) goes through
`hide_passwords`, which masks the password as SQLAlchemy's
`make_url(url).render_as_string(hide_password=True)` does, but in any text (a
driver's message may quote the URL too) and without re-rendering the rest of it.
"""

from __future__ import annotations

import re

# scheme://user:password@: the password as SQLAlchemy's URL grammar reads it (anything up to the
# '@'; an '@' in a password must be percent-encoded)
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s@]+@")
# password=... in a URL's query or a libpq connection string
_PASSWORD_SETTING = re.compile(r"(?P<key>\bpassword=)[^\s&'\"]+", re.IGNORECASE)
MASK = "***"


def hide_passwords(text: str) -> str:
    """`text` (a storage URL, or a message that quotes one) with every password masked as ***."""
    text = _URL_PASSWORD.sub(rf"\g<head>{MASK}@", text)
    return _PASSWORD_SETTING.sub(rf"\g<key>{MASK}", text)
