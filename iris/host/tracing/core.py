"""Host side of tracing: ``ctx.tracing.enable()``, ``events()``, ``collect()``.

``enable`` allocates the trace buffers on the symmetric heap, measures every
GPU's clock against rank 0's, fills the tracing slots of the context tensor and
switches ``get_heap_bases()`` / ``get_device_context()`` to their traced views
(see ``iris.device.tracing`` for why that is all a kernel needs). ``collect``
measures the clocks again, so each rank gets an offset and a drift, and brings
every rank's events together.
"""

from __future__ import annotations

import math
import os
import sys
import weakref

import numpy as np
import torch
import torch.distributed as dist

from iris_trace.events import decode_records
from iris_trace.sites import name_launches
from iris_trace.trace import RankTrace, Trace, claim_directory

from ...backends import call_sites
from ...device import layout
from ...device import tracing as device_tracing
from ...device.clock_sync import ping_kernel, pong_kernel
from . import torch_profiler, upstream_json

COUNTER_STRIDE = int(device_tracing.COUNTER_STRIDE)
RECORD_WORDS = int(device_tracing.RECORD_WORDS)


def sample_period(sample) -> int:
    """The sampling period ``k`` of ``enable(sample=...)``: one program in ``k`` records, ``k``
    the power of two nearest ``1 / sample`` (in ratio).

    Raises:
        ValueError: ``sample`` is not a number in (0, 1].

    Example:
        >>> sample_period(0.125)
        8
    """
    if isinstance(sample, bool) or not isinstance(sample, (int, float)) or not 0 < sample <= 1:
        raise ValueError(f"iris: tracing.enable(sample=...) must be a fraction in (0, 1], got {sample!r}")
    # A power of two: the device tests a mask, which costs a kernel nothing per op (docs/design.md).
    return 1 << min(round(math.log2(1 / sample)), 30)


class Tracing:
    """Per-rank tracing control, reached as ``ctx.tracing``.

    Example:
        >>> ctx.tracing.enable(max_events=1 << 20)
        >>> kernel[grid](buf, ctx.get_rank(), ctx.get_heap_bases())   # unchanged kernel, now traced
        >>> trace = ctx.tracing.collect()                             # rank 0: every rank, aligned
    """

    def __init__(self, ctx):
        # A proxy: the context's parts must not keep it alive (see Iris.close).
        self._ctx = weakref.proxy(ctx)
        self.enabled = False
        self.max_events = 0
        self.scope_names: dict[int, str] = {}
        self._regions = ctx.get_cu_count()
        self._capacity = 0
        self._counters = self._dropped = self._records = None
        self._ping = self._pong = None
        self._sync_enable: np.ndarray | None = None
        #: One program in this many records (:meth:`enable`'s ``sample``); 1: every program.
        self.sample_period = 1
        #: What :meth:`torch_profiler` last recorded (kept for the next export), and whether
        #: a collect has carried it (a second profile may then replace it).
        self._torch_profile = None
        self._torch_profile_collected = False
        #: Enables so far: with the context's session, the id of the current run (``run``).
        self._runs = 0
        self._sync_rounds = 16 if ctx.backend.interpreted else 200

    # ------------------------------------------------------------------ control
    def enable(self, max_events: int = 1 << 20, sample: float = 1.0) -> None:
        """Start recording every device op of every rank (collective).

        ``max_events`` is this rank's buffer size; it is split evenly over one region
        per SM, which the SMs take turns to fill (docs/tracing.md), and events beyond a
        full region are counted as dropped.
        Buffers persist on the heap; enabling again with a larger size allocates more.

        ``sample`` (0 < sample <= 1) records that fraction of programs: every ``k``-th
        program of each launch, ``k`` the power of two nearest ``1 / sample``, program 0 always
        (:attr:`sample_period`). A recorded program records all of its ops; the report
        scales its totals and gives their error bounds (docs/tracing.md "Sampling").

        Example:
            >>> ctx.tracing.enable(max_events=100_000)
            >>> ctx.tracing.enable(sample=1 / 8)   # one program in eight
        """
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"iris: max_events must be a positive int, got {max_events!r}")
        period = sample_period(sample)
        capacity = -(-max_events // self._regions)
        pieces = self._pieces(capacity) if capacity > self._capacity else []
        heap = self._ctx.heap
        needed = heap.bytes_needed(pieces) if pieces else 0
        # All or nothing, on every rank alike: nothing is allocated unless every rank has room.
        asks = self._ctx._comm.all_gather_object((max_events, needed, heap.free, period))
        sizes = [ask[0] for ask in asks]
        if len(set(sizes)) != 1:
            raise ValueError(f"iris: tracing.enable(max_events=...) must match on every rank, got {sizes}")
        periods = [ask[3] for ask in asks]
        if len(set(periods)) != 1:
            raise ValueError(
                f"iris: tracing.enable(sample=...) must match on every rank, got periods {periods}"
            )
        short = [(rank, need, free) for rank, (_, need, free, _) in enumerate(asks) if need > free]
        if short:
            rank, need, free = short[0]
            raise MemoryError(
                f"iris: tracing.enable(max_events={max_events}) needs {need} bytes of symmetric heap "
                f"(64 B per event), but rank {rank} has {free} free: enable fewer events or make the "
                "heap larger; tracing stays as it was"
            )
        if pieces:
            self._allocate(capacity, pieces)
        self.max_events = max_events
        self.reset()
        self._sync_enable = self._sync_clocks()
        self.sample_period = period
        self._write_slots(enabled=period)
        self.enabled = True
        self._ctx.backend.log_launches(True)
        self._runs += 1

    @property
    def run(self) -> str:
        """The current run's id, the same on every rank: rank files carry it, and files of
        different runs are never merged (``""`` before the first :meth:`enable`).

        Example:
            >>> ctx.tracing.run
            '3f2a9c41b7d0-1'
        """
        return f"{self._ctx.hang.recorder.session}-{self._runs}" if self._runs else ""

    def disable(self) -> None:
        """Stop recording; kernels launched afterwards compile and run without tracing.

        Example:
            >>> ctx.tracing.disable()
        """
        if self._records is not None:
            self._write_slots(enabled=0)
        self.enabled = False
        self._ctx.backend.log_launches(False)

    def reset(self) -> None:
        """Forget the events recorded so far on this rank.

        The records are cleared too: a slot reserved for an op that never ends (a wait
        that timed out) then reads as unwritten, not as an event from before the reset.

        Example:
            >>> ctx.tracing.reset()
        """
        self._torch_profile = None
        call_sites.LAUNCHES.clear()
        if self._counters is not None:
            self._counters.zero_()
            self._dropped.zero_()
            self._records.zero_()

    def torch_profiler(self, **profiler_options):
        """PyTorch's profiler on this rank, its events put on the trace's clock (a context manager).

        Runs ``torch.profiler.profile(**profiler_options)`` (``schedule`` and
        ``on_trace_ready`` excepted: the whole profile is kept) and yields it. At its start
        and end a few one-thread marker kernels align the profiler's clock with this GPU's
        (``iris_trace.torch_profile``). The next :meth:`collect` or :meth:`export` carries
        the profile: in the merged Perfetto trace each rank's host threads and CUDA streams
        (cuBLAS, NCCL and Iris kernels alike) sit under that rank beside its SMs, on one
        clock, with an arrow from each launch to its kernel. Not collective; tracing must
        be enabled; :meth:`enable` and :meth:`reset` forget the profile. A second profile
        before the first was collected is refused (it would replace it).

        Example:
            >>> from torch.profiler import ProfilerActivity
            >>> with ctx.tracing.torch_profiler(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            ...     step()
            >>> trace = ctx.tracing.export("traces/")   # rank files and the merged trace hold it
        """
        return torch_profiler.profile(self, **profiler_options)

    def name_scope(self, scope: int, name: str) -> None:
        """Name the compute scope ``scope`` of :func:`iris.trace_end` in traces and reports.

        Example:
            >>> ctx.tracing.name_scope(0, "gemm tile")
        """
        self.scope_names[int(scope)] = str(name)

    # ------------------------------------------------------------------ reading
    def events(self) -> np.ndarray:
        """This rank's events as a numpy structured array (``iris_trace.events.EVENT_DTYPE``).

        Timestamps are this GPU's own clock; :meth:`collect` aligns them across ranks.

        Example:
            >>> ev = ctx.tracing.events()
            >>> (ev["event_id"] == 4).sum()   # puts
        """
        self._require_buffers()
        self._ctx.backend.synchronize(self._ctx.get_device())
        counts = self._counters.view(self._regions, COUNTER_STRIDE)[:, 0].cpu().numpy()
        return decode_records(self._records.cpu().numpy(), counts, self._capacity, self._ctx.num_ranks)

    def dropped(self) -> int:
        """Events this rank could not record because the buffer region they went to was full.

        A record that stands for every peer (a fused op's push of a tile) counts once.

        Example:
            >>> assert ctx.tracing.dropped() == 0
        """
        self._require_buffers()
        self._ctx.backend.synchronize(self._ctx.get_device())
        return int(self._dropped.view(self._regions, COUNTER_STRIDE)[:, 0].sum().item())

    def collect(self, directory: str | None = None):
        """Bring every rank's events and clock samples together (collective).

        Without ``directory``: returns an ``iris_trace.Trace`` on rank 0 (``None``
        elsewhere) with all timestamps on rank 0's clock. With ``directory``:
        every rank writes ``directory/rank<N>.npz`` and returns its path, for
        ``iris-trace merge`` later.

        Example:
            >>> trace = ctx.tracing.collect()
            >>> if trace is not None:
            ...     print(len(trace.events), trace.clock_fits[1].residual_ns)
        """
        self._require_buffers()
        if self._sync_enable is None:
            raise RuntimeError("iris: tracing was never enabled, so there are no clock samples to align with")
        rank_trace = self._rank_trace(sync_collect=self._sync_clocks())
        if directory is not None:
            # Rank 0 claims the directory for this run (a live job of another run keeps
            # its own: this run's files then go beside it) and every rank writes there.
            chosen = claim_directory(directory, self.run) if self._ctx.cur_rank == 0 else None
            chosen = self._ctx._comm.broadcast_object(chosen, src=0)
            return rank_trace.save(os.path.join(chosen, f"rank{rank_trace.rank}.npz"))
        gathered = [None] * self._ctx.num_ranks if self._ctx.cur_rank == 0 else None
        dist.gather_object(rank_trace, gathered, dst=0, group=self._ctx._comm.control_group)
        return Trace(gathered) if self._ctx.cur_rank == 0 else None

    def export(self, path: str = "trace.json", merge: bool = False):
        """Write the trace (collective where it merges), in this package's form or upstream Iris's.

        A directory (this package's form): every rank writes ``rank<N>.npz`` there (for
        ``iris-trace``), and rank 0 gets the merged ``iris_trace.Trace`` (``None`` elsewhere).
        If a live job of another run is writing into it, the files go to
        ``<directory>-<run>`` instead (said on stderr); ``trace.directory`` is where they went.

        A ``.json`` file name (upstream Iris's form, and its default): every rank writes its
        events as Chrome trace JSON to ``<name>_rank<N>.json`` and gets that document back;
        with ``merge=True`` rank 0 also writes every rank's events, on its clock, to the
        file itself and gets that document, the other ranks ``{}``
        (:mod:`iris.host.tracing.upstream_json`).

        Example:
            >>> trace = ctx.tracing.export("traces/")              # rank0.npz, rank1.npz, ...
            >>> merged = ctx.tracing.export("trace.json", merge=True)
        """
        if str(path).endswith(".json"):
            return upstream_json.export(self, str(path), merge)
        trace = self.collect()
        if trace is not None:
            trace.save(path)
        return trace

    @property
    def trace_counter(self) -> torch.Tensor | None:
        """Events this rank's kernels have recorded or tried to (upstream Iris's counter): a
        one-element int32 tensor on the device, ``None`` before :meth:`enable`.

        Example:
            >>> assert ctx.tracing.trace_counter.item() >= 1
        """
        if self._counters is None:
            return None
        recorded = self._counters.view(self._regions, COUNTER_STRIDE)[:, 0].sum()
        dropped = self._dropped.view(self._regions, COUNTER_STRIDE)[:, 0].sum()
        return (recorded + dropped).to(torch.int32).view(1)

    @property
    def trace_buffers(self) -> dict[str, torch.Tensor] | None:
        """This rank's events as upstream Iris's per-field buffers, ``None`` before :meth:`enable`.

        A dict of device tensors named as upstream's (``event_id``, ``pid``, ``pid_m``,
        ``pid_n``, ``cur_rank``, ``target_rank``, ``xcc_id``, ``cu_id``, ``timestamp``,
        ``address``, ``duration_cycles`` (the end time, as upstream's), ``op_index``,
        ``payload_size``), read from the trace buffers when asked: a copy, in the order the
        events started, at least ``max_events`` long and zero past the last event. Times
        are nanoseconds of this GPU's timer (upstream: cycles); event ids are
        ``iris.host.tracing.events.TraceEvent``'s.

        Example:
            >>> bufs = ctx.tracing.trace_buffers
            >>> assert bufs["event_id"][0].item() == int(TraceEvent().put)
        """
        if self._records is None:
            return None
        return upstream_json.trace_buffers(self.events(), self.max_events, self._ctx.get_device())

    # ------------------------------------------------------------------ internals
    def _require_buffers(self) -> None:
        if self._records is None:
            raise RuntimeError("iris: tracing was never enabled on this context (call ctx.tracing.enable())")

    def _pieces(self, capacity: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """The heap pieces buffers of ``capacity`` events per region take (:meth:`_allocate`'s order)."""
        counters = ((self._regions * COUNTER_STRIDE,), torch.int32)
        pieces = [counters, counters, ((self._regions * capacity * RECORD_WORDS,), torch.int64)]
        if self._ping is None:
            pieces += [((1,), torch.int32), ((1,), torch.int32)]
        return pieces

    def _allocate(self, capacity: int, pieces) -> None:
        made = [self._ctx.zeros(*shape, dtype=dtype) for shape, dtype in pieces]
        counters, dropped, records, *ping_pong = made
        self._counters, self._dropped, self._records = counters, dropped, records
        if ping_pong:
            self._ping, self._pong = ping_pong
        self._capacity = capacity

    def _write_slots(self, enabled: int) -> None:
        ctx = self._ctx
        first = layout.tracing_slot(ctx.num_ranks, 0)
        values = {
            int(device_tracing.SLOT_ENABLED): enabled,
            int(device_tracing.SLOT_MAX_EVENTS): self.max_events,
            int(device_tracing.SLOT_REGION_CAPACITY): self._capacity,
            int(device_tracing.SLOT_NUM_REGIONS): self._regions,
            int(device_tracing.SLOT_COUNTERS): self._counters.data_ptr(),
            int(device_tracing.SLOT_DROPPED): self._dropped.data_ptr(),
            int(device_tracing.SLOT_RECORDS): self._records.data_ptr(),
        }
        ctx._write_context({first + slot: value for slot, value in values.items()})

    def _sync_clocks(self) -> np.ndarray:
        """Ping-pong stamps ``(world, rounds, 4)`` of every rank against rank 0 (collective)."""
        ctx, rounds = self._ctx, self._sync_rounds
        rank, world = ctx.cur_rank, ctx.num_ranks
        samples = np.zeros((world, rounds, 4), dtype=np.int64)
        stamps = torch.zeros(rounds * 4, dtype=torch.int64, device=ctx.get_device())
        for peer in range(1, world):
            self._ping.zero_()
            self._pong.zero_()
            stamps.zero_()
            ctx.barrier()
            # The sync itself is never traced: it uses the plain heap_bases view.
            if rank == 0:
                ping_kernel[(1,)](
                    self._ping, self._pong, stamps, rounds, 0, peer, ctx.heap_bases, num_warps=1
                )
            elif rank == peer:
                pong_kernel[(1,)](
                    self._ping, self._pong, stamps, rounds, peer, 0, ctx.heap_bases, num_warps=1
                )
            ctx.barrier()
            mine = stamps.cpu().numpy().reshape(rounds, 4) if rank in (0, peer) else None
            both = ctx._comm.all_gather_object(mine)
            samples[peer][:, [0, 3]] = both[0][:, [0, 3]]
            samples[peer][:, [1, 2]] = both[peer][:, [1, 2]]
        return samples

    def _rank_trace(self, sync_collect: np.ndarray) -> RankTrace:
        ctx = self._ctx
        self._torch_profile_collected = True
        events = self.events()
        sites = {s: call_sites.SITES[s] for s in np.unique(events["site"]).tolist() if s in call_sites.SITES}
        return RankTrace(
            rank=ctx.cur_rank,
            world_size=ctx.num_ranks,
            events=events,
            sync_enable=self._sync_enable,
            sync_collect=sync_collect,
            dropped=self.dropped(),
            device=ctx.backend.device_name(ctx.get_device()),
            heap_size=ctx.heap_size,
            num_sms=self._regions,
            scope_names=dict(self.scope_names),
            command=" ".join(sys.argv),
            clock_domain=ctx.backend.clock_domain(ctx.get_device()),
            run=self.run,
            sample_period=self.sample_period,
            torch=self._torch_profile,
            sites=sites,
            shared_sites=sorted(call_sites.SHARED.intersection(sites)),
            launches=name_launches(events, sites, call_sites.LAUNCHES.entries),
        )
