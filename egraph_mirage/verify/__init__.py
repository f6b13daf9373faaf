"""Verification: random finite-field tests (JAX) and a float check."""

from .field import VerifyError
from .verify import NumericCheck, Verifier, VerifyResult, check_numerics, checks_that_fit, verify

__all__ = [
    "NumericCheck", "Verifier", "VerifyError", "VerifyResult", "check_numerics", "checks_that_fit",
    "verify",
]
