"""Typed settings for every phaseroute process.

Every field reads an environment variable with the ``PHASEROUTE_`` prefix (for example
``PHASEROUTE_BOOTSTRAP_SERVERS``); command-line flags override the environment. Invalid
values fail at start-up with an error that names the variable and the bad value.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_home() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "phaseroute"


class ConfigError(ValueError):
    """A setting has a value phaseroute cannot use; the message names it."""


class Settings(BaseSettings):
    """Where phaseroute finds Kafka, ClickHouse and its local state."""

    model_config = SettingsConfigDict(env_prefix="PHASEROUTE_", extra="ignore", validate_default=True)

    home: Path = Field(
        default_factory=_default_home,
        description="State directory: Kafka jars and logs, chdb data, KV store, model cache, PID files.",
    )
    bootstrap_servers: str = Field(
        default="",
        description="Kafka bootstrap servers (host:port[,host:port...]) of an existing cluster. "
        "Unset: the local broker that `phaseroute up` starts on localhost:<kafka_port>.",
    )
    kafka_version: str = Field(default="4.1.1", description="Apache Kafka version resolved from Maven Central by `phaseroute up`.")
    kafka_port: int = Field(default=9092, ge=1, le=65535, description="Broker listener port of the local broker.")
    kafka_controller_port: int = Field(default=9093, ge=1, le=65535, description="KRaft controller port of the local broker.")
    kafka_heap: str = Field(default="512m", description="Java heap (-Xmx) of the local broker.")
    kafka_start_timeout_s: float = Field(default=60.0, gt=0, description="How long `phaseroute up` waits for the broker to answer.")
    clickhouse_url: str | None = Field(
        default=None,
        description="ClickHouse server URL (http://user:pass@host:8123/db). Unset: embedded chdb under home/chdb.",
    )
    telemetry_port: int = Field(
        default=8124, ge=1, le=65535,
        description="Port (localhost) where the telemetry service answers read-only SQL for the embedded chdb.",
    )
    clickhouse_database: str = Field(default="phaseroute", description="Database that holds the telemetry tables.")
    kv_store_url: str | None = Field(
        default=None,
        description="KV blob store: a directory path or an fsspec URL (memory://, s3://...). Unset: home/kv.",
    )

    kafka_client_config: dict[str, str] = Field(
        default_factory=dict,
        description="Extra librdkafka properties for a real cluster, as JSON: e.g. "
        '{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "...", '
        '"sasl.password": "..."}. The local broker needs none.',
    )
    blob_store_url: str | None = Field(
        default=None,
        description="Blob store of uploaded input files and output files: a directory or an fsspec URL "
        "(memory://, s3://bucket/prefix, gs://...). Unset: home/blobs. Every process of a deployment uses the same one.",
    )
    api_host: str = Field(default="127.0.0.1", description="Address the Batch API (`phaseroute api`) listens on.")
    api_port: int = Field(default=8000, ge=1, le=65535, description="Port of the Batch API.")
    api_url: str | None = Field(
        default=None, description="Where clients (the CLI) reach the Batch API. Unset: http://<api_host>:<api_port>/v1.",
    )
    api_key: str | None = Field(default=None, description="A tenant's API key for the CLI's submit/status/results/cancel.")
    max_requests_per_file: int = Field(default=50_000, ge=1, description="Most requests in one batch input file.")
    max_input_bytes: int = Field(default=200 * 1024 * 1024, ge=1, description="Largest batch input file (bytes).")
    max_line_errors: int = Field(default=100, ge=1, description="Most per-line errors listed for an invalid input file.")
    query_token: str | None = Field(
        default=None, description="Bearer token of the SQL endpoint. Unset: a random token the telemetry service "
        "writes to home/secrets/query-token (mode 0600), which local clients read.",
    )
    query_timeout_s: float = Field(default=20.0, gt=0, description="Longest run of one analyst SQL query (seconds).")
    query_max_memory_bytes: int = Field(default=1 << 30, ge=1 << 20, description="Memory limit of one analyst SQL query (bytes).")
    control_session_timeout_s: float = Field(
        default=15.0, ge=6.0, le=300.0,
        description="Session timeout of the control plane's consumer groups (the lease and the Faust app): how long "
        "after an active control plane dies a standby takes over (kill -9: this plus its start).",
    )
    query_concurrency: int = Field(default=2, ge=1, description="Analyst SQL queries served at once; more get 503.")

    _external_kafka: bool = PrivateAttr(default=True)

    @field_validator("bootstrap_servers")
    @classmethod
    def _check_bootstrap(cls, value: str) -> str:
        if not value:
            return value
        for server in value.split(","):
            host, sep, port = server.strip().rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"bootstrap server {server!r} is not host:port (from {value!r})")
        return value

    @field_validator("clickhouse_url")
    @classmethod
    def _check_clickhouse_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://", "chdb://")):
            raise ValueError(f"clickhouse_url {value!r} must start with http://, https:// or chdb://")
        return value

    @model_validator(mode="after")
    def _local_broker_by_default(self) -> Settings:
        if not self.bootstrap_servers:
            self.bootstrap_servers = f"localhost:{self.kafka_port}"
            self._external_kafka = False
        return self

    @property
    def external_kafka(self) -> bool:
        """True when bootstrap_servers names a cluster phaseroute does not start itself."""
        return self._external_kafka

    @property
    def run_dir(self) -> Path:
        """PID files and logs of processes started by `phaseroute up`."""
        return self.home / "run"

    @property
    def chdb_path(self) -> Path:
        return self.home / "chdb"

    @property
    def kv_store(self) -> str:
        return self.kv_store_url or str(self.home / "kv")

    @property
    def model_cache(self) -> Path:
        return self.home / "models"

    @property
    def results_dir(self) -> Path:
        return self.home / "results"

    @property
    def blob_store(self) -> str:
        return self.blob_store_url or str(self.home / "blobs")

    @property
    def api_base_url(self) -> str:
        return self.api_url or f"http://{self.api_host}:{self.api_port}/v1"

    @property
    def query_token_file(self) -> Path:
        return self.home / "secrets" / "query-token"

    def clickhouse_dsn(self) -> str:
        """The clickhouse-connect DSN: the server URL if set, else embedded chdb on home/chdb."""
        return self.clickhouse_url or f"chdb://{self.chdb_path}"


def load_settings(**overrides: object) -> Settings:
    """Read the environment (plus explicit overrides); raise ConfigError naming each bad value."""
    # any value may come in: pydantic validates (and coerces) each one, and a bad one raises below
    values: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**values)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            problems.append(f"PHASEROUTE_{field.upper()}={err.get('input')!r}: {err['msg']}")
        raise ConfigError("invalid phaseroute settings: " + "; ".join(problems)) from None


@lru_cache(maxsize=1)
def settings() -> Settings:
    """Process-wide settings from the environment (cached; tests build their own with load_settings)."""
    return load_settings()
