"""clip_grad_norm_ replayed: its kernels recorded once per signature (ember.jit) and launched again at later steps.

An eager training step that clips its gradients builds the clip's graph at every step (one template's copy: the
gradients' sums of squares, the total norm, each gradient scaled in place) and realizes it before the optimizer's
step: one schedule of two kernels per gradient, each launched through the executor and, for an in-place write, its
analysis (gpt_manual's 28 gradients: ~1.2 ms a step, 0.2 of it kernels). What the clip computes depends only on
max_norm and the gradients' shapes, dtypes, devices and aliasing, so it is a function of the gradients that
`ember.jit` records per signature and replays while the signature holds: the same kernels on the gradients'
buffers, scaled in place, no graph or schedule.

The eager clip stays the reference and is used wherever a replay could differ from it (as for the optimizer's step
replays, optim/step_replay.py): a context that is not plain (a capture, a profile, a budget, a trace, debug output),
a gradient that is not a plain tensor or has live views, and a signature whose capture was refused (JitError,
raised after the recorded call ran eagerly in full). A gradient whose value something else still holds gives that
holder a copy first (step_replay.ready_to_write), as the eager assign would leave it the old value. The norm a
replay returns (and the recorded call's) is copied out of the capture's buffer, which the next replay overwrites.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ember.capture.jit import JitError, Jitted
from ember.context import CONTEXT
from ember.core.tensor import Tensor, realize
from ember.optim.step_replay import ready_to_write, recorded_replay
from ember.scheduler.buffers import buffer_of
from ember.scheduler.copies import copied_leaf


class ClipReplays:
    """The recorded clips by signature (None for one that is not replayed), and the norm of the call being
    recorded (a JitError is raised after it ran: its norm is kept here)."""

    def __init__(self) -> None:
        self.recorded: OrderedDict[tuple[Any, ...], Jitted | None] = OrderedDict()
        self.replayed = 0  # clips done by a replay (tests read it)
        self.norm: Tensor | None = None

    def run(self, grads: list[Tensor], max_norm: float, clip: Any) -> Tensor | None:
        """Clip `grads` in place by `clip(grads)` (the eager clip, which returns the total norm) through a replay
        of its signature; the total norm, or None where the caller must run the eager clip (nothing was done)."""
        context = CONTEXT.get()
        if not context.plain or context.trace is not None:
            return None
        if any(grad.__class__ is not Tensor for grad in grads):
            return None  # (a sharded or foreign gradient: the eager clip knows what to do with it)
        if not ready_to_write(grads, grads):
            return None  # (a gradient with live views is written through its storage: the eager clip does that)
        signature = _signature(grads, max_norm)
        jitted = recorded_replay(self.recorded, signature, lambda: self._record_function(clip))
        if jitted is None:
            return None
        replays = jitted.replays
        try:
            norm = jitted(*grads)
        except JitError:  # raised after the recorded call ran (eagerly, in full): keep its result, never replay it
            self.recorded[signature] = None
            norm = self.norm
        finally:
            self.norm = None
        assert norm is not None
        if jitted.replays > replays:
            self.replayed += 1
            for grad in grads:  # (written in place by the replay: each gradient's version advances as mul_'s does)
                grad._version += 1
        # (out of the capture's buffer, which the next replay overwrites: a replay's norm, and the recorded call's,
        # whose buffers the capture took)
        if not norm.node.realized:
            realize(norm)
        return Tensor._from_node(copied_leaf(norm.node))

    def clear(self) -> None:
        """Let every recorded clip go (their captures hold buffers of the pools)."""
        self.recorded.clear()

    def _record_function(self, clip: Any) -> Any:
        """The function ember.jit records: the eager clip of its arguments, returning the total norm."""

        def clip_gradients(*grads: Tensor) -> Tensor:
            self.norm = clip(list(grads))
            return self.norm

        return clip_gradients


def _signature(grads: list[Tensor], max_norm: float) -> tuple[Any, ...]:
    """Everything outside the gradients' values that decides what a clip computes: max_norm (by its bits) and each
    gradient's shape, dtype and device, and which gradients share a buffer."""
    first_of: dict[int, int] = {}
    layout = []
    for position, grad in enumerate(grads):
        node = grad.node
        layout.append((node.shape, node.dtype, node.device, first_of.setdefault(id(buffer_of(node)), position)))
    return (max_norm.hex(), tuple(layout))


REPLAYS = ClipReplays()
