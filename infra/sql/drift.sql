-- Quality drift (applied idempotently by phaseroute.infra.clickhouse.apply_ddl).
-- Column names equal the Avro field names of the record each table stores; the views are
-- what analysts query (`phaseroute query "SELECT * FROM phaseroute.drift_latest"`).

-- One row per path (model, prefill pool, decode pool) and canary round
-- (schemas/avro/drift_measurement.avsc); a replay repeats measurement_id and is merged away.
CREATE TABLE IF NOT EXISTS {db}.drift_measurement
(
    measurement_id        String,
    model                 LowCardinality(String),
    prefill_pool          LowCardinality(String),
    decode_pool           LowCardinality(String),
    colocated             Bool,
    prefill_variant       LowCardinality(String),
    decode_variant        LowCardinality(String),
    canary_set            LowCardinality(String),
    round                 UInt64,
    canaries_sent         UInt32,
    canaries_received     UInt32,
    positions             UInt32,
    greedy_agreement      Float64,
    top1_agreement        Float64,
    mean_kl               Float64,
    max_kl                Float64,
    first_divergence_mean Float64,
    first_divergence_min  UInt32,
    quality_score         Float64,
    exact_ok              Bool,
    state                 LowCardinality(String),
    reason                Nullable(String),
    at                    DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
ORDER BY (model, prefill_pool, decode_pool, at, measurement_id);

-- Demotions and recoveries for EXACT-tier work (schemas/avro/quality_alert.avsc).
CREATE TABLE IF NOT EXISTS {db}.quality_alert
(
    alert_id         String,
    model            LowCardinality(String),
    prefill_pool     LowCardinality(String),
    decode_pool      LowCardinality(String),
    colocated        Bool,
    kind             LowCardinality(String),
    reason           String,
    greedy_agreement Float64,
    top1_agreement   Float64,
    mean_kl          Float64,
    max_kl           Float64,
    measurement_id   String,
    at               DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
ORDER BY (model, prefill_pool, decode_pool, at, alert_id);

-- The views read the table through a subquery whose columns are renamed (d_*), so that an
-- output column may carry the name of the column it aggregates.

-- The latest round of every path: is it allowed EXACT work now, and its figures.
CREATE VIEW IF NOT EXISTS {db}.drift_latest AS
SELECT
    model,
    prefill_pool,
    decode_pool,
    if(d_colocated, prefill_pool, concat(prefill_pool, '->', decode_pool)) AS path,
    argMax(d_prefill_variant, d_at) AS prefill_variant,
    argMax(d_decode_variant, d_at) AS decode_variant,
    argMax(d_state, d_at) AS state,
    argMax(d_exact_ok, d_at) AS exact_ok,
    argMax(d_greedy, d_at) AS greedy_agreement,
    argMax(d_top1, d_at) AS top1_agreement,
    argMax(d_mean_kl, d_at) AS mean_kl,
    argMax(d_max_kl, d_at) AS max_kl,
    argMax(d_first_div, d_at) AS first_divergence_mean,
    argMax(d_reason, d_at) AS reason,
    count() AS rounds,
    max(d_at) AS at
FROM
(
    SELECT model, prefill_pool, decode_pool, colocated AS d_colocated, prefill_variant AS d_prefill_variant,
           decode_variant AS d_decode_variant, state AS d_state, exact_ok AS d_exact_ok,
           greedy_agreement AS d_greedy, top1_agreement AS d_top1, mean_kl AS d_mean_kl, max_kl AS d_max_kl,
           first_divergence_mean AS d_first_div, reason AS d_reason, at AS d_at
    FROM {db}.drift_measurement FINAL
)
GROUP BY model, prefill_pool, decode_pool, d_colocated;

-- Drift per numerics combination over every round measured (the figures of the report).
CREATE VIEW IF NOT EXISTS {db}.drift_by_variant AS
SELECT
    model,
    prefill_variant,
    decode_variant,
    colocated,
    count() AS rounds,
    sum(d_positions) AS positions,
    sum(d_greedy * d_positions) / sum(d_positions) AS greedy_agreement,
    sum(d_top1 * d_positions) / sum(d_positions) AS top1_agreement,
    avg(d_mean_kl) AS mean_kl,
    max(d_max_kl) AS max_kl,
    avg(d_first_div) AS first_divergence_mean,
    min(d_first_div_min) AS first_divergence_min
FROM
(
    SELECT model, prefill_variant, decode_variant, colocated, positions AS d_positions, greedy_agreement AS d_greedy,
           top1_agreement AS d_top1, mean_kl AS d_mean_kl, max_kl AS d_max_kl, first_divergence_mean AS d_first_div,
           first_divergence_min AS d_first_div_min
    FROM {db}.drift_measurement FINAL
)
GROUP BY model, prefill_variant, decode_variant, colocated;

-- Drift over time per path, one row per minute (what `phaseroute drift report` plots).
CREATE VIEW IF NOT EXISTS {db}.drift_per_minute AS
SELECT
    model,
    path,
    minute,
    avg(d_top1) AS top1_agreement,
    avg(d_greedy) AS greedy_agreement,
    avg(d_mean_kl) AS mean_kl,
    max(d_max_kl) AS max_kl,
    min(d_exact_ok) AS exact_ok
FROM
(
    SELECT model, if(colocated, prefill_pool, concat(prefill_pool, '->', decode_pool)) AS path,
           toStartOfMinute(at) AS minute, top1_agreement AS d_top1, greedy_agreement AS d_greedy,
           mean_kl AS d_mean_kl, max_kl AS d_max_kl, exact_ok AS d_exact_ok
    FROM {db}.drift_measurement FINAL
)
GROUP BY model, path, minute;
