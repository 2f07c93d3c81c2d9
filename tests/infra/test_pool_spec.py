"""One pool-spec grammar: the parser, `up --help`, its errors and the README's examples agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from phaseroute.cli.main import app
from phaseroute.infra.pool_spec import POOL_SPEC_EXAMPLE, POOL_SPEC_FORM, PoolSpec, parse_pools

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.parametrize(("spec", "expected"), [
    ("p=prefill:fp32", PoolSpec("p", "prefill", "fp32", 1, 1)),
    ("d=decode:int8-dynamic:2", PoolSpec("d", "decode", "int8-dynamic", 2, 1)),
    ("c=both:fp32x2", PoolSpec("c", "both", "fp32", 1, 2)),
    ("c=both:fp32:1x2", PoolSpec("c", "both", "fp32", 1, 2)),
    ("w=both:int8-weight:3x4", PoolSpec("w", "both", "int8-weight", 3, 4)),
])
def test_every_part_of_the_form_parses(spec: str, expected: PoolSpec) -> None:
    assert parse_pools(spec, cores=1) == [expected]  # one core: what a part leaves out plans to 1


def test_the_example_parses() -> None:
    assert [p.name for p in parse_pools(POOL_SPEC_EXAMPLE)] == ["prefill-fp32", "decode-int8", "colo-fp32"]


@pytest.mark.parametrize(("spec", "names"), [
    ("colo", "no '=' after the pool name"),
    ("colo=both", "not in that form"),
    ("colo=both:fp32:", "not in that form"),
    ("colo=both:fp32x", "variant 'fp32x' must be one of"),
    ("colo=both:fp32:2x", "not in that form"),
    ("colo=colocated:fp32", "phase 'colocated' must be one of prefill, decode, both"),
    ("colo=both:fp16", "variant 'fp16' must be one of fp32, bf16, int8-dynamic, int8-weight"),
    ("colo=both:fp32:0", "threads 0 must be a whole number >= 1"),
    ("colo=both:fp32x0", "workers 0 must be a whole number >= 1"),
    ("Colo=both:fp32", "pool name 'Colo' must match"),
])
def test_a_bad_spec_names_the_part_and_shows_the_form(spec: str, names: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_pools(spec)
    assert names in str(err.value)
    assert f"pool spec {spec!r}" in str(err.value) and POOL_SPEC_FORM in str(err.value)


@pytest.mark.parametrize(("spec", "cores", "planned"), [
    # the demo on 2 cores: the prefilling pools share the cores, the decode pool gets them again at a lower priority
    ("p=prefill:fp32,d=decode:int8-dynamic,c=both:fp32", 2, [(1, 1, 0), (1, 2, 10), (1, 1, 0)]),
    ("c=both:fp32", 2, [(1, 2, 0)]),  # a process per core
    ("c=both:fp32", 16, [(1, 16, 0)]),
    ("d=decode:fp32", 2, [(1, 2, 0)]),  # no prefilling pool beside it: normal priority
    ("p=prefill:fp32,d=decode:fp32", 16, [(1, 16, 0), (1, 16, 10)]),
    ("p=prefill:fp32x3,d=decode:fp32", 8, [(2, 3, 0), (1, 8, 10)]),  # fixed workers: their threads use the cores
    ("c=both:fp32x2", 8, [(4, 2, 0)]),  # fewer workers fixed than cores: their threads use the rest
    ("p=prefill:fp32:2,d=decode:fp32", 8, [(2, 4, 0), (1, 8, 10)]),  # a pool's own threads are kept, its workers fit them
])
def test_threads_workers_and_priority_left_out_are_planned_for_the_cores(spec: str, cores: int,
                                                                         planned: list[tuple[int, int, int]]) -> None:
    assert [(p.threads, p.workers, p.nice) for p in parse_pools(spec, cores)] == planned


def test_a_pool_named_twice_or_none_is_an_error() -> None:
    with pytest.raises(ValueError, match="names pool\\(s\\) a more than once"):
        parse_pools("a=both:fp32,a=decode:fp32")
    with pytest.raises(ValueError, match="names no pool"):
        parse_pools(" , ")


def test_yaml_pools_with_the_same_fields(tmp_path: Path) -> None:
    good = tmp_path / "pools.yaml"
    good.write_text("colo: {phase: both, variant: fp32, threads: 2, workers: 3}\n")
    assert parse_pools(str(good)) == [PoolSpec("colo", "both", "fp32", 2, 3)]
    assert parse_pools(str(tmp_path / "pools.yaml"), cores=16) == [PoolSpec("colo", "both", "fp32", 2, 3)]
    planned = tmp_path / "planned.yaml"
    planned.write_text("colo: {phase: both, variant: fp32}\n")
    assert parse_pools(str(planned), cores=16) == [PoolSpec("colo", "both", "fp32", 1, 16)]
    niced = tmp_path / "niced.yaml"
    niced.write_text("dec: {phase: decode, variant: fp32, workers: 1, nice: 5}\np: {phase: prefill, variant: fp32}\n")
    assert parse_pools(str(niced), cores=2) == [PoolSpec("dec", "decode", "fp32", 2, 1, nice=5),
                                                PoolSpec("p", "prefill", "fp32", 1, 2)]  # a pool's own nice is kept
    for value in ("-1", "20", "high"):
        niced.write_text(f"dec: {{phase: decode, variant: fp32, nice: {value}}}\n")
        with pytest.raises(ValueError, match=rf"pool 'dec': nice '?{value}'? must be a whole number 0-19"):
            parse_pools(str(niced))
    phaseless = tmp_path / "phaseless.yaml"
    phaseless.write_text("colo: {variant: fp32}\n")
    with pytest.raises(ValueError, match=r"pool file .*phaseless.yaml.*phase"):
        parse_pools(str(phaseless))
    zero = tmp_path / "zero.yaml"
    zero.write_text("colo: {phase: both, variant: fp32, workers: 0}\n")
    with pytest.raises(ValueError, match=r"pool 'colo'.*workers 0 must be a whole number >= 1"):
        parse_pools(str(zero))
    bad = tmp_path / "bad.yaml"
    bad.write_text("colo: {phase: both, variant: fp32, thread: 2}\n")
    with pytest.raises(ValueError, match=r"pool 'colo' has unknown field\(s\) \['thread'\]"):
        parse_pools(str(bad))
    with pytest.raises(ValueError, match="does not exist"):
        parse_pools(str(tmp_path / "missing.yaml"))


def test_up_help_shows_the_form_the_parser_reads() -> None:
    result = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "400"}, terminal_width=400)
    assert result.exit_code == 0
    assert POOL_SPEC_FORM in result.output and POOL_SPEC_EXAMPLE in result.output


def test_up_refuses_a_bad_spec_before_starting_anything(tmp_path: Path) -> None:
    env = {"PHASEROUTE_HOME": str(tmp_path), "PHASEROUTE_BOOTSTRAP_SERVERS": "localhost:1", "COLUMNS": "400"}
    result = CliRunner().invoke(app, ["up", "--pools", "colo=both:fp32x"], env=env)
    assert result.exit_code == 1
    assert POOL_SPEC_FORM in result.output and "'colo=both:fp32x'" in result.output
    assert not (tmp_path / "run").exists()


def test_every_pools_example_in_the_readme_parses() -> None:
    examples = re.findall(r'--pools "([^"]+)"', README.read_text())
    assert examples, "the README shows no `up --pools` example"
    for example in examples:
        assert parse_pools(example), example
