"""Avro schemas (one .avsc per message kind) and the serde used by confluent-kafka code and Faust alike.

- ``avro/<kind>.avsc``: the source of truth; ``avro/history/``: every earlier shipped version.
- `registry`: loads them, fingerprints (CRC-64-AVRO) and finds any version by fingerprint.
- `serde`: ``encode(kind, record) -> bytes`` / ``decode(data, expected_kind) -> (kind, record)``.
- `deadletter`: ``safe_decode`` (never raises) and ``to_dead_letter``.
- `records`, `ops_records`, `enums`, `kinds`: typed dataclasses and enums mirroring the .avsc.
- `faust_codec`: the ``phaseroute-avro`` Faust codecs over the same serde.
- `ids`: deterministic request, attempt and event ids; `examples`: one example per kind.
"""
