"""The ``torch.compile`` backend's options (``BackendOptions``), checked once, and its errors.

Options (``torch.compile(..., options={...})`` or ``Backend(**options)``):

- ``budget``: seconds for the searches of a whole compilation (one graph Dynamo hands the
  backend), ``refine`` included (default 60; None: no limit). One deadline is set when the
  compilation starts, and each search gets a share of the seconds left before it
  (``fx.budget``: the seconds left times the piece's weight, the bytes it moves plus a quarter
  of the mean piece's, over the weights of the pieces not yet reached, itself included; the
  parts of a refined piece join those). A piece reached once no time is left is not searched:
  it is kept, "the compilation's time budget was spent". A cache hit costs nothing;
- ``max_tasks``: search tasks per piece (None: all);
- ``workers``: search processes (None: every core; one pool serves every piece of a
  compilation, but a piece whose checks need more memory gets as many as fit) or a
  ``concurrent.futures.Executor``;
- ``config``: a ``SearchConfig`` or a mapping of its fields;
- ``cache_dir`` (default ``fx.cache.default_cache_dir()``), ``cache`` (False: neither read nor
  write);
- ``profile``: GPU timing against Inductor (default: on where CUDA is);
- ``rest``: "inductor" (the default) or "eager" (for tests) runs what is not replaced;
- ``autotune``: Inductor compiles the rest, and the code each winner is timed against, with
  max-autotune (its GEMM templates autotuned) where ``torch.compile``'s mode does not ask for
  it (``AUTOTUNE_MODES``: the default mode becomes "max-autotune-no-cudagraphs",
  "reduce-overhead" becomes "max-autotune"), so that a piece is replaced only where it beats
  Inductor's best code and what is kept is that code (None, the default: on a GPU; False: the
  mode as given, which compiles faster). With ``profile`` on too, Inductor's code for the
  whole graph is compiled in both modes and the faster one runs (``fx.whole``);
- ``max_matmuls`` / ``max_reductions``: the partitioner's caps per piece;
- ``timing``: "both", "graph" or "plain": how the graph with its replaced pieces must beat
  Inductor's code (``fx.decision``: a piece alone, ``slower_alone``; the graph, ``slower``);
- ``launch``: "inductor" (on a GPU, Inductor launches the replaced pieces' kernels from its
  own code, where that matches Dynamo's graph) or "op" (each piece a call of its custom op);
- ``refine`` (True): cut a piece with nothing found at its matmuls and search the parts;
- ``verbose``: print the report to stderr;
- ``search``: a function standing in for ``em.superoptimize``, for tests.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from ..errors import EMError
from ..pipeline import DEFAULT_BUDGETS, Request, RequestError
from ..search.config import SearchConfig

#: the ``timing`` option's values
TIMINGS = ("both", "graph", "plain")
#: with ``autotune``, the Inductor mode the rest is compiled in, per torch.compile's mode
AUTOTUNE_MODES = {None: "max-autotune-no-cudagraphs", "default": "max-autotune-no-cudagraphs",
                  "reduce-overhead": "max-autotune"}
#: the ``budget`` option's default: seconds for a whole compilation's searches
DEFAULT_BUDGET = DEFAULT_BUDGETS["torch backend"]


class BackendError(EMError, ValueError):
    """The backend was given an unknown or malformed option."""


class DynamicShapesError(BackendError):
    """``torch.compile(..., dynamic=True)``: the backend compiles static shapes only."""


@dataclass(frozen=True)
class BackendOptions:
    """The backend's options (module docstring), checked."""

    #: seconds for the searches of a whole compilation, shared by its pieces (``fx.budget``)
    budget: float | None = DEFAULT_BUDGET
    max_tasks: int | None = None
    #: a process count (None: every core) or a ``concurrent.futures.Executor`` (a Dask
    #: ``Client.get_executor()``); a count starts one pool per compilation, shared by its pieces
    workers: int | cf.Executor | None = None
    config: SearchConfig = field(default_factory=SearchConfig)
    cache_dir: str | None = None
    cache: bool = True
    profile: bool | None = None
    rest: str = "inductor"
    #: Inductor's max-autotune for the rest where torch.compile's mode does not ask for it
    #: (None: on a GPU)
    autotune: bool | None = None
    max_matmuls: int = 2
    max_reductions: int = 4
    #: cut a piece the search found nothing for at its matmuls' inputs, and search the parts
    refine: bool = True
    #: on a GPU, how a winner must beat Inductor's code for its piece to replace it: under
    #: "graph" (CUDA-graph replay), "plain" launches, or "both"
    timing: str = "both"
    #: how the replaced pieces' kernels are launched on a GPU: "inductor" (Inductor launches
    #: them itself, from its own code, where it compiles them and the graph's outputs match
    #: Dynamo's graph; else as "op"), or "op" (each piece a call of its custom op)
    launch: str = "inductor"
    verbose: bool = False
    #: the search (default ``em.superoptimize``): any function taking ``(graph, config,
    #: time_budget=, workers=, max_tasks=, progress=, profile=)`` and returning its results
    search: Callable[..., Any] | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any] | None) -> BackendOptions:
        """The options checked; a ``BackendError`` names the first that is wrong."""
        options = dict(options or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise BackendError(f"egraph_mirage backend: unknown option(s) {unknown}; known: "
                               f"{sorted(known)}")
        config = options.get("config")
        if isinstance(config, Mapping):
            try:
                options["config"] = SearchConfig(**config)
            except TypeError as e:
                raise BackendError(f"egraph_mirage backend: config: {e}") from None
        elif config is None:
            options.pop("config", None)
        elif not isinstance(config, SearchConfig):
            raise BackendError(f"egraph_mirage backend: config must be a SearchConfig or a "
                               f"mapping of its fields, got {config!r}")
        if options.get("timing", "both") not in TIMINGS:
            raise BackendError(f"egraph_mirage backend: timing must be one of {TIMINGS}, got "
                               f"{options['timing']!r}")
        if options.get("launch", "inductor") not in ("inductor", "op"):
            raise BackendError(f"egraph_mirage backend: launch must be 'inductor' or 'op', got "
                               f"{options['launch']!r}")
        if options.get("rest", "inductor") not in ("inductor", "eager"):
            raise BackendError(f"egraph_mirage backend: rest must be 'inductor' or 'eager', got "
                               f"{options['rest']!r}")
        try:  # budget, task budget and workers: checked as the pipeline's Request checks them
            Request(time_budget=options.get("budget", DEFAULT_BUDGET),
                    max_tasks=options.get("max_tasks"), workers=options.get("workers"))
        except RequestError as e:
            name = {"time_budget": "budget"}.get(e.field, e.field)
            raise BackendError(f"egraph_mirage backend: {name} {e.detail}") from None
        if options.get("autotune") not in (None, True, False):
            raise BackendError(f"egraph_mirage backend: autotune must be True, False or None, "
                               f"got {options['autotune']!r}")
        if options.get("search") is not None and not callable(options["search"]):
            raise BackendError(f"egraph_mirage backend: search must be a function, got "
                               f"{options['search']!r}")
        return cls(**options)

    def search_settings(self) -> dict[str, Any]:
        """What the cache key records of the search: what changes what it finds."""
        search = self.search
        qualname = getattr(search, "__qualname__", type(search).__qualname__)
        name = "" if search is None else f"{getattr(search, '__module__', '')}.{qualname}"
        return {"budget": self.budget, "max_tasks": self.max_tasks, "search": name,
                "profile": self.profiling(), "config": repr(asdict(self.config))}

    def inductor_mode(self, mode: str | None) -> str | None:
        """The mode Inductor compiles the rest, and the code winners are timed against, in:
        ``torch.compile``'s ``mode``, with ``autotune`` on (by default where CUDA is) its
        max-autotune counterpart (``AUTOTUNE_MODES``)."""
        autotune = (bool(torch.cuda.is_available()) if self.autotune is None
                    else bool(self.autotune))
        return AUTOTUNE_MODES.get(mode, mode) if autotune else mode

    def inductor_modes(self, mode: str | None) -> tuple[str | None, ...]:
        """The modes Inductor may compile the rest in, the first the one winners are timed
        against (``inductor_mode``): with ``autotune`` and ``profile`` on, where that is not
        ``torch.compile``'s own ``mode``, that mode too; Inductor's code for the whole graph
        is then compiled and timed in both, and the faster kept (``fx.whole``): max-autotune's
        GEMM templates, chosen one kernel at a time, can make a graph slower (an 8-layer Llama
        decode step at b = 8 on an H200: ``generate()`` 1.13x faster in the default mode)."""
        first = self.inductor_mode(mode)
        return (first, mode) if first != mode and self.profiling() else (first,)

    def profiling(self) -> bool:
        """Whether winners are profiled (timed on the GPU): the ``profile`` option, by default
        where CUDA is."""
        return bool(torch.cuda.is_available()) if self.profile is None else bool(self.profile)


__all__ = ["AUTOTUNE_MODES", "DEFAULT_BUDGET", "TIMINGS", "BackendError", "BackendOptions",
           "DynamicShapesError"]
