"""Keeping passwords out of one-line messages: the CLI's and the demos' error output.

Its own module so `__main__` and the demos share it without importing each other.
"""

from __future__ import annotations

import re

from redmutex._cli import url_secrets

# A password in a URL's user-info runs to the last '@' of the URL (raw '/', '?', '#' and '@'
# included), a secret query value to the next '&' that starts a known key.
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)\S*@")
_QUERY_PASSWORD = re.compile(
    r"([?&](?:pass|password|sentinel_password)=)\S*?"
    r"(?=&(?:db|user|username|pass|password|protocol|sentinel_username|sentinel_password)="
    r"|'|\s|$)",
    re.IGNORECASE,
)


def _secrets(url: str | None) -> list[str]:
    """The password(s) a URL carries, raw and percent-decoded, to be kept out of messages."""
    return url_secrets(url) if url else []


def redact(text: str, url: str | None = None) -> str:
    """`text` on one line, with URL passwords (and the given URL's password) replaced by ***."""
    for secret in sorted(_secrets(url), key=len, reverse=True):
        text = text.replace(secret, "***")
    text = _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))
    return " ".join(text.split())
