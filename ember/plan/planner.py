"""The offline planner: a trace (plan/trace.py) becomes a plan folder (`python -m ember plan trace.json`), and
`ember.load_plan` (or EMBER_PLAN) loads one so the traced graphs run with no kernelize and no compile.

A plan folder holds `plan.json` (the schedules by graph signature, what each stores, the kernels per device, the
jit captures' arena layouts, the kernel times) and `cache/`, an ember disk cache (ember/cache.py) in which every
kernel of the trace was lowered and compiled for its device; loading copies those entries into the disk cache and
loads every program from them."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ember.core.errors import EmberError
from ember.plan.kernel_codec import CodecError, decode

PLAN_FORMAT = "ember-plan"
PLAN_VERSION = 1
PLAN_FILE = "plan.json"
IDENTITY_EXTRAS = ("device", "platform", "version", "driver", "adapter")  # DeviceInfo.extra keys naming a device


class PlanError(EmberError):
    """A trace or plan that is missing, corrupt, or made by another ember."""


class PlanWarning(UserWarning):
    """Entries of a plan skipped at load (their device is not here or not the same)."""


@functools.cache
def source_digest() -> str:
    """A digest of ember's own source files: schedules and kernels are only valid for the code that made them."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def environment() -> dict[str, str]:
    """What a trace or plan records of the ember that made it (checked when a plan is made and loaded)."""
    import ember

    return {"ember": ember.__version__, "source_digest": source_digest()}


def device_fingerprint(device: Any) -> str:
    """A digest of a device's capabilities (what lowering reads): a plan's kernels were lowered for exactly these."""
    fields = {name: _canonical(value) for name, value in dataclasses.asdict(device.info).items() if name != "extra"}
    # of the free-form extras, only what names the device and its driver (others, like how the OpenCL vector probe
    # was answered, differ between runs of the same device)
    fields["identity"] = {key: str(device.info.extra[key]) for key in IDENTITY_EXTRAS if key in device.info.extra}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _canonical(value: Any) -> Any:
    """`value` with every set, also one inside a tuple (OpenCL's fallback vector widths), a sorted list: a set's
    order follows the hashes of its members, which differ between processes (enum members hash their names)."""
    if isinstance(value, (set, frozenset)):
        return sorted(map(str, value))
    if isinstance(value, (tuple, list)):
        return [_canonical(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _canonical(item) for key, item in value.items()}
    return value


def _read_json(path: Path, kind: str, expected_format: str, version: int) -> dict[str, Any]:
    """The JSON document at `path`, checked to be an ember `kind` of `version` made by this ember."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise PlanError(f"{path}: no such {kind} file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise PlanError(f"{path}: cannot read the {kind} ({error})") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise PlanError(f"{path} is not a valid {kind}: corrupt JSON ({error})") from None
    if not isinstance(document, dict) or document.get("format") != expected_format:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise PlanError(f"{path} is not an ember {kind} (its format is {found!r}, expected {expected_format!r})")
    if document.get("version") != version:
        raise PlanError(f"{path}: {kind} format version {document.get('version')!r} is not supported (this ember "
                        f"reads version {version})")
    here = environment()
    if document.get("source_digest") != here["source_digest"]:
        raise PlanError(f"{path}: the {kind} was made by another ember (version {document.get('ember')!r}, source "
                        f"digest {str(document.get('source_digest'))[:12]}; this is {here['ember']}, "
                        f"{here['source_digest'][:12]}); record the trace and make the plan again with this ember")
    return document


def _schedule_items(entry: Any, where: str) -> list[Any]:
    """A trace's or plan's schedule items decoded to program.Launch / Copy."""
    from ember.ir.kernel import Kernel
    from ember.scheduler.program import Copy, Launch

    try:
        items: list[Any] = []
        for item in entry["items"]:
            if "copy" in item:
                output, source = item["copy"]
                items.append(Copy(int(output), int(source)))
            else:
                output, inputs, kernel = item["kernel"]
                decoded = decode(kernel)
                if not isinstance(decoded, Kernel):
                    raise CodecError(f"not a kernel: {kernel!r:.60}")
                items.append(Launch(int(output), tuple(int(i) for i in inputs), decoded))
        return items
    except (CodecError, KeyError, TypeError, ValueError) as error:
        raise PlanError(f"{where}: a corrupt schedule ({type(error).__name__}: {error})") from None


def _extra_slots(entry: Any) -> tuple[tuple[tuple[int, ...], Any, str, tuple[int, int] | None], ...]:
    """A plan schedule's slots past its graph's nodes (nodes of templates' graphs its program stores: schedule.py),
    as schedule.ExtraSlot in slot order, from the stored values it keeps; () where there are none."""
    from ember.core.dtype import DTYPES_BY_NAME

    count = entry.get("nodes")
    if count is None:
        return ()
    extra = sorted((int(kept["position"]), tuple(int(size) for size in kept["shape"]), DTYPES_BY_NAME[kept["dtype"]],
                    str(kept["device"]), None if kept.get("link") is None else
                    (int(kept["link"][0]), int(kept["link"][1])))
                   for kept in entry.get("keep", []) if int(kept["position"]) >= int(count))
    if [position for position, *_ in extra] != list(range(int(count), int(count) + len(extra))):
        return ()  # (a slot past the graph's that no kernel writes, a copy's: its program is kernelized again)
    return tuple((shape, dtype, device, link) for _, shape, dtype, device, link in extra)


# ---- making a plan -----------------------------------------------------------------------------------------------


@contextmanager
def _cache_folder(folder: Path) -> Iterator[None]:
    """Point ember's disk cache (EMBER_CACHE_DIR) at `folder` inside the block."""
    before = os.environ.get("EMBER_CACHE_DIR")
    os.environ["EMBER_CACHE_DIR"] = str(folder)
    try:
        yield
    finally:
        if before is None:
            del os.environ["EMBER_CACHE_DIR"]
        else:
            os.environ["EMBER_CACHE_DIR"] = before


def default_plan_path(trace_path: Path) -> Path:
    return trace_path.with_name(trace_path.stem + ".plan")


def make_plan(trace_path: str | os.PathLike[str], output: str | os.PathLike[str] | None = None) -> Path:
    """Write the plan folder of a trace (default: next to it, `<name>.plan`): compile every kernel of the trace for
    its device into the plan's own disk cache. Run it in a process that has compiled nothing yet (`python -m ember
    plan`): a program this process holds already would not be written to the plan's cache."""
    from ember.cache import root as cache_root
    from ember.scheduler import compile_cache
    from ember.scheduler.devices import get_device
    from ember.scheduler.program import Launch

    trace_path = Path(trace_path)
    document = _read_json(trace_path, "trace", "ember-trace", 1)
    folder = Path(output) if output is not None else default_plan_path(trace_path)
    schedules: dict[str, Any] = {}
    kernels: dict[str, dict[Any, None]] = {}
    try:
        entries = list(document["schedules"])
        for number, entry in enumerate(entries):
            where = f"{trace_path}: schedule {number}"
            items = _schedule_items(entry, where)
            for item, encoded in zip(items, entry["items"]):
                if isinstance(item, Launch):
                    kernels.setdefault(str(encoded["device"]), {})[item.kernel] = None
            schedules[str(entry["signature"])] = {"items": entry["items"], "keep": entry.get("keep", []),
                                                  "runs": entry.get("runs", 0), "nodes": entry.get("nodes")}
        arenas = list(document.get("jit_arenas", []))
    except (KeyError, TypeError) as error:
        raise PlanError(f"{trace_path}: a corrupt trace (missing or malformed field {error})") from None
    replacing = folder.exists()
    if replacing and (not (folder / PLAN_FILE).is_file()
                      or any(path.name not in (PLAN_FILE, "cache") for path in folder.iterdir())):
        raise PlanError(f"{folder} exists and is not a plan folder; name a new folder with -o")  # never replaced
    if len(compile_cache.COMPILED):
        raise PlanError(f"cannot plan {trace_path} in this process: it holds compiled kernels already (loaded with "
                        "EMBER_PLAN?), which would be left out of the plan; run `python -m ember plan` without "
                        "EMBER_PLAN")
    if replacing:  # an earlier plan
        (folder / PLAN_FILE).unlink()
        shutil.rmtree(folder / "cache", ignore_errors=True)
    (folder / "cache").mkdir(parents=True)
    devices = {}
    user_cache = Path(cache_root())
    with _cache_folder(folder / "cache"):
        for device_name, device_kernels in kernels.items():
            try:
                device = get_device(device_name)
            except EmberError as error:
                raise PlanError(f"{trace_path}: the trace ran kernels on {device_name}, which is not available "
                                f"here ({error}); make the plan where the traced run ran") from None
            devices[device_name] = {"fingerprint": device_fingerprint(device), "kernels": len(device_kernels)}
            if device.info.can_run:
                _carry_search_winners(device, list(device_kernels), user_cache)
                compile_cache.compile_kernels(device, list(device_kernels))
                device.prepare_replays()  # (what replays need to join their launches: c's runner)
    plan = {"format": PLAN_FORMAT, "version": PLAN_VERSION, **environment(), "trace": str(trace_path),
            "devices": devices, "schedules": schedules, "jit_arenas": arenas,
            "kernel_times": document.get("kernel_times", {}), "regions": document.get("regions", [])}
    (folder / PLAN_FILE).write_text(json.dumps(plan))
    return folder


# ---- loading a plan ----------------------------------------------------------------------------------------------


PLANNED_ARENAS: dict[str, tuple[list[int], int]] = {}  # arena key (trace.arena_key) -> offsets, arena bytes


class PlanUse:
    """How often jit captures took their arena layout from a loaded plan instead of planning it."""

    arenas: int = 0


def planned_arena(device: str, alignment: int, lifetimes: list[tuple[int, int, int]]) -> tuple[list[int], int] | None:
    """A loaded plan's arena layout (offsets, arena bytes) for these lifetimes on `device`, or None."""
    if not PLANNED_ARENAS:
        return None
    from ember.plan.trace import arena_key

    layout = PLANNED_ARENAS.get(arena_key(device, alignment, lifetimes))
    if layout is not None:
        PlanUse.arenas += 1
    return layout


def _carry_search_winners(device: Any, kernels: list[Any], user_cache: Path) -> None:
    """Copy the kernel search winners (ir/search_cache.py) of these kernels from the user's disk cache into the plan's
    (the current cache folder): the plan's kernels are then compiled as the winners, and loading the plan copies the
    winners into the disk cache where it is loaded."""
    from ember.ir.search_cache import device_fingerprint as search_fingerprint
    from ember.ir.search_cache import entry_path
    from ember.scheduler.compile_cache import kernel_name

    fingerprint = search_fingerprint(device)
    for kernel in kernels:
        target = entry_path(kernel, kernel_name(kernel), fingerprint)
        source = user_cache / "search" / target.name
        if source.is_file() and not target.exists():
            try:
                shutil.copyfile(source, target)
            except OSError:  # (a plan without the winner: its kernel is the default one)
                continue


def _copy_cache(source: Path) -> int:
    """Copy the plan's disk cache entries that the disk cache lacks into it (each is checked when read, like any
    entry); the number copied."""
    from ember.cache import cache_directory

    copied = 0
    for kind in sorted(path for path in source.iterdir() if path.is_dir()):
        target = cache_directory(kind.name)
        for entry in kind.glob("*.entry"):
            if not (target / entry.name).exists():
                temporary = target / f"{entry.name}.{os.getpid()}.plan.tmp"
                try:
                    shutil.copyfile(entry, temporary)
                    os.replace(temporary, target / entry.name)
                    copied += 1
                except OSError:  # a cache that cannot be written: those kernels are compiled at load instead
                    temporary.unlink(missing_ok=True)
    return copied


@dataclasses.dataclass
class LoadedPlan:
    """What `load_plan` did: schedules entered, programs loaded per device, arena layouts, skipped devices."""

    path: Path
    schedules: int
    programs: dict[str, int]
    arenas: int
    skipped_devices: list[str]
    cache_entries_copied: int


def load_plan(path: str | os.PathLike[str]) -> LoadedPlan:
    """Load a plan folder (or its plan.json) from `python -m ember plan`: its schedules go into the schedule cache
    (a traced graph is not kernelized again), its compiled kernels into the disk cache and the compile cache (none
    is compiled again), its jit arena layouts replace planning them. A plan made by another ember raises PlanError;
    the entries of a device that is not here, or not the same device, are skipped with a PlanWarning."""
    from ember.core.errors import DeviceError
    from ember.scheduler import compile_cache
    from ember.scheduler.devices import get_device
    from ember.scheduler.program import Launch
    from ember.scheduler.schedule import SCHEDULES

    path = Path(path)
    folder = path if path.is_dir() else path.parent
    document = _read_json(folder / PLAN_FILE, "plan", PLAN_FORMAT, PLAN_VERSION)
    skipped: list[str] = []
    usable: dict[str, Any] = {}
    try:
        for device_name, recorded in document["devices"].items():
            try:
                device = get_device(device_name)
            except (DeviceError, EmberError) as error:
                skipped.append(device_name)
                warnings.warn(f"ember: plan {folder}: device {device_name} is not available here ({error}); its "
                              "kernels are compiled when they run", PlanWarning, stacklevel=2)
                continue
            if device_fingerprint(device) != recorded["fingerprint"]:
                skipped.append(device_name)
                warnings.warn(f"ember: plan {folder}: device {device_name} has other capabilities than the one the "
                              "plan was made for; its kernels are compiled when they run", PlanWarning, stacklevel=2)
                continue
            usable[device_name] = device
        schedules = {str(signature): _schedule_items(entry, f"{folder / PLAN_FILE}: schedule {signature[:12]}")
                     for signature, entry in document["schedules"].items()}
        extra_slots = {str(signature): _extra_slots(entry) for signature, entry in document["schedules"].items()}
        devices_of = {str(signature): {item["device"] for item in entry["items"] if "kernel" in item}
                      for signature, entry in document["schedules"].items()}
        arenas = {arena_key_of(arena): _checked_layout(arena, folder / PLAN_FILE)
                  for arena in document.get("jit_arenas", []) if arena["device"] in usable}
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise PlanError(f"{folder / PLAN_FILE}: a corrupt plan (missing or malformed field {error})") from None
    copied = _copy_cache(folder / "cache") if (folder / "cache").is_dir() else 0
    wanted: dict[str, dict[Any, None]] = {}
    for signature, items in schedules.items():
        if not devices_of[signature] <= set(usable):
            continue
        for item, encoded in zip(items, document["schedules"][signature]["items"]):
            if isinstance(item, Launch):
                wanted.setdefault(encoded["device"], {})[item.kernel] = None
    programs = {}
    for device_name, device_kernels in wanted.items():
        device = usable[device_name]
        missing = [kernel for kernel in device_kernels if (device_name, kernel) not in compile_cache.COMPILED]
        if missing and device.info.can_run:
            compile_cache.compile_kernels(device, missing)
        programs[device_name] = len(device_kernels)
    SCHEDULES.planned.update({signature: items for signature, items in schedules.items()
                              if devices_of[signature] <= set(usable)})
    SCHEDULES.planned_extra_slots.update({signature: extra for signature, extra in extra_slots.items() if extra})
    PLANNED_ARENAS.update(arenas)
    return LoadedPlan(folder, len(schedules), programs, len(arenas), skipped, copied)


def _checked_layout(arena: dict[str, Any], where: Path) -> tuple[list[int], int]:
    """An arena layout's offsets and size, after checking it is one (aligned, inside the arena, no two buffers
    that are live at once overlapping): a wrong layout would make kernels overwrite each other's values."""
    from ember.capture.memory_plan import padded

    alignment, arena_bytes = int(arena["alignment"]), int(arena["arena_bytes"])
    lifetimes = [(int(size), int(first), int(last)) for size, first, last in arena["lifetimes"]]
    offsets = [int(offset) for offset in arena["offsets"]]
    spans = [(offset, offset + padded(size, alignment)) for offset, (size, _, _) in zip(offsets, lifetimes)]
    valid = len(offsets) == len(lifetimes) and all(
        offset % alignment == 0 and 0 <= offset and end <= arena_bytes for offset, end in spans)
    for index, (start, end) in enumerate(spans if valid else []):
        for other in range(index):
            if (lifetimes[other][1] <= lifetimes[index][2] and lifetimes[index][1] <= lifetimes[other][2]
                    and spans[other][0] < end and start < spans[other][1]):
                valid = False
    if not valid:
        raise PlanError(f"{where}: a corrupt plan: the jit arena layout on {arena['device']} puts buffers that are "
                        "live at the same time in overlapping memory (or outside the arena)")
    return offsets, arena_bytes


def arena_key_of(arena: dict[str, Any]) -> str:
    from ember.plan.trace import arena_key

    return arena_key(str(arena["device"]), int(arena["alignment"]),
                     [(int(size), int(first), int(last)) for size, first, last in arena["lifetimes"]])


def load_from_environment() -> None:
    """EMBER_PLAN=path: load that plan when ember is imported. The variable is removed from the environment first:
    loading probes the devices, and the OpenCL probe's child process imports ember (it would load the plan too,
    probe again, and so on)."""
    path = os.environ.pop("EMBER_PLAN", None)
    if path:
        load_plan(path)
