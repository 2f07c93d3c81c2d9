"""phaseroute: offline LLM batch inference over Kafka.

The rooms live at the top of the repository and install under this namespace:
``phaseroute.streams`` (control plane, pure policy in ``phaseroute.streams.policy``),
``phaseroute.consumers`` (data-plane workers), ``phaseroute.schemas`` (Avro),
``phaseroute.engine`` (model executors, KV cache), ``phaseroute.infra`` (Kafka,
ClickHouse), ``phaseroute.sim`` (fleet simulator).
"""

__version__ = "0.1.0"
