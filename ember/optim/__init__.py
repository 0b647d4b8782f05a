"""ember.optim: optimizers (SGD, Adam, AdamW, RMSprop) with fused, recompile-free steps, and lr schedulers."""

from ember.optim import lr_scheduler
from ember.optim.adam import Adam, AdamW
from ember.optim.optimizer import Optimizer
from ember.optim.rmsprop import RMSprop
from ember.optim.sgd import SGD

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "RMSprop", "lr_scheduler"]
