"""Hardware primitives for the emulation backend.

These run inside the Triton interpreter as ordinary Python, so they can read
the host clock and raise Python exceptions where a GPU would trap or hang.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import triton
import triton.language as tl

from iris_trace.schema import TAG_MASK

from ..backends import call_sites
from ..backends._interpreter_compat import Launches
from ..backends.emulated import RemoteWrites, virtual_sm_count
from ..config import emulated_wait_timeout, wait_timeout
from ..errors import DeviceCheckError, WaitTimeoutError

#: Under the interpreter every wait can read the current global timeout at run time.
HAS_STATIC_TIMEOUT = True


#: Adds the cross-rank view (who should have released the flag) to a timeout's message;
#: installed by ``iris.host.hang`` once a context exists. Takes the facts dict, returns
#: ``(text, culprit rank or None)``.
_describe_hang = None


def set_hang_describer(describe) -> None:
    """Install the function that explains a timed-out wait across ranks (``iris.host.hang`` does)."""
    global _describe_hang
    _describe_hang = describe


def _values(x):
    return np.asarray(x.handle.data) if hasattr(x, "handle") else np.asarray(x)


def load_acquire(pointer, scope):
    # The interpreter executes one program at a time and reads memory directly.
    return tl.load(pointer, volatile=True)


def load_invariant(pointer):
    # A word no one writes during a launch: an ordinary read.
    return tl.load(pointer).to(tl.int64, bitcast=True)


#: How long a spinning wait gives its CPU away between polls. The flag it polls is set by
#: another rank's process, which may need this very CPU (a CI machine of two cores runs
#: four interpreted ranks): spinning flat out only delays the release it waits for.
SPIN_PAUSE_S = 100e-6


def progress():
    # A rank that spins lets its cross-node puts land, as NVSHMEM delivers them eventually,
    # and lets the other ranks' processes run.
    RemoteWrites.complete()
    time.sleep(SPIN_PAUSE_S)


def spin_start():
    return time.monotonic_ns()


def spin_check(start, pointer, seen, expected, op):
    timeout = emulated_wait_timeout()
    started_ns = int(_values(start).reshape(-1)[0])
    if time.monotonic_ns() - started_ns <= timeout * 1e9:
        return
    address = int(_values(pointer).reshape(-1)[0])
    raise WaitTimeoutError(
        f"{op} waited {timeout:g} s on the flag at address {address:#x}: last seen "
        f"{_values(seen).reshape(-1)[0]}, waiting for {_values(expected).reshape(-1)[0]}. "
        "Under the emulation backend the programs of one launch run one after another, so a "
        "program cannot wait for another program of the same launch; otherwise no rank released "
        "this flag (set IRIS_EMU_WAIT_TIMEOUT to wait longer)."
    )


def device_check(condition, message):
    if not np.all(_values(condition)):
        raise DeviceCheckError(str(getattr(message, "value", message)))


def timer_ns():
    # One host clock serves every rank process, so emulated traces need no alignment.
    return tl.full([], time.monotonic_ns(), tl.int64)


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TRITON = os.path.dirname(os.path.abspath(triton.__file__)) + os.sep


def call_site():
    # The GPU's site pass reads the kernel's inlined frames at compile time; the interpreter
    # has the same frames at run time: the first outside the package (the user's line),
    # else the kernel's own (an Iris kernel), the interpreter's own frames skipped.
    frame, kernel_frame = sys._getframe(1), None
    while frame is not None:
        file = os.path.abspath(frame.f_code.co_filename)
        if not file.startswith(_TRITON):
            if not file.startswith(_PACKAGE):
                return _site(file, frame.f_lineno)
            kernel_frame = frame
            if frame.f_code.co_name == Launches.kernel:
                break
        frame = frame.f_back
    if kernel_frame is None:
        return tl.full([], 0, tl.int32)
    return _site(os.path.abspath(kernel_frame.f_code.co_filename), kernel_frame.f_lineno)


def _site(file, line):
    return tl.full([], call_sites.register(Launches.kernel, file, line), tl.int32)


def launch_tag():
    # The launch's number (the interpreter counts them); the first record of a launch
    # puts it in the launch log, with its grid.
    if not Launches.noted:
        grid = [_scalar(tl.num_programs(axis)) for axis in range(3)]
        call_sites.LAUNCHES.note(Launches.kernel, grid, Launches.count & TAG_MASK)
        Launches.noted = True
    return tl.full([], Launches.count & TAG_MASK, tl.int64)


def opaque(x):
    # The interpreter folds nothing.
    return x


def sm_id():
    pid = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))
    return pid % virtual_sm_count()


def _scalar(x):
    return int(_values(x).reshape(-1)[0])


def static_timeout_ns():
    return tl.full([], int(wait_timeout() * 1e9), tl.int64)


def sleep_ns(NS):
    pass  # one program runs at a time: there is nobody to yield to


def fence_system():
    pass  # the interpreter's stores are immediately visible


def claim_alone(pointer):
    # One program runs at a time: the plain atomic is already this program's alone.
    return (tl.atomic_cas(pointer, 0, 1) == 0).to(tl.int32)


def store_alone(pointer, value):
    tl.store(pointer, value)


def write_record(counter, capacity, records, dropped, *words_and_slot):
    # One program runs at a time: the claim, the record and the drop count need no care.
    slot = tl.atomic_add(counter, 1, sem="relaxed", scope="gpu")
    return _store_record(slot, capacity, records, dropped, *words_and_slot)


def reserve_slots(counter, count):
    return tl.atomic_add(counter, tl.cast(count, tl.int32), sem="relaxed", scope="gpu")


def write_reserved_record(first, index, capacity, records, dropped, *words_and_slot):
    slot = tl.cast(first, tl.int32) + tl.cast(index, tl.int32)
    _store_record(slot, capacity, records, dropped, *words_and_slot)


def _store_record(slot, capacity, records, dropped, *words_and_slot):
    # The record at ``slot``, or one more dropped event past ``capacity``; the slot or -1.
    *words, slot_word, slot_shift = words_and_slot
    if int(_values(slot).reshape(-1)[0]) >= int(_values(capacity).reshape(-1)[0]):
        tl.atomic_add(dropped, 1, sem="relaxed", scope="gpu")
        return tl.full([], -1, tl.int64)
    slot = slot.to(tl.int64)
    word = tl.arange(0, len(words))
    record = tl.zeros([len(words)], tl.int64)
    for index, value in enumerate(words):
        if index == getattr(slot_word, "value", slot_word):
            value = tl.cast(value, tl.int64) | (slot << getattr(slot_shift, "value", slot_shift))
        record = tl.where(word == index, tl.cast(value, tl.int64), record)
    tl.store(records + slot * len(words) + word, record)
    return slot


#: Words per step of ``copy_alone``: the interpreter is faster on blocks than on scalars.
_COPY_BLOCK = 1024


def copy_alone(destination, source, count):
    total = int(_values(count).reshape(-1)[0])
    for start in range(0, total, _COPY_BLOCK):
        offsets = start + tl.arange(0, _COPY_BLOCK)
        inside = offsets < total
        tl.store(destination + offsets, tl.load(source + offsets, mask=inside), mask=inside)


def wait_expired(won, rank, sm, pid, op, offset, expected, seen, cmp, waited_ns, timeout):
    facts = {
        "op": str(getattr(op, "value", op)),
        "cmp": str(getattr(cmp, "value", cmp)),
        "rank": _scalar(rank),
        "sm": _scalar(sm),
        "pid": _scalar(pid),
        "offset": _scalar(offset),
        "expected": _scalar(expected),
        "seen": _scalar(seen),
        "waited_ns": _scalar(waited_ns),
        "timeout_ns": _scalar(timeout),
    }
    where = f"heap offset {facts['offset']:#x}" if facts["rank"] >= 0 else f"address {facts['offset']:#x}"
    who = f"rank {facts['rank']}, " if facts["rank"] >= 0 else ""
    message = (
        f"{facts['op']} waited {facts['timeout_ns'] / 1e9:g} s on the flag at {where}: last seen "
        f"{facts['seen']}, waiting for {facts['cmp']} {facts['expected']} "
        f"({who}SM {facts['sm']}, program {facts['pid']})."
    )
    culprit = None
    if _describe_hang is not None and facts["rank"] >= 0:
        try:
            text, culprit = _describe_hang(facts)
            message += " " + text
        except Exception as error:  # noqa: BLE001 - the timeout itself must still be reported
            message += f" (no cross-rank report: {error!r})"
    message += (
        " Under the emulation backend the programs of one launch run one after another, so a "
        "program cannot wait for another program of the same launch; otherwise no rank released "
        "this flag (set IRIS_WAIT_TIMEOUT to wait longer)."
    )
    raise WaitTimeoutError(message, culprit=culprit)
