"""μGraph files: round trips of every benchmark and hand-written μGraph, and rejected files."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import egraph_mirage as em
from egraph_mirage import benchmarks
from egraph_mirage.bench import handwritten_fixtures as fixtures
from egraph_mirage.mugraph.serialize import FORMAT, VERSION, SerializationError


def _programs() -> dict[str, Callable[[], em.KernelGraph]]:
    progs: dict[str, Callable[[], em.KernelGraph]] = {}
    for name in benchmarks.names():
        progs[name] = lambda name=name: benchmarks.get(name, small=True)
        progs[f"fused-{name}"] = lambda name=name: fixtures.fused(
            name, benchmarks.get(name, small=True))
    progs["lora_concat"] = lambda: fixtures.lora_concat(benchmarks.get("lora", small=True))
    progs["rmsnorm_linear-gain"] = lambda: fixtures.rmsnorm_linear(
        benchmarks.get("rmsnorm_linear", small=True, gain=True))
    return progs


PROGRAMS = _programs()


def _inputs(g: em.KernelGraph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(t.dims) * 0.5 for t in g.inputs]


def _kernels(g: em.KernelGraph) -> list[Any]:
    return [t.params["kernel"] for t in g.operators if t.op == "customized"]


def _check_round_trip(g: em.KernelGraph) -> em.KernelGraph:
    text = em.to_json(g)
    assert text == em.to_json(g)  # deterministic
    doc = json.loads(text)
    assert doc["format"] == FORMAT and doc["version"] == VERSION
    h = em.loads(text)
    assert em.to_json(h) == text
    assert [(t.dims, t.dtype) for t in h.inputs] == [(t.dims, t.dtype) for t in g.inputs]
    assert [t.op for t in h.operators] == [t.op for t in g.operators]
    assert h.tensors[: len(h.inputs)] == h.inputs  # numbered inputs first
    assert [em.abstract_expr(t) for t in h.outputs] == [em.abstract_expr(t) for t in g.outputs]
    xs = _inputs(g)
    for a, b in zip(em.run_reference(h, xs), em.run_reference(g, xs), strict=True):
        assert np.array_equal(a, b)
    # a multi-output kernel is rebuilt once and shared, as in the original
    assert len({id(k) for k in _kernels(h)}) == len({id(k) for k in _kernels(g)})
    return h


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_round_trip(name: str) -> None:
    _check_round_trip(PROGRAMS[name]())


def test_round_trip_keeps_tuples_and_shares_multi_output_kernels() -> None:
    h = em.loads(em.to_json(PROGRAMS["fused-qknorm"]()))
    num, den = h.operators[0], h.operators[1]
    assert num.params["kernel"] is den.params["kernel"] and den.params["output"] == 1
    tb = num.params["kernel"].tb
    assert all(isinstance(t.params["input_map"], tuple) for t in tb.inputs)
    norms = [t for t in tb.tensors if t.op == "rms_norm"]
    assert norms and all(t.params["normalized_shape"] == (t.dims[-1],) for t in norms)
    accs = [t.params["acc"] for t in tb.tensors if t.op == "forloop_accum"]
    assert accs == ["plain", "sum"]
    assert all(isinstance(omap, tuple) for _, omap in tb.outputs)
    k = em.loads(em.to_json(PROGRAMS["qknorm"]()))
    assert [t.params["normalized_shape"] for t in k.operators if t.op == "rms_norm"] == [(16,)] * 2


def test_round_trip_of_params_dtypes_and_late_inputs() -> None:
    g = em.new_kernel_graph()
    X = g.new_input((4, 8), em.float32)
    Y = g.mul_scalar(g.reduction(X, -1), 0.1)
    Z = g.new_input((4, 8), em.float32)  # an input after an operator
    C = g.concat(g.rms_norm(X, 8), g.mul_scalar(Z, 2), dim=1)
    g.mark_output(C)
    g.mark_output(Y)
    h = _check_round_trip(g)
    ops = {t.op: t for t in h.operators}
    assert ops["reduction"].params == {"dim": -1}
    assert ops["rms_norm"].params == {"normalized_shape": 8}
    scalars = [t.params["scalar"] for t in h.operators if t.op == "mul_scalar"]
    assert scalars == [0.1, 2] and [type(c) for c in scalars] == [float, int]
    b = em.new_kernel_graph()
    b.mark_output(b.exp(b.new_input((2, 3), em.bfloat16)))
    assert em.loads(em.to_json(b)).inputs[0].dtype == em.bfloat16


def test_file_is_readable_and_flat_lists() -> None:
    text = em.to_json(PROGRAMS["fused-rmsnorm_linear"]())
    assert '"input_map": [1, -1, -1]' in text and '"dims": [64, 96]' in text
    assert text.index('"format"') < text.index('"inputs"') < text.index('"version"')


# --- rejected files -----------------------------------------------------------------------------

def _doc(name: str = "fused-rmsnorm_linear") -> dict[str, Any]:
    return json.loads(em.to_json(PROGRAMS[name]()))


def _fails(text: str, *words: str) -> SerializationError:
    with pytest.raises(SerializationError) as info:
        em.loads(text)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    assert isinstance(info.value, em.EMError) and isinstance(info.value, ValueError)
    return info.value


def _tampered(change: Callable[[dict[str, Any]], Any], name: str = "fused-rmsnorm_linear") -> str:
    doc = _doc(name)
    change(doc)
    return json.dumps(doc)


def test_corrupt_files() -> None:
    text = em.to_json(PROGRAMS["fused-gated_mlp"]())
    _fails("not json {", "not valid JSON")
    _fails(text[: len(text) // 2], "not valid JSON")
    _fails("", "not valid JSON")
    _fails(re.sub(r'"forloop_range": \d+', '"forloop_range": NaN', text, count=1), "NaN")
    _fails('{"format": "egraph-mirage/mugraph", "format": "x"}', "duplicate keys")
    _fails("[" * 100_000, "not valid JSON")
    deep = "[" * 600 + "]" * 600  # parses, but is no parameter: no RecursionError escapes
    _fails(text.replace('"input_map": [-1, -1, -1]', f'"input_map": {deep}', 1), "input_map[0]")
    _fails(_tampered(lambda d: d["operators"][0]["params"].update(normalized_shape=json.loads(
        deep)), "rmsnorm_linear"), "operators[0]", "normalized_shape")


def test_foreign_files_and_versions() -> None:
    _fails("[1, 2]", "not a μGraph file")
    _fails('{"name": "x"}', "not a μGraph file", "format")
    _fails(_tampered(lambda d: d.update(format="other/thing")), "'other/thing'")
    _fails(_tampered(lambda d: d.update(version=99)), "unsupported version 99")
    _fails(_tampered(lambda d: d.update(version=True)), "unsupported version True")
    _fails(_tampered(lambda d: d.update(version="1")), "unsupported version '1'")
    _fails(_tampered(lambda d: d.update(extra=1)), "unexpected ['extra']")


@pytest.mark.parametrize("change, words", [
    # W's loader split on dimension 0 by the grid (6) and the loop (4): 64 does not divide
    (lambda d: d["kernels"][0]["ops"][1]["params"].update(input_map=[0, -1, -1]),
     ["kernels[0].ops[1]", "MapError", "does not split into 24"]),
    (lambda d: d["kernels"][0]["ops"][2].update(op="frobnicate"),
     ["kernels[0].ops[2]", "unknown operator 'frobnicate'"]),
    (lambda d: d["kernels"][0]["ops"][2].update(operands=[1, 0]),
     ["kernels[0].ops[2]", "ShapeError", "matmul"]),
    (lambda d: d["kernels"][0]["ops"][2].update(operands=[0, 7]),
     ["kernels[0].ops[2].operands[1]", "tensor 7 does not exist"]),
    (lambda d: d["kernels"][0]["ops"][2].update(operands=[0, -1]),
     ["kernels[0].ops[2].operands[1]", "tensor -1 does not exist"]),
    (lambda d: d["kernels"][0]["ops"][2].update(operands=[0, 3]),  # a later tensor
     ["kernels[0].ops[2].operands[1]", "does not exist"]),
    (lambda d: d["kernels"][0]["ops"][2]["params"].update(dim=1),
     ["kernels[0].ops[2].params", "unexpected ['dim']"]),
    (lambda d: d["kernels"][0]["ops"][4]["params"].update(acc="max"),
     ["kernels[0].ops[4]", "unknown accumulator 'max'"]),
    (lambda d: d["kernels"][0]["ops"][4].update(operands=[0, 1]),
     ["kernels[0].ops[4]", "forloop_accum takes 1 operand"]),
    (lambda d: d["kernels"][0]["ops"][0].update(operands=[0]),
     ["kernels[0].ops[0].operands[0]", "does not exist"]),
    (lambda d: d["kernels"][0]["ops"][2].update(op="customized", params={}),
     ["kernels[0].ops[2].op", "not allowed in a thread-block graph"]),
    (lambda d: d["kernels"][0]["ops"].append(d["kernels"][0]["ops"][0]),
     ["kernels[0].ops[6]", "loader #2", "has 2"]),
    (lambda d: d["kernels"][0]["outputs"][0].update(tensor=2),
     ["kernels[0].outputs[0]", "forloop_accum"]),
    (lambda d: d["kernels"][0]["outputs"][0].update(output_map=[-1, -1, -1]),
     ["kernels[0].outputs[0]", "unmapped"]),
    (lambda d: d["kernels"][0].pop("outputs"), ["kernels[0]", "missing ['outputs']"]),
    (lambda d: d["kernels"][0].update(grid_dim=[3, 1]), ["kernels[0]", "grid_dim"]),
    (lambda d: d["kernels"][0].update(smem_bytes="big"), ["kernels[0].smem_bytes", "integer"]),
    (lambda d: d["kernels"][0].update(smem_bytes=64),
     ["operators[0] (kernels[0])", "ResourceError", "shared memory"]),
    (lambda d: d["operators"][0].update(op="frobnicate"),
     ["operators[0]", "unknown operator 'frobnicate'"]),
    (lambda d: d["operators"][0].update(operands=[0, 5]),
     ["operators[0].operands[1]", "tensor 5 does not exist"]),
    (lambda d: d["operators"][0].update(operands=[1, 0]), ["kernels[0].ops[1]", "MapError"]),
    (lambda d: d["operators"][0].update(operands=[0, 1, 0]),
     ["operators[0] (kernels[0])", "2 loaders but 3 inputs"]),
    (lambda d: d["operators"][0].update(operands=[0]), ["kernels[0].ops[1]", "loader #1"]),
    (lambda d: d["operators"][0]["params"].update(kernel=3),
     ["operators[0]", "kernel 3 does not exist"]),
    (lambda d: d["operators"][0]["params"].update(kernel=-1),
     ["operators[0].params.kernel", "integer >= 0"]),
    (lambda d: d["operators"][0]["params"].update(output=1),
     ["operators[0]", "must be its output 0, not output 1"]),
    (lambda d: d["operators"].append(d["operators"][0]),
     ["operators[1]", "already used by operators[0]"]),
    (lambda d: d["kernels"].append(d["kernels"][0]), ["kernels[1]", "not used by any operator"]),
    (lambda d: d["inputs"][0].update(dtype="float8"), ["inputs[0].dtype", "unknown dtype"]),
    (lambda d: d["inputs"][0].update(dims=[2, 0]), ["inputs[0]", "positive"]),
    (lambda d: d["inputs"][0].update(dims="2x64"), ["inputs[0].dims", "JSON list"]),
    (lambda d: d.update(outputs=[9]), ["outputs[0]", "tensor 9 does not exist"]),
    (lambda d: d.update(outputs=[2, 2]), ["outputs[1]", "already an output"]),
    (lambda d: d.update(operators={}), ["operators", "JSON list"]),
])
def test_tampered_content(change: Callable[[dict[str, Any]], Any], words: list[str]) -> None:
    _fails(_tampered(change), *words)


def test_tampered_multi_output_kernels() -> None:
    def swap(d: dict[str, Any]) -> None:
        d["operators"][0], d["operators"][1] = d["operators"][1], d["operators"][0]

    _fails(_tampered(swap, "fused-mha"), "operators[0]", "output 0")
    _fails(_tampered(lambda d: d["operators"][1].update(operands=[0, 1, 1]), "fused-mha"),
           "operators[1]", "same operands")
    _fails(_tampered(lambda d: d["operators"].insert(1, {"op": "exp", "operands": [0],
                                                         "params": {}}), "fused-mha"),
           "operators[1]", "expected output 1 of kernel 0")

    def drop_second(d: dict[str, Any]) -> None:
        del d["operators"][1:]
        d["outputs"] = [3]

    _fails(_tampered(drop_second, "fused-mha"), "missing output 1 of kernel 0")
    _fails(_tampered(lambda d: d["kernels"][1]["ops"][0]["params"].update(input_map=[0, 5, -1]),
                     "fused-mha"), "kernels[1].ops[0]", "names dimension 5")


def test_loads_wants_text() -> None:
    with pytest.raises(SerializationError, match="JSON text"):
        em.loads(b"{}")  # type: ignore[arg-type]


def test_unsavable_graphs() -> None:
    g = PROGRAMS["fused-mha"]()
    h = em.new_kernel_graph()
    ins = [h.new_input(t.dims, t.dtype) for t in g.inputs]
    kernel = g.operators[0].params["kernel"]
    h.mark_output(h.apply("customized", ins, kernel=kernel, output=1))  # not via h.customized
    with pytest.raises(SerializationError, match=r"operators\[0\]: the outputs of a kernel"):
        em.to_json(h)
    with pytest.raises(SerializationError, match="expected a KernelGraph"):
        em.mugraph.serialize.dumps("graph")  # type: ignore[arg-type]


# --- files ------------------------------------------------------------------------------------

def test_save_and_load(tmp_path: Path) -> None:
    g = PROGRAMS["fused-gqa"]()
    path = tmp_path / "gqa.json"
    em.save(g, path)
    assert path.read_text(encoding="utf-8") == em.to_json(g) + "\n"
    h = em.load(path)
    assert em.to_json(h) == em.to_json(g)
    assert em.to_json(em.load(str(path))) == em.to_json(g)
    other = PROGRAMS["fused-ntrans"]()
    em.save(other, str(path))  # replaces the file
    assert em.to_json(em.load(path)) == em.to_json(other)
    assert sorted(os.listdir(tmp_path)) == ["gqa.json"]  # no temporary files left
    (tmp_path / "plain.txt").write_text("x")  # the saved file's mode follows the umask
    assert path.stat().st_mode == (tmp_path / "plain.txt").stat().st_mode


def test_failed_save_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    em.save(PROGRAMS["lora"](), path)
    before = path.read_bytes()
    bad = em.new_kernel_graph()
    kernel = _kernels(PROGRAMS["fused-mha"]())[0]
    bad.apply("customized", [bad.new_input(t.dims, t.dtype) for t in kernel.tb.sources],
              kernel=kernel, output=1)
    with pytest.raises(SerializationError):
        em.save(bad, path)
    with pytest.raises(OSError):
        em.save(PROGRAMS["lora"](), tmp_path / "missing" / "g.json")
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["g.json"]


@pytest.mark.parametrize("content, words", [
    (b"{\"format\": \"egraph-mirage/mugraph\", \"vers", ["not valid JSON"]),
    (b"\xff\xfe\x00garbage", ["not UTF-8"]),
    (b"{\"kind\": \"notebook\"}", ["not a μGraph file"]),
    (b"{\"format\": \"egraph-mirage/mugraph\", \"version\": 99}", ["unsupported version 99"]),
])
def test_load_errors_name_the_file(tmp_path: Path, content: bytes, words: list[str]) -> None:
    path = tmp_path / "broken.json"
    path.write_bytes(content)
    with pytest.raises(SerializationError) as info:
        em.load(path)
    assert str(info.value).startswith(f"{path}: ")
    for w in words:
        assert w in str(info.value)


def test_load_error_from_content_names_the_file_and_entry(tmp_path: Path) -> None:
    path = tmp_path / "tampered.json"
    path.write_text(_tampered(lambda d: d["kernels"][0]["ops"][3].update(op="nope")))
    with pytest.raises(SerializationError,
                       match=r"tampered\.json: kernels\[0\]\.ops\[3\]: .*'nope'"):
        em.load(path)


@pytest.mark.parametrize("name, words", [
    ("absent.json", "no such μGraph file"), (".", "is a folder"), ("a\0b.json", "cannot read"),
])
def test_load_of_what_is_not_a_file_names_the_path(tmp_path: Path, name: str, words: str) -> None:
    path = tmp_path / name if name != "." else tmp_path
    with pytest.raises(SerializationError) as info:
        em.load(path)
    assert str(info.value).startswith(f"{path}: ") and words in str(info.value)
    with pytest.raises(SerializationError, match="expected a path, got int"):
        em.load(3)  # type: ignore[arg-type]
