"""The cluster's security properties become every client's settings and Faust's credentials;
what Faust cannot express is refused by name."""

from __future__ import annotations

import faust
import pytest

from phaseroute.infra.kafka_security import faust_credentials, with_cluster_config

SCRAM = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "pr", "sasl.password": "s"}


def test_the_local_broker_needs_no_credentials() -> None:
    assert faust_credentials({}) is None
    assert faust_credentials({"security.protocol": "plaintext"}) is None


def test_sasl_over_tls_becomes_faust_sasl_credentials_with_a_tls_context() -> None:
    creds = faust_credentials(SCRAM)
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password, creds.mechanism.value) == ("pr", "s", "SCRAM-SHA-512")
    assert creds.ssl_context is not None and creds.protocol.value == "SASL_SSL"


def test_sasl_without_tls_has_no_context() -> None:
    creds = faust_credentials({**SCRAM, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"})
    assert creds.ssl_context is None and creds.protocol.value == "SASL_PLAINTEXT"


def test_tls_only_becomes_ssl_credentials() -> None:
    assert isinstance(faust_credentials({"security.protocol": "SSL"}), faust.SSLCredentials)


@pytest.mark.parametrize(("props", "named"), [
    ({"security.protocol": "SASL_TLS"}, "'SASL_TLS'"),
    ({**SCRAM, "sasl.mechanism": "GSSAPI"}, "'GSSAPI'"),
    ({**SCRAM, "sasl.password": ""}, "sasl.password"),
    ({**SCRAM, "sasl.kerberos.service.name": "kafka"}, "sasl.kerberos.service.name"),
])
def test_what_the_control_plane_cannot_use_is_refused_by_name(props: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        faust_credentials(props)


def test_the_callers_settings_win_over_the_clusters() -> None:
    merged = with_cluster_config({"bootstrap.servers": "b:9092", "client.id": "me"}, {**SCRAM, "client.id": "cluster"})
    assert merged["client.id"] == "me" and merged["sasl.username"] == "pr" and merged["bootstrap.servers"] == "b:9092"
