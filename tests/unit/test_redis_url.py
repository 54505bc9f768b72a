"""[transport] url checks made before any connection (issue #13, items 1 and 6)."""
from __future__ import annotations

import pytest

from cynomys.core.errors import ConfigError
from cynomys.transport.redis_bus import redis_client


def test_rediss_checks_host_names_and_takes_the_ssl_aliases() -> None:
    r = redis_client("rediss://:pw@h:6380/0?ssl_ca=/ca.pem&ssl_cert=/c.pem&ssl_key=/k.pem", 5.0)
    kw = r.connection_pool.connection_kwargs
    assert kw["ssl_check_hostname"] is True
    assert (kw["ssl_ca_certs"], kw["ssl_certfile"], kw["ssl_keyfile"]) == ("/ca.pem", "/c.pem", "/k.pem")
    assert "ssl_check_hostname" not in redis_client("redis://h/0", 5.0).connection_pool.connection_kwargs


@pytest.mark.parametrize("url, match", [
    ("redis://h/0?ssl_ca=/ca.pem", "needs TLS"),
    ("rediss://h/0?ssl_cert_reqs=maybe", "ssl_cert_reqs"),
    ("redis://h/0?sockettimeout=3", "unknown option 'sockettimeout'"),
    ("http://h/0", "not a Redis URL"),
    ("redis://:pw@h:70000/0", "not a valid Redis URL"),
])
def test_bad_urls_are_config_errors(url: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as ei:
        redis_client(url, 5.0)
    assert ei.value.hint is not None and "pw" not in str(ei.value).replace("password", "")
