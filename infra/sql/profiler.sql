-- Cold-start engine profiles (applied idempotently by phaseroute.infra.clickhouse.apply_ddl).
-- Written by `phaseroute profile --pool NAME` (phaseroute.engine.profiler): one row per grid cell.
-- prefill rows: seq_len = prompt tokens per sequence, latency = one batched forward pass.
-- decode rows:  seq_len = context tokens per sequence, latency = one decode step (batch_size tokens).

CREATE TABLE IF NOT EXISTS {db}.engine_profile
(
    run_id                 String,
    pool                   LowCardinality(String),
    model                  LowCardinality(String),
    variant                LowCardinality(String),
    backend                LowCardinality(String),
    device                 LowCardinality(String),
    dtype                  LowCardinality(String),
    quantization           LowCardinality(String),
    threads                UInt16,
    host                   String,
    phase                  LowCardinality(String),
    batch_size             UInt32,
    seq_len                UInt32,
    samples                UInt32,
    latency_s              Float64,
    latency_p50_s          Float64,
    tokens_per_s           Float64,
    kv_bytes_per_token     UInt64,
    memory_bytes_per_token Float64,
    peak_rss_bytes         UInt64,
    at                     DateTime64(3, 'UTC')
)
ENGINE = MergeTree
ORDER BY (model, pool, variant, phase, batch_size, seq_len, at);
