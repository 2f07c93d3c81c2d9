"""Data-plane workers: confluent-kafka consumers that run prefill, decode and sinks."""
