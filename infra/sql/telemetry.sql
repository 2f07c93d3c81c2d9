-- Telemetry tables (applied idempotently by phaseroute.infra.clickhouse.apply_ddl).
-- Column names equal the Avro field names of the record each table stores.

-- One row per executed batch (schemas/avro/phase_telemetry.avsc).
CREATE TABLE IF NOT EXISTS {db}.phase_telemetry
(
    batch_id       String,
    pool           LowCardinality(String),
    worker_id      String,
    model          LowCardinality(String),
    phase          LowCardinality(String),
    variant        LowCardinality(String),
    batch_size     UInt32,
    tokens_in      UInt64,
    tokens_out     UInt64,
    seq_len_mean   Float64,
    seq_len_max    UInt32,
    queue_wait_s   Float64,
    exec_time_s    Float64,
    steps          UInt32,
    step_latency_s Float64,
    step_latency_s_max Float64,
    kv_bytes       UInt64,
    kv_transfer_s  Float64,
    source_pool    Nullable(String),
    status         LowCardinality(String),
    error_class    Nullable(String),
    at             DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
ORDER BY (model, phase, pool, variant, at, batch_id);

-- Worker liveness as the heartbeats reported it (schemas/avro/pool_heartbeat.avsc).
CREATE TABLE IF NOT EXISTS {db}.pool_heartbeat
(
    pool            LowCardinality(String),
    worker_id       String,
    phase           LowCardinality(String),
    variant         LowCardinality(String),
    queue_depth     Int64,
    consumer_lag    Int64,
    batch_in_flight UInt32,
    max_batch       UInt32,
    memory_bytes    UInt64,
    kv_free_bytes   UInt64,
    status          LowCardinality(String),
    at              DateTime64(3, 'UTC')
)
ENGINE = MergeTree
ORDER BY (pool, worker_id, at)
TTL toDateTime(at) + INTERVAL 7 DAY;
