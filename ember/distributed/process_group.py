"""The default process group: MPI's world (through mpi4py) joined by init_process_group, its rank and size, and the
abort of every rank when one of them raises (so that none waits forever in a collective)."""

from __future__ import annotations

import datetime
import importlib.util
import sys
import time
import traceback
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ember.core.errors import EmberError

BACKENDS = ("mpi",)
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)  # torch's default for its CPU backends
INSTALL_HINT = 'pip install "ember[distributed]" (or: pip install mpi4py mpich)'
# seconds between printing a failing rank's traceback and MPI_Abort: mpiexec forwards what a rank printed through its
# proxies, and an abort that comes first can lose it
OUTPUT_GRACE = 1.0


class DistributedError(EmberError, RuntimeError):
    """A collective or process-group call that cannot go on: no process group, MPI missing, tensors that do not
    match, another rank that failed or did not answer within the timeout."""


@dataclass
class ProcessGroup:
    """The joined world: MPI's communicator (a duplicate of COMM_WORLD, so ember's messages never meet the user's),
    this process's rank, the number of ranks and how long a collective waits for the others."""

    communicator: Any
    rank: int
    size: int
    timeout: float  # seconds
    backend: str = "mpi"


GROUP: ProcessGroup | None = None
_PREVIOUS_EXCEPTHOOK: Any = None


def is_available() -> bool:
    """Whether ember.distributed can run here: mpi4py (with an MPI library) is installed."""
    return importlib.util.find_spec("mpi4py") is not None


def mpi() -> Any:
    """mpi4py's MPI module (importing it initializes MPI), or a DistributedError naming the install command."""
    try:
        from mpi4py import MPI
    except ImportError as error:
        raise DistributedError(f"ember.distributed needs MPI through mpi4py, which is not installed ({error}); "
                               f"install it with: {INSTALL_HINT}") from error
    return MPI


def init_process_group(backend: str | None = "mpi", init_method: str | None = None,
                       timeout: datetime.timedelta | None = None, world_size: int = -1, rank: int = -1,
                       store: Any = None, group_name: str = "", pg_options: Any = None, device_id: Any = None) -> None:
    """Join the default process group, as torch.distributed.init_process_group: with backend "mpi" (the only one,
    and the default), the rank and world size are MPI's (start the ranks with `mpiexec -n N python script.py`).

    world_size and rank, when given, must be MPI's; init_method and store have no meaning for MPI. timeout bounds
    how long a collective waits for the other ranks (default 30 minutes). From here on an exception that reaches
    the top of any rank prints its traceback with the rank and aborts every rank (MPI_Abort), so the others never
    wait forever for it; destroy_process_group() leaves the group."""
    global GROUP, _PREVIOUS_EXCEPTHOOK
    if GROUP is not None:
        raise DistributedError("trying to initialize the default process group twice! (ember.distributed."
                               "init_process_group was called before; call destroy_process_group() first)")
    backend = "mpi" if backend is None else str(backend).lower()
    if backend not in BACKENDS:
        raise DistributedError(f"init_process_group: backend {backend!r} is not available in ember; the valid "
                               f"backend is 'mpi' (ember runs collectives over MPI through mpi4py: {INSTALL_HINT})")
    if init_method is not None or store is not None:
        raise DistributedError("init_process_group: the 'mpi' backend takes the ranks from MPI; leave init_method and "
                               "store out and start the processes with mpiexec (or mpirun)")
    seconds = (timeout if timeout is not None else DEFAULT_TIMEOUT).total_seconds()
    if seconds <= 0:
        raise DistributedError(f"init_process_group: timeout must be positive, got {timeout}")
    MPI = mpi()
    communicator = MPI.COMM_WORLD.Dup()
    group = ProcessGroup(communicator, communicator.Get_rank(), communicator.Get_size(), seconds, backend)
    for name, given, actual in (("world_size", world_size, group.size), ("rank", rank, group.rank)):
        if given not in (-1, None) and given != actual:
            communicator.Free()
            raise DistributedError(f"init_process_group: {name}={given}, but MPI says {actual}; with the 'mpi' "
                                   f"backend leave {name} out (or give MPI's value)")
    GROUP = group
    _PREVIOUS_EXCEPTHOOK = sys.excepthook
    sys.excepthook = _abort_every_rank


def is_initialized() -> bool:
    """Whether init_process_group has been called (and destroy_process_group not since)."""
    return GROUP is not None


def default_group(function: str) -> ProcessGroup:
    """The joined process group, or torch's error for a call made before init_process_group."""
    if GROUP is None:
        raise DistributedError(f"{function}: Default process group has not been initialized, please make sure to "
                               "call init_process_group (ember.distributed.init_process_group('mpi'), with the "
                               "processes started by mpiexec)")
    return GROUP


def check_group(group: Any, function: str) -> ProcessGroup:
    """The default group for `group` None (or the group itself); ember has no sub-groups."""
    joined = default_group(function)
    if group is not None and group is not joined and group != "WORLD":
        raise DistributedError(f"{function}: ember has only the default process group (every rank); pass group=None")
    return joined


def get_rank(group: Any = None) -> int:
    """This process's rank in the default group: 0 .. world size - 1."""
    return check_group(group, "get_rank").rank


def get_world_size(group: Any = None) -> int:
    """The number of ranks in the default group."""
    return check_group(group, "get_world_size").size


def get_backend(group: Any = None) -> str:
    """The default group's backend: 'mpi'."""
    return check_group(group, "get_backend").backend


def destroy_process_group(group: Any = None) -> None:
    """Leave the default group (after a barrier, so that no rank still sends to this one); an uncaught exception no
    longer aborts the other ranks. MPI itself stays initialized until the process exits (mpi4py finalizes it)."""
    global GROUP
    from ember.distributed.communication import barrier

    joined = check_group(group, "destroy_process_group")
    barrier(joined)  # (bounded by the group's timeout)
    joined.communicator.Free()
    GROUP = None
    if sys.excepthook is _abort_every_rank:
        sys.excepthook = _PREVIOUS_EXCEPTHOOK


def _abort_every_rank(kind: type[BaseException], value: BaseException, trace: TracebackType | None) -> None:
    """sys.excepthook while the group is joined: print the traceback naming this rank, then MPI_Abort the world."""
    joined = GROUP
    if joined is None:
        (_PREVIOUS_EXCEPTHOOK or sys.__excepthook__)(kind, value, trace)
        return
    lines = "".join(traceback.format_exception(kind, value, trace))
    sys.stderr.write(f"ember.distributed: rank {joined.rank} of {joined.size} raised an exception; aborting all "
                     f"{joined.size} ranks (MPI_Abort)\n{lines}")
    sys.stderr.flush()
    sys.stdout.flush()
    time.sleep(OUTPUT_GRACE)
    mpi().COMM_WORLD.Abort(1)
