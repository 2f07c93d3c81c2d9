"""Local infrastructure: Kafka launcher (Maven-resolved, KRaft), topic spec and provisioning, ClickHouse client and DDL."""
