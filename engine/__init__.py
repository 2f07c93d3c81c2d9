"""Model executors (torch/transformers; vLLM optional and lazily imported), KV codec and stores, profiler."""
