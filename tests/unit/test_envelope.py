from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cynomys.core.errors import ConfigError, EnvelopeRejected
from cynomys.transport import envelope as env_mod
from cynomys.transport.envelope import MAGIC, Opener, Sealer, peek_header
from cynomys.transport.keys import generate_keys, load_private_key, load_public_key

PID = "producer-1"
STREAM = "cynomys"


class Keys:
    def __init__(self, d: Path) -> None:
        paths = generate_keys(d, rsa_bits=2048)
        self.paths = paths
        self.applier_private = load_private_key(paths["applier_private_key"])
        self.applier_public = load_public_key(paths["applier_public_key"])
        producer_private = load_private_key(paths["producer_private_key"])
        assert isinstance(producer_private, ed25519.Ed25519PrivateKey)
        self.producer_private = producer_private
        self.producer_public = load_public_key(paths["producer_public_key"])


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys(tmp_path_factory.mktemp("keys"))


def sealer(keys: Keys, **kw: object) -> Sealer:
    args: dict[str, object] = {"rotate_envelopes": 1000, "rotate_seconds": 300.0}
    args.update(kw)
    return Sealer(PID, STREAM, keys.applier_public, keys.producer_private, **args)  # type: ignore[arg-type]


def opener(keys: Keys, stream: str = STREAM) -> Opener:
    return Opener(keys.applier_private, {PID: keys.producer_public}, stream)


def payload(n: int = 5000) -> bytes:
    return b"".join(b"row %d|%d|name-%d;" % (i, i * 7919 % 1000, i) for i in range(n // 16 + 1))[:n]


def layout(data: bytes) -> dict[str, tuple[int, int]]:
    """(start, end) of each region of an envelope, per FORMAT.md."""
    plen = data[5]
    slen = struct.unpack(">H", data[6 + plen:8 + plen])[0]
    seq_at = 8 + plen + slen
    hdr_end = seq_at + 24
    wlen = struct.unpack(">H", data[hdr_end:hdr_end + 2])[0]
    wrapped = hdr_end + 2
    nonce = wrapped + wlen
    ct = nonce + 12 + 4
    clen = struct.unpack(">I", data[nonce + 12:ct])[0]
    return {"header": (0, hdr_end), "header-seq": (seq_at, seq_at + 8), "header-key-id": (seq_at + 8, seq_at + 16),
            "wrapped-key": (wrapped, nonce), "nonce": (nonce, nonce + 12), "ciphertext": (ct, ct + clen - 16),
            "tag": (ct + clen - 16, ct + clen), "signature": (ct + clen, len(data))}


def regions(data: bytes) -> dict[str, int]:
    """Offset of one byte inside each region of an envelope."""
    return {name: (a + b) // 2 for name, (a, b) in layout(data).items() if name != "header"}


def part(data: bytes, name: str) -> bytes:
    a, b = layout(data)[name]
    return data[a:b]


def flip(data: bytes, at: int) -> bytes:
    b = bytearray(data)
    b[at] ^= 0x01
    return bytes(b)


def resign(keys: Keys, data: bytes) -> bytes:
    """Re-sign a modified envelope with the real producer key: lets tests get
    past the signature to exercise the checks behind it."""
    body = data[:-64]
    return body + keys.producer_private.sign(body)


def test_round_trip(keys: Keys) -> None:
    s, o = sealer(keys), opener(keys)
    for seq, p in enumerate([b"", b"x", payload(100_000), os.urandom(3000)], start=1):
        data = s.seal(p, seq)
        got = o.open(data)
        assert got.payload == p
        assert (got.producer_id, got.stream, got.seq, got.version) == (PID, STREAM, seq, 1)
        assert got.key_id == s.key_id
        assert got.header == peek_header(data)
    assert data.startswith(MAGIC)


def test_flip_one_byte_in_each_region_is_rejected(keys: Keys) -> None:
    s, o = sealer(keys), opener(keys)
    data = s.seal(payload(), 7)
    for region, at in regions(data).items():
        with pytest.raises(EnvelopeRejected) as ei:
            o.open(flip(data, at))
        assert ei.value.reason == "bad-signature", region
    assert o.rejections["bad-signature"] == 7
    assert o.unwraps == 0  # nothing was decrypted for any of them
    with pytest.raises(EnvelopeRejected) as ei:
        o.open(flip(data, 0))
    assert ei.value.reason == "bad-magic"
    with pytest.raises(EnvelopeRejected) as ei:
        o.open(flip(data, 4))  # version byte
    assert ei.value.reason == "bad-version"
    with pytest.raises(EnvelopeRejected) as ei:
        o.open(flip(data, 8))  # inside the producer id
    assert ei.value.reason == "unknown-producer"
    assert o.open(data).payload == payload()  # the original still opens


def test_checks_behind_the_signature(keys: Keys) -> None:
    """A validly signed envelope whose inside is broken: the producer is
    trusted, but the applier still refuses garbage with the precise reason."""
    s, o = sealer(keys), opener(keys)
    data = s.seal(payload(), 3)
    r = regions(data)
    cases = {"wrapped-key": "unwrap-failed", "nonce": "decrypt-failed", "ciphertext": "decrypt-failed",
             "tag": "decrypt-failed"}
    for region, reason in cases.items():
        with pytest.raises(EnvelopeRejected) as ei:
            o.open(resign(keys, flip(data, r[region])))
        assert ei.value.reason == reason, region
    # AES-GCM binds the header: a re-signed header with another seq fails to decrypt.
    with pytest.raises(EnvelopeRejected) as ei:
        o.open(resign(keys, flip(data, r["header-seq"])))
    assert ei.value.reason == "decrypt-failed"
    assert o.rejections == {"unwrap-failed": 1, "decrypt-failed": 4}


def test_gunzip_failure(keys: Keys) -> None:
    """Encrypt something that is not gzip under a valid data key and sign it."""
    s, o = sealer(keys), opener(keys)
    good = s.seal(b"hello", 1)
    o.open(good)
    header = part(good, "header")
    aes = o._keys[(PID, s.key_id)][1]
    nonce = os.urandom(12)
    ct = aes.encrypt(nonce, b"definitely not gzip", header)
    body = good[:layout(good)["nonce"][0]] + nonce + struct.pack(">I", len(ct)) + ct
    with pytest.raises(EnvelopeRejected) as ei:
        o.open(body + keys.producer_private.sign(body))
    assert ei.value.reason == "gunzip-failed"


def test_forged_with_applier_public_key_only(keys: Keys) -> None:
    """The attacker knows the applier's public key (it is public) and the
    format: wraps a key of their own, encrypts, and signs with their own
    Ed25519 key (or not at all).  Every variant is rejected before decryption."""
    o = opener(keys)
    attacker = ed25519.Ed25519PrivateKey.generate()
    forged_sealer = Sealer(PID, STREAM, keys.applier_public, attacker, rotate_envelopes=10, rotate_seconds=60)
    forged = forged_sealer.seal(b"DROP TABLE users", 1)
    with pytest.raises(EnvelopeRejected) as ei:
        o.open(forged)
    assert ei.value.reason == "bad-signature"
    with pytest.raises(EnvelopeRejected) as ei:
        o.open(forged[:-64] + bytes(64))  # "no signature"
    assert ei.value.reason == "bad-signature"
    assert o.unwraps == 0  # the RSA private key was never touched
    # The same forgery claiming to be an unknown producer.
    other = Sealer("intruder", STREAM, keys.applier_public, attacker, rotate_envelopes=10, rotate_seconds=60)
    with pytest.raises(EnvelopeRejected) as ei:
        o.open(other.seal(b"x", 1))
    assert ei.value.reason == "unknown-producer"


def test_wrong_stream(keys: Keys) -> None:
    data = sealer(keys).seal(b"x", 1)
    o = opener(keys, stream="other")
    with pytest.raises(EnvelopeRejected) as ei:
        o.open(data)
    assert ei.value.reason == "wrong-stream"


def test_truncated(keys: Keys) -> None:
    o = opener(keys)
    data = sealer(keys).seal(payload(), 1)
    for n in (0, 3, 4, 6, 20, 40, len(data) // 2, len(data) - 64, len(data) - 1):
        with pytest.raises(EnvelopeRejected) as ei:
            o.open(data[:n])
        assert ei.value.reason in ("truncated", "bad-magic"), n
        if n >= 4:
            assert ei.value.reason == "truncated", n
    with pytest.raises(EnvelopeRejected) as ei:
        o.open(data + b"\0")
    assert ei.value.reason == "malformed"
    with pytest.raises(EnvelopeRejected) as ei:
        peek_header(data[:10])
    assert ei.value.reason == "truncated"


def test_rotation_by_count(keys: Keys) -> None:
    s, o = sealer(keys, rotate_envelopes=3), opener(keys)
    ids = [o.open(s.seal(b"p", seq)).key_id for seq in range(1, 8)]
    assert ids[0] == ids[1] == ids[2] != ids[3]
    assert ids[3] == ids[4] == ids[5] != ids[6]
    assert s.keys_created == 3
    assert o.unwraps == 3


def test_rotation_by_time(keys: Keys) -> None:
    now = [1000.0]
    s = sealer(keys, rotate_seconds=10.0, clock=lambda: now[0])
    o = opener(keys)
    a = o.open(s.seal(b"p", 1)).key_id
    now[0] += 9.9
    b = o.open(s.seal(b"p", 2)).key_id
    now[0] += 0.2
    c = o.open(s.seal(b"p", 3)).key_id
    assert a == b != c


def test_nonces_never_repeat_under_a_key(keys: Keys) -> None:
    s = sealer(keys, rotate_envelopes=50)
    seen: set[tuple[bytes, bytes]] = set()
    for seq in range(1, 201):
        data = s.seal(b"p", seq)
        nonce = part(data, "nonce")
        key_id = peek_header(data).key_id
        assert (key_id, nonce) not in seen
        seen.add((key_id, nonce))


def test_producer_restart_uses_a_new_key(keys: Keys) -> None:
    o = opener(keys)
    first, second = sealer(keys), sealer(keys)
    a = first.seal(b"before restart", 1)
    b = second.seal(b"after restart", 2)
    assert peek_header(a).key_id != peek_header(b).key_id
    assert o.open(a).payload == b"before restart"
    assert o.open(b).payload == b"after restart"
    assert o.open(a).payload == b"before restart"  # old key still cached


def test_unwrap_is_cached(keys: Keys) -> None:
    s, o = sealer(keys, rotate_envelopes=100), opener(keys)
    for seq in range(1, 251):
        o.open(s.seal(b"payload %d" % seq, seq))
    assert o.unwraps == 3  # keys for 1..100, 101..200, 201..250


def test_gzip_is_standard(keys: Keys) -> None:
    """The plaintext inside AES-GCM is a plain gzip stream (as in the paper)."""
    s, o = sealer(keys), opener(keys)
    p = payload(50_000)
    data = s.seal(p, 1)
    o.open(data)
    nonce = part(data, "nonce")
    ct = part(data, "ciphertext") + part(data, "tag")
    header = part(data, "header")
    plain = o._keys[(PID, s.key_id)][1].decrypt(nonce, ct, header)
    assert plain[:2] == b"\x1f\x8b"
    assert zlib.decompress(plain, 31) == p
    assert len(data) < len(p) // 2  # compression happened before encryption


def test_oaep_label_binds_context(keys: Keys) -> None:
    """The wrapped key only unwraps with the producer/stream/key-id label."""
    s = sealer(keys)
    data = s.seal(b"x", 1)
    wrapped = part(data, "wrapped-key")
    assert len(wrapped) == 256  # RSA-2048
    no_label = padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
    priv = keys.applier_private
    assert isinstance(priv, rsa.RSAPrivateKey)
    with pytest.raises(ValueError):
        priv.decrypt(wrapped, no_label)
    key = priv.decrypt(wrapped, env_mod._oaep(PID.encode(), STREAM.encode(), s.key_id))
    assert len(key) == 32 and isinstance(AESGCM(key), AESGCM)


def test_wrong_key_types_are_config_errors(keys: Keys) -> None:
    with pytest.raises(ConfigError, match="RSA public key"):
        Sealer(PID, STREAM, keys.producer_public, keys.producer_private, rotate_envelopes=1, rotate_seconds=1)
    with pytest.raises(ConfigError, match="Ed25519 private key"):
        Sealer(PID, STREAM, keys.applier_public, keys.applier_private, rotate_envelopes=1, rotate_seconds=1)
    with pytest.raises(ConfigError, match="key_rotate_envelopes"):
        Sealer(PID, STREAM, keys.applier_public, keys.producer_private, rotate_envelopes=0, rotate_seconds=1)
    with pytest.raises(ConfigError, match="RSA private key"):
        Opener(keys.producer_private, {PID: keys.producer_public}, STREAM)
    with pytest.raises(ConfigError, match="Ed25519 public key"):
        Opener(keys.applier_private, {PID: keys.applier_public}, STREAM)


# --- keys.py -----------------------------------------------------------------

def test_generate_keys_modes_and_no_overwrite(tmp_path: Path) -> None:
    paths = generate_keys(tmp_path, rsa_bits=2048)
    assert {p.name for p in paths.values()} == {
        "applier_private.pem", "applier_public.pem", "producer_private.pem", "producer_public.pem"}
    assert paths["applier_private_key"].stat().st_mode & 0o777 == 0o600
    assert paths["producer_private_key"].stat().st_mode & 0o777 == 0o600
    before = paths["applier_private_key"].read_bytes()
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        generate_keys(tmp_path, rsa_bits=2048)
    assert paths["applier_private_key"].read_bytes() == before
    generate_keys(tmp_path, rsa_bits=2048, force=True)
    assert paths["applier_private_key"].read_bytes() != before
    assert isinstance(load_private_key(paths["applier_private_key"]), rsa.RSAPrivateKey)
    assert isinstance(load_public_key(paths["producer_public_key"]), ed25519.Ed25519PublicKey)
    with pytest.raises(ConfigError, match="at least 2048"):
        generate_keys(tmp_path / "small", rsa_bits=1024)


def test_load_errors_name_path_and_config_key(tmp_path: Path) -> None:
    paths = generate_keys(tmp_path, rsa_bits=2048, passphrase="s3cret")
    priv = paths["producer_private_key"]
    with pytest.raises(ConfigError) as ei:
        load_private_key(priv, config_key="producer_private_key")
    assert str(priv) in str(ei.value) and "CYNOMYS_SECURITY_PASSPHRASE" in str(ei.value)
    with pytest.raises(ConfigError, match="wrong passphrase"):
        load_private_key(priv, "nope", config_key="producer_private_key")
    assert isinstance(load_private_key(priv, "s3cret"), ed25519.Ed25519PrivateKey)
    missing = tmp_path / "missing.pem"
    with pytest.raises(ConfigError) as ei:
        load_private_key(missing, config_key="applier_private_key")
    assert str(missing) in str(ei.value) and "[security] applier_private_key" in str(ei.value)
    with pytest.raises(ConfigError, match="not a PEM private key"):
        load_private_key(paths["applier_public_key"], config_key="applier_private_key")
    with pytest.raises(ConfigError, match="not a PEM public key"):
        load_public_key(priv, config_key="producer_public_key")
    with pytest.raises(ConfigError, match="no key file configured"):
        load_public_key("", config_key="applier_public_key")


# --- decompression bound ([transport] max_envelope_bytes) ---------------------

def test_a_signed_zip_bomb_is_rejected_before_it_is_inflated(keys: Keys) -> None:
    # The case: a producer key signs a ~0.2 MB envelope that opens to
    # 200 MB.  The default bound (64 MiB) stops it, reason "too-large".
    bomb = bytes(200 * 1024 * 1024)
    data = sealer(keys, compress_level=9).seal(bomb, 1)
    del bomb
    assert len(data) < 1024 * 1024
    o = opener(keys)
    with pytest.raises(EnvelopeRejected) as ei:
        o.open(data)
    assert ei.value.reason == "too-large"
    assert "max_envelope_bytes" in str(ei.value) and o.rejections["too-large"] == 1


def test_max_payload_bytes_is_exact(keys: Keys) -> None:
    body = payload(10_000)
    s = sealer(keys)
    tight = Opener(keys.applier_private, {PID: keys.producer_public}, STREAM, max_payload_bytes=len(body))
    assert tight.open(s.seal(body, 1)).payload == body
    with pytest.raises(EnvelopeRejected) as ei:
        tight.open(s.seal(body + b"x", 2))
    assert ei.value.reason == "too-large"
    with pytest.raises(ConfigError, match="max_envelope_bytes"):
        Opener(keys.applier_private, {PID: keys.producer_public}, STREAM, max_payload_bytes=0)
