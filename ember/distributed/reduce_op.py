"""ReduceOp: how a reducing collective combines the ranks' values (torch.distributed.ReduceOp's names)."""

from __future__ import annotations

import enum


class ReduceOp(enum.Enum):
    """The reductions of all_reduce and reduce_scatter. AVG is SUM divided by the world size (floating point only);
    MAX and MIN propagate NaN as torch.maximum and torch.minimum do; BAND, BOR and BXOR take integers and bools."""

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    def __repr__(self) -> str:
        return f"<ReduceOp.{self.name}>"
