"""The e-graph reachability oracle and the rule-file loader."""

from .oracle import Budget, IncompleteSaturationWarning, Oracle, OracleStats, Reachability
from .rules import DEFAULT_RULES_DIR, load_rules, rule_files, rules_digest, split_forms

__all__ = [
           "DEFAULT_RULES_DIR",
           "Budget",
           "IncompleteSaturationWarning",
           "Oracle",
           "OracleStats",
           "Reachability",
           "load_rules",
           "rule_files",
           "rules_digest",
           "split_forms",
]
