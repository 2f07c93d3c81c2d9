"""Control plane: Faust agents and tables that feed Kafka events into the pure policy in ``policy``."""
