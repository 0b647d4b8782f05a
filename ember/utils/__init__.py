"""ember.utils: torch.utils's counterparts (data loading in ember.utils.data)."""

from ember.utils import data

__all__ = ["data"]
