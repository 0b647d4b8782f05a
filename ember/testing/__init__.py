"""Testing tools: the numpy reference tensor (reference.py), the fuzzer (fuzz.py, gradient_fuzz.py), and checks of a
model against another framework's saved inputs and outputs (check.py, record.py, pairs.py)."""

from ember.testing.check import CheckReport, Comparison, check_against
from ember.testing.pairs import CheckError
from ember.testing.record import record_reference

__all__ = ["CheckError", "CheckReport", "Comparison", "check_against", "record_reference"]
