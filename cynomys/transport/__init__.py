"""Seal/publish and receive/open: the wire between the two daemons.
Envelopes (gzip, AES-256-GCM under RSA-OAEP-wrapped keys, Ed25519
signature: ``envelope``, ``keys``), buses (Redis stream or pub/sub, a local
file: ``bus``, ``redis_bus``, ``file_bus``), the HA lease (``lease``), and
the two halves built from the config (``channel``)."""
