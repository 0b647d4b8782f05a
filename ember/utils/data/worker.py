"""Worker processes of a DataLoader: the loop each worker runs, what it knows of itself (get_worker_info), and the
main process's iterator that hands out index batches and puts the results back in order.

Workers start with the spawn method, fetch and collate into numpy arrays (HostArray), and send them over a queue;
the main process makes them ember tensors. An exception in a worker comes back with the worker's traceback and is
raised again in the main process; a worker that dies, or a wait past `timeout`, raises instead of hanging.
"""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import random
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

from ember.utils.data.collate import from_host

POLL_SECONDS = 0.5  # how often a waiting process checks that the other side is still alive
JOIN_SECONDS = 5.0


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker process knows of itself: its id, the number of workers, its seed and its copy of the dataset."""

    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """This worker's WorkerInfo inside a DataLoader worker process; None in the main process."""
    return _worker_info


class ExceptionWrapper:
    """An exception raised in a worker, sent to the main process with the worker's traceback."""

    def __init__(self, where: str) -> None:
        kind, _, _ = sys.exc_info()
        self.exception_type = kind
        self.where = where
        self.message = "".join(traceback.format_exception(*sys.exc_info()))

    def reraise(self) -> None:
        """Raise the exception again (its type where it can carry a message, else RuntimeError), with the traceback."""
        name = getattr(self.exception_type, "__name__", "Exception")
        message = f"Caught {name} {self.where}.\nOriginal {self.message}"
        if self.exception_type is KeyError:
            message = KeyErrorMessage(message)
        try:
            exception = self.exception_type(message)  # type: ignore[misc]
        except Exception:
            raise RuntimeError(message) from None
        raise exception


class KeyErrorMessage(str):
    """A KeyError's message shown as is (KeyError would show its repr, escaping the traceback's newlines)."""

    def __repr__(self) -> str:
        return str(self)


@dataclass(frozen=True)
class IterableEnd:
    """A worker's iterable dataset is exhausted."""

    worker_id: int


def worker_loop(dataset: Any, iterable: bool, index_queue: Any, result_queue: Any, auto_collation: bool,
                collate_fn: Any, batch_size: int | None, drop_last: bool, seed: int, init_fn: Any, worker_id: int,
                num_workers: int) -> None:
    """A worker's life: seed, run worker_init_fn, then fetch each (send_index, indices) task until told to stop (a
    None task) or the main process is gone."""
    global _worker_info
    import ember
    from ember.utils.data.fetch import IterableFetcher, MapFetcher

    random.seed(seed)
    ember.manual_seed(seed)
    _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
    failure: ExceptionWrapper | None = None
    fetcher: Any = None
    try:
        if init_fn is not None:
            init_fn(worker_id)
        if iterable:
            fetcher = IterableFetcher(dataset, auto_collation, collate_fn, True, batch_size, drop_last)
        else:
            fetcher = MapFetcher(dataset, auto_collation, collate_fn, True)
    except Exception:
        failure = ExceptionWrapper(f"in DataLoader worker process {worker_id}")
    parent = multiprocessing.parent_process()
    ended = False
    while True:
        try:
            task = index_queue.get(timeout=POLL_SECONDS)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return
            continue
        if task is None:
            return
        send_index, indices = task
        data: Any
        if failure is not None:
            data, failure = failure, None
        elif ended:
            data = IterableEnd(worker_id)
        else:
            try:
                data = fetcher.fetch(indices)
            except StopIteration:
                ended = True
                data = IterableEnd(worker_id)
            except Exception:
                data = ExceptionWrapper(f"in DataLoader worker process {worker_id}")
        result_queue.put((send_index, data))
        del data


def _context(multiprocessing_context: Any) -> Any:
    if multiprocessing_context is None:
        return multiprocessing.get_context("spawn")
    if isinstance(multiprocessing_context, str):
        return multiprocessing.get_context(multiprocessing_context)
    return multiprocessing_context


class MultiProcessIterator:
    """One epoch of a DataLoader with num_workers worker processes: prefetch_factor tasks per worker in flight,
    results yielded in the sampler's order."""

    def __init__(self, loader: Any, sampler_iterator: Any, base_seed: int) -> None:
        self.shut_down = False
        self.index_queues: list[Any] = []
        self.workers: list[Any] = []
        context = _context(loader.multiprocessing_context)
        self.sampler_iterator = sampler_iterator
        self.timeout = loader.timeout
        self.result_queue = context.Queue()
        self.active = [True] * loader.num_workers
        self.next_worker = itertools.cycle(range(loader.num_workers))
        self.tasks: dict[int, tuple[Any, ...]] = {}  # send index -> (worker,) or (worker, data) once arrived
        self.send_index = self.receive_index = 0
        for worker_id in range(loader.num_workers):
            index_queue = context.Queue()
            index_queue.cancel_join_thread()
            worker = context.Process(target=worker_loop, daemon=True, args=(
                loader.dataset, loader._iterable, index_queue, self.result_queue, loader._auto_collation,
                loader.collate_fn, loader.batch_size, loader.drop_last, base_seed + worker_id, loader.worker_init_fn,
                worker_id, loader.num_workers))
            try:
                worker.start()
            except Exception as error:
                self.shutdown()
                raise type(error)(f"DataLoader: num_workers={loader.num_workers} sends the dataset, collate_fn and "
                                  f"worker_init_fn to worker processes by pickling, which failed: {error} (hold numpy "
                                  f"arrays rather than ember tensors in the dataset, or use num_workers=0)") from error
            self.index_queues.append(index_queue)
            self.workers.append(worker)
        for _ in range(loader.prefetch_factor * loader.num_workers):
            self._put_task()

    def _put_task(self) -> None:
        try:
            indices = next(self.sampler_iterator)
        except StopIteration:
            return
        for _ in range(len(self.workers)):
            worker = next(self.next_worker)
            if self.active[worker]:
                break
        else:
            return
        self.index_queues[worker].put((self.send_index, indices))
        self.tasks[self.send_index] = (worker,)
        self.send_index += 1

    def __iter__(self) -> MultiProcessIterator:
        return self

    def __next__(self) -> Any:
        while True:
            while self.receive_index < self.send_index:  # skip the tasks of workers whose iterable ended
                task = self.tasks[self.receive_index]
                if len(task) == 2 or self.active[task[0]]:
                    break
                del self.tasks[self.receive_index]
                self.receive_index += 1
            else:
                self.shutdown()
                raise StopIteration
            if len(self.tasks[self.receive_index]) == 2:
                return self._process(self.tasks.pop(self.receive_index)[1])
            index, data = self._receive()
            if isinstance(data, IterableEnd):
                self.active[data.worker_id] = False
                self._put_task()
                continue
            if index != self.receive_index:
                self.tasks[index] += (data,)
                continue
            del self.tasks[index]
            return self._process(data)

    def _process(self, data: Any) -> Any:
        self.receive_index += 1
        self._put_task()
        if isinstance(data, ExceptionWrapper):
            self.shutdown()
            data.reraise()
        return from_host(data)

    def _receive(self) -> tuple[int, Any]:
        """The next result from any worker; raises if a worker died or nothing came within timeout."""
        deadline = time.monotonic() + self.timeout if self.timeout > 0 else None
        while True:
            wait = POLL_SECONDS if deadline is None else max(0.0, min(POLL_SECONDS, deadline - time.monotonic()))
            try:
                return self.result_queue.get(timeout=wait)
            except queue.Empty:
                pass
            dead = [worker for worker in self.workers if worker.exitcode is not None]
            if dead:
                self.shutdown()
                described = ", ".join(f"pid {worker.pid} (exit code {worker.exitcode})" for worker in dead)
                raise RuntimeError(f"DataLoader worker {described} exited unexpectedly; a signal (negative exit code) "
                                   f"is often running out of memory")
            if deadline is not None and time.monotonic() >= deadline:
                self.shutdown()
                raise RuntimeError(f"DataLoader timed out after {self.timeout} seconds waiting for a batch from its "
                                   f"workers")

    def shutdown(self) -> None:
        """Tell the workers to stop, wait for them a little, and terminate any that do not."""
        if self.shut_down:
            return
        self.shut_down = True
        for index_queue, worker in zip(self.index_queues, self.workers):
            if worker.is_alive():
                index_queue.put(None)
        for worker in self.workers:
            worker.join(JOIN_SECONDS)
            if worker.is_alive():
                worker.terminate()
                worker.join(JOIN_SECONDS)
        for index_queue in self.index_queues:
            index_queue.close()
        self.result_queue.cancel_join_thread()
        self.result_queue.close()

    def __del__(self) -> None:
        if hasattr(self, "result_queue"):
            self.shutdown()
