"""Avro schemas (one .avsc per message kind) and the serde used by confluent-kafka code and Faust alike."""
