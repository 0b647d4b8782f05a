"""ember.autograd: one backward rule per primitive op and per recorded composition (rules.py), the engine
(engine.py) and grad modes."""

from ember.autograd.engine import backward, grad
from ember.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled

__all__ = ["backward", "enable_grad", "grad", "is_grad_enabled", "no_grad", "set_grad_enabled"]
