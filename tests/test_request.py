"""One request, validated once (``pipeline.Request``): every entry point builds one, and a value
that cannot be meant is refused by the same check, named as that entry point spells it."""

from __future__ import annotations

import dataclasses
import math

import pytest

import egraph_mirage as em
from egraph_mirage.cli import main
from egraph_mirage.pipeline import DEFAULT_BUDGETS, Request, RequestError
from egraph_mirage.search import SearchError


@pytest.mark.parametrize("field,value", [
    ("time_budget", 0), ("time_budget", -1.0), ("time_budget", math.nan), ("time_budget", True),
    ("max_tasks", 0), ("max_tasks", 2.5), ("workers", 0), ("search_share", 0.0),
    ("search_share", 1.5), ("progress_interval", -1.0), ("seed", "1"),
])
def test_a_value_that_cannot_be_meant_is_refused_naming_its_field(field: str, value: object
                                                                   ) -> None:
    with pytest.raises(RequestError, match=f"superoptimize: {field} ") as info:
        Request(**{field: value})
    assert info.value.field == field and isinstance(info.value, SearchError)


def test_a_request_is_frozen_and_its_defaults_are_the_libraries() -> None:
    r = Request()
    assert r.time_budget == DEFAULT_BUDGETS["superoptimize"] and not r.limited()
    assert Request(time_budget=math.inf).limited() is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.time_budget = 5.0  # type: ignore[misc]
    assert Request.of(rules="rules", extra_rules=["a.egg", "b.egg"]).extra_rules[1].name == "b.egg"
    with pytest.raises(RequestError, match="extra_rules must be rule files"):
        Request.of(extra_rules=[3])


def test_every_entry_point_refuses_through_the_one_check(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    """The library, the command line (its flag's name), the torch backend (its option's name):
    the same words, from ``Request``."""
    g = em.benchmarks.get("rmsnorm_linear", small=True)
    with pytest.raises(SearchError, match="superoptimize: time_budget must be a positive"):
        em.superoptimize(g, time_budget=0)
    assert main(["optimize", "rmsnorm_linear", "--small", "--budget", "0"]) == 2
    assert "error: --budget must be a positive number of seconds" in capsys.readouterr().err
    pytest.importorskip("torch")
    from egraph_mirage.fx.options import BackendError, BackendOptions

    with pytest.raises(BackendError, match="backend: budget must be a positive number"):
        BackendOptions.of({"budget": 0})
    with pytest.raises(BackendError, match="backend: workers must be a positive integer"):
        BackendOptions.of({"workers": 0})
