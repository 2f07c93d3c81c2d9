"""The cluster's security settings, given once, for every Kafka client phaseroute makes.

``PHASEROUTE_KAFKA_CLIENT_CONFIG`` holds librdkafka properties as JSON (``security.protocol``,
``sasl.mechanism``, ``sasl.username``, ``sasl.password``, ``ssl.ca.location``,
``ssl.certificate.location``, ``ssl.key.location``, ...). ``with_cluster_config`` lays them
under a confluent-kafka client's own settings (the workers, sinks, views, drift monitor,
provisioning, the API and the CLI all build their clients through it), and
``faust_credentials`` turns the same properties into the credentials Faust's aiokafka takes,
so the control plane reaches the cluster the same way. A property Faust cannot express is an
error that names it, not a client that connects without it.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
SSL_PROTOCOLS = ("SSL", "SASL_SSL")
PROTOCOLS = ("PLAINTEXT", *SASL_PROTOCOLS, "SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
FAUST_CANNOT = ("sasl.kerberos.service.name", "sasl.oauthbearer.config", "ssl.keystore.location")


def cluster_config() -> dict[str, str]:
    """The configured security properties (empty for the local broker)."""
    from phaseroute.config import settings

    return dict(settings().kafka_client_config)


def with_cluster_config(config: Mapping[str, Any], cluster: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``config`` with the cluster's security properties underneath (the caller's keys win)."""
    return {**(cluster_config() if cluster is None else cluster), **config}


def faust_credentials(cluster: Mapping[str, str] | None = None) -> Any:
    """Faust broker credentials for the cluster's properties; None for PLAINTEXT."""
    import faust

    props = cluster_config() if cluster is None else dict(cluster)
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise ValueError(f"security.protocol {props['security.protocol']!r} in PHASEROUTE_KAFKA_CLIENT_CONFIG "
                         f"must be one of {', '.join(PROTOCOLS)}")
    unsupported = sorted(k for k in props if k in FAUST_CANNOT)
    if unsupported:
        raise ValueError(f"PHASEROUTE_KAFKA_CLIENT_CONFIG sets {', '.join(unsupported)}, which the control plane's "
                         "Faust client cannot use; use SASL PLAIN/SCRAM and PEM files (ssl.ca.location, ...)")
    if protocol == "PLAINTEXT":
        return None
    context = _ssl_context(props) if protocol in SSL_PROTOCOLS else None
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    mechanism = props.get("sasl.mechanism", "PLAIN").upper()
    if mechanism not in SASL_MECHANISMS:
        raise ValueError(f"sasl.mechanism {props.get('sasl.mechanism')!r} in PHASEROUTE_KAFKA_CLIENT_CONFIG must be "
                         f"one of {', '.join(SASL_MECHANISMS)} for the control plane")
    missing = [k for k in ("sasl.username", "sasl.password") if not props.get(k)]
    if missing:
        raise ValueError(f"security.protocol {protocol} needs {' and '.join(missing)} in PHASEROUTE_KAFKA_CLIENT_CONFIG")
    return faust.SASLCredentials(username=props["sasl.username"], password=props["sasl.password"],
                                 mechanism=mechanism, ssl_context=context)


def _ssl_context(props: Mapping[str, str]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=props.get("ssl.ca.location"))
    if props.get("ssl.certificate.location"):
        context.load_cert_chain(props["ssl.certificate.location"], props.get("ssl.key.location"),
                                props.get("ssl.key.password"))
    return context
