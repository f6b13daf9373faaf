"""The pipeline layer: one ``Request`` run as named stages (``stages.STAGES``) for the library
(``em.superoptimize``), the command line (``egraph-mirage optimize``), the ``bench`` commands and
the torch backend alike. It sits above every stage and drives them; no stage imports it."""

from .request import DEFAULT_BUDGETS, Request, RequestError
from .stages import STAGES, run, superoptimize

__all__ = ["DEFAULT_BUDGETS", "STAGES", "Request", "RequestError", "run", "superoptimize"]
