"""The two halves of the wire: seal/publish (producer side) and receive/open
(applier side), built from the config's [transport] and [security]."""
from __future__ import annotations

import threading
import uuid
from dataclasses import replace

from cynomys.core.config import Config
from cynomys.core.errors import ConfigError, TerminalError
from cynomys.core.model import Batch
from cynomys.transport.envelope import Opener
from cynomys.transport.keys import load_private_key, load_public_key


class SealedSink:
    """Batch -> Avro -> sealed envelope -> transport (the producer's side of
    the wire).  ``send`` returns once the transport accepted the envelope."""

    def __init__(self, cfg: Config) -> None:
        from cynomys.schemas import codec
        from cynomys.transport.bus import open_publisher
        from cynomys.transport.envelope import Sealer
        from cynomys.transport.keys import load_private_key, load_public_key

        sec = cfg.security
        if not sec.applier_public_key or not sec.producer_private_key:
            raise ConfigError(
                f"[security] applier_public_key and producer_private_key must be set in {cfg.path}",
                hint="run `cynomys keygen --out DIR` and point [security] at the files it writes")
        self._encode = codec.encode
        self.bytes_sent = 0
        self.producer_id = cfg.producer.id
        self.max_payload = cfg.transport.max_envelope_bytes
        self.sealer = Sealer(
            cfg.producer.id, cfg.transport.stream,
            load_public_key(cfg.resolve(sec.applier_public_key), config_key="applier_public_key"),
            load_private_key(cfg.resolve(sec.producer_private_key), sec.passphrase or None,
                             config_key="producer_private_key", allow_readable=sec.allow_readable_private_keys),
            rotate_envelopes=cfg.transport.key_rotate_envelopes, rotate_seconds=cfg.transport.key_rotate_seconds)
        tcfg = cfg.transport
        if tcfg.kind == "file":
            tcfg = replace(tcfg, path=str(cfg.resolve(tcfg.path)))
        self.publisher = open_publisher(tcfg)
        self.fence_token = 0  # the HA lease's fencing token, sealed into each envelope (0: no HA)
        self.fence_term = ""  # the lease value of that term
        self._where = f"file {tcfg.path}" if tcfg.kind == "file" else f"stream {tcfg.stream!r} ({tcfg.mode})"

    def last_sequence(self) -> int:
        return self.publisher.last_sequence(self.producer_id)

    def fence(self, token: int, lease_key: str, lease_value: str) -> None:
        """An HA leader's new term: seal ``token`` into every envelope, and
        have the transport refuse them once the lease holds another value."""
        fence = getattr(self.publisher, "fence", None)
        if fence is None:
            raise ConfigError(f"the transport {self._where} cannot fence an HA producer",
                              hint='use [transport] kind = "redis" with [producer] ha = true')
        fence(lease_key, lease_value)
        # One id per acquisition: a Producer restarted inside this term finds
        # it in its state; a new term with the same token (the counter reset
        # in Redis, even by this very process re-acquiring) does not.
        self.fence_token, self.fence_term = token, f"{lease_value}/{uuid.uuid4().hex[:8]}"

    def fence_holds(self) -> bool:
        """Whether the lease still holds this term's value (True without HA)."""
        holds = getattr(self.publisher, "lease_holds", None)
        return True if not self.fence_token or holds is None else bool(holds())

    def describe(self) -> str:
        return self._where

    def send(self, seq: int, batch: Batch, stop: threading.Event) -> None:
        payload = self._encode(batch)
        if len(payload) > self.max_payload:
            # The applier would refuse it (too-large) and then stop on the gap:
            # stop here instead, before anything is sent or checkpointed.
            raise TerminalError(
                f"envelope {seq} would carry {len(payload)} bytes of Avro ({len(batch.changes)} changes up to "
                f"{batch.end}), more than [transport] max_envelope_bytes = {self.max_payload} the applier accepts",
                hint="lower [producer] batch_max_events (large rows), or raise [transport] max_envelope_bytes "
                     "on both sides")
        envelope = self.sealer.seal(payload, seq, self.fence_token)
        self.publisher.publish(self.producer_id, seq, envelope, stop)
        self.bytes_sent += len(envelope)  # read by the metrics (cynomys_producer_envelope_bytes_total)

    def close(self) -> None:
        self.publisher.close()


def make_opener(cfg: Config) -> Opener:
    sec = cfg.security
    if not sec.applier_private_key or not sec.producer_public_key:
        raise ConfigError(f"[security] applier_private_key and producer_public_key must be set in {cfg.path}",
                          hint="copy the files written by `cynomys keygen` and point [security] at them")
    priv = load_private_key(cfg.resolve(sec.applier_private_key), sec.passphrase or None,
                            config_key="applier_private_key", allow_readable=sec.allow_readable_private_keys)
    pub = load_public_key(cfg.resolve(sec.producer_public_key), config_key="producer_public_key")
    return Opener(priv, {cfg.producer.id: pub}, cfg.transport.stream,
                  max_payload_bytes=cfg.transport.max_envelope_bytes)
