"""[snapshot] read_from: the replica's address and settings (pure logic;
the reads themselves: tests/integration/test_snapshot_replica.py)."""
from __future__ import annotations

import pytest

from cynomys.core.config import SourceConfig
from cynomys.snapshot.replica import parse_read_from, replica_source


@pytest.mark.parametrize("text, want", [("10.0.0.7:3307", ("10.0.0.7", 3307)), ("[::1]:3306", ("::1", 3306)),
                                        ("db-replica.internal:3306", ("db-replica.internal", 3306))])
def test_read_from_is_host_and_port(text: str, want: tuple[str, int]) -> None:
    assert parse_read_from(text) == want


def test_the_replica_keeps_the_source_credentials() -> None:
    source = SourceConfig(host="primary", port=3306, user="cdc", password="s3cret", connect_timeout_s=7.0)
    got = replica_source(source, "replica:3307")
    assert (got.host, got.port) == ("replica", 3307)
    assert (got.user, got.password, got.connect_timeout_s) == ("cdc", "s3cret", 7.0)
    assert source.host == "primary"  # not changed in place
