"""The e-graph reachability oracle and the rule-file loader."""

from ..extract.snapshot import Snapshot
from .oracle import Budget, IncompleteSaturationWarning, Oracle, OracleStats, Reachability
from .rules import DEFAULT_RULES_DIR, load_rules, split_forms

__all__ = [
           "DEFAULT_RULES_DIR",
           "Budget",
           "IncompleteSaturationWarning",
           "Oracle",
           "OracleStats",
           "Reachability",
           "Snapshot",
           "load_rules",
           "split_forms",
]
