"""Typed settings: one prefix, and errors that name the bad value."""

import pytest

from phaseroute.config import ConfigError, load_settings


def test_environment_with_prefix_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PHASEROUTE_BOOTSTRAP_SERVERS", "broker-1:9092,broker-2:9093")
    monkeypatch.setenv("PHASEROUTE_HOME", str(tmp_path))
    cfg = load_settings()
    assert cfg.bootstrap_servers == "broker-1:9092,broker-2:9093"
    assert cfg.clickhouse_dsn() == f"chdb://{tmp_path}/chdb"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("PHASEROUTE_BOOTSTRAP_SERVERS", "localhost", "PHASEROUTE_BOOTSTRAP_SERVERS='localhost'"),
        ("PHASEROUTE_KAFKA_PORT", "99999", "PHASEROUTE_KAFKA_PORT='99999'"),
        ("PHASEROUTE_CLICKHOUSE_URL", "ftp://x", "PHASEROUTE_CLICKHOUSE_URL='ftp://x'"),
        ("PHASEROUTE_KAFKA_START_TIMEOUT_S", "soon", "PHASEROUTE_KAFKA_START_TIMEOUT_S='soon'"),
    ],
)
def test_bad_values_are_named(monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match="invalid phaseroute settings") as err:
        load_settings()
    assert message in str(err.value)


def test_server_url_replaces_embedded_chdb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASEROUTE_CLICKHOUSE_URL", "http://default:@ch.internal:8123")
    assert load_settings().clickhouse_dsn() == "http://default:@ch.internal:8123"
