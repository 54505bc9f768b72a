"""URL redaction for logs and error messages (issue #13, item 6)."""
from __future__ import annotations

import pytest

from cynomys.transport.bus import redact_url


@pytest.mark.parametrize("url, shown", [
    ("redis://:hunter2@h:6379/0", "redis://:***@h:6379/0"),
    ("redis://u:hunter2@h/0?password=hunter2&db=1", "redis://u:***@h/0?password=***&db=1"),
    ("rediss://h/0?ssl_ca=/ca.pem&ssl_password=hunter2", "rediss://h/0?ssl_ca=/ca.pem&ssl_password=***"),
    ("https://cat/v1?token=hunter2&warehouse=w", "https://cat/v1?token=***&warehouse=w"),
    # A malformed port must not crash the message that reports it.
    ("redis://:hunter2@h:notaport/0", "redis://:***@h:notaport/0"),
    ("redis://h:6379/0", "redis://h:6379/0"),
    ("redis://user@h/0", "redis://user@h/0"),
])
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "hunter2" not in redact_url(url)
