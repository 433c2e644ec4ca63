"""What the CUDA backend compiles to, checked offline (Triton compiles PTX without a GPU)."""

import os
import re

import pytest
from offline import codegen_importable, run_cuda_script

with codegen_importable():
    from ptx_flow import barriers_in_loops, barriers_in_multi_entry_loops

pytestmark = pytest.mark.codegen


@pytest.fixture(scope="module")
def ptx_report() -> dict[str, str]:
    stdout = run_cuda_script("inspect_ptx.py", timeout=300)
    return dict(line.split(" ", 1) for line in stdout.strip().splitlines())


@pytest.mark.parametrize("kernel", ["put", "get"])
def test_translated_accesses_stay_16_byte_vectors(ptx_report, kernel):
    assert re.search(r"'ld\.global\.v4\.b32': 8", ptx_report[kernel]), ptx_report[kernel]
    assert re.search(r"'st\.global\.v4\.b32': 8", ptx_report[kernel]), ptx_report[kernel]


def test_hint_and_cache_modifier_reach_the_remote_store(ptx_report):
    assert re.search(r"'st\.global\.wt\.v4\.b32': 8", ptx_report["put_hinted"]), ptx_report["put_hinted"]


def test_a_volatile_load_drops_the_cache_operator_ptx_cannot_combine_with_it(ptx_report):
    report = ptx_report["load_volatile_cg"]
    assert "ld.volatile.global" in report and ".cg" not in report, report


def test_wake_links_reads_every_line_with_a_load_of_its_own(ptx_report):
    # One volatile 4-byte load per line (1024 lines over 128 threads): none merged, cached or dropped.
    assert re.search(r"'ld\.volatile\.global\.b32': 8\b", ptx_report["wake_links"]), ptx_report["wake_links"]


def test_default_atomics_and_flag_reads_are_system_scope(ptx_report):
    flags = ptx_report["flags"]
    assert "atom.global.sys.acq_rel.add" in flags
    assert "atom.global.sys.release.exch" in flags
    assert "ld.acquire.sys.global.b32" in flags
    # The only GPU-scope atomic is the flight recorder's per-SM slot claim (a 64-bit counter).
    assert ".gpu." not in flags.replace("'atom.global.gpu.relaxed.add.u64'", "")


def test_wait_without_heap_bases_spins_as_before(ptx_report):
    plain = ptx_report["wait_plain"]
    assert "ld.acquire.sys.global.b32" in plain
    assert "%globaltimer" not in plain and "trap" not in plain and "atom" not in plain


def test_timed_wait_reads_the_clock_reports_and_traps(ptx_report):
    timed = ptx_report["wait_timed"]
    assert "'%globaltimer'" in timed and "'trap': 1" in timed
    assert "fence.sc.sys" in timed  # the report reaches host memory before the kernel stops
    # The first timed-out thread claims the report with an atomic of its own (no CTA barrier).
    assert "atom.relaxed.gpu.global.cas" in timed


def test_64_bit_flags_use_64_bit_acquire_loads(ptx_report):
    assert "ld.acquire.sys.global.b64" in ptx_report["flags64"]


def test_device_context_compiles_for_hopper(ptx_report):
    assert "atom.global.sys" in ptx_report["context"] and "ld.acquire.sys" in ptx_report["context"]


def test_tile_collectives_compile_for_hopper_with_vector_accesses(ptx_report):
    tiles = ptx_report["tile_collectives"]
    assert "ld.global.v4.b32" in tiles and "st.global.v4.b32" in tiles, tiles
    assert "atom.global.acquire.sys.cas" in tiles  # the spinlock's acquire
    assert "ld.acquire.sys.global.b32" in tiles  # the ready locks' waits


def test_wait_on_a_peer_flag_polls_the_peer_copy_with_a_timeout(ptx_report):
    remote = ptx_report["wait_remote"]
    assert "ld.acquire.sys.global.b32" in remote and "'%globaltimer'" in remote


def test_tracing_compiled_out_is_the_same_code_as_no_tracing(ptx_report):
    assert ptx_report["untraced_put_equals_reference"] == "True"


def test_no_cta_barrier_sits_in_a_loop_with_two_entries(ptx_report):
    # Irreducible loops with barriers hung a spinlock on Hopper (tests/codegen/inspect_ptx.py says how).
    assert ptx_report["barriers_in_multi_entry_loops"] == "{}"


#: A loop of blocks 2 and 3 that block 1 enters at both (irreducible), a barrier in each.
TWO_ENTRY_LOOP = """.entry k()
{
$L__BB0_1:
\t@%p1 bra \t$L__BB0_3;
$L__BB0_2:
\tbar.sync \t0;
\t@%p2 bra \t$L__BB0_4;
$L__BB0_3:
\tbar.sync \t0;
\tbra.uni \t$L__BB0_2;
$L__BB0_4:
\tret;
}
"""


def test_no_cta_barrier_sits_in_a_spin_loop(ptx_report):
    # Threads leave a spin loop (and time out) at their own polls: a barrier there can wait forever.
    assert ptx_report["barriers_in_wait_loops"] == "{}"


def test_the_spin_loop_check_finds_a_barrier_in_any_loop():
    single_entry = TWO_ENTRY_LOOP.replace("\t@%p1 bra \t$L__BB0_3;\n", "")
    assert barriers_in_loops(single_entry) == 2
    assert barriers_in_loops(single_entry.replace("\tbra.uni \t$L__BB0_2;\n", "\tret;\n")) == 0


def test_the_barrier_check_finds_a_loop_with_two_entries():
    assert barriers_in_multi_entry_loops(TWO_ENTRY_LOOP) == 2
    # The same loop entered at block 2 only is an ordinary loop.
    single_entry = TWO_ENTRY_LOOP.replace("\t@%p1 bra \t$L__BB0_3;\n", "")
    assert barriers_in_multi_entry_loops(single_entry) == 0


def test_traced_variant_reads_the_timer_and_sm(ptx_report):
    traced = ptx_report["put_traced"]
    assert "'%globaltimer': 2" in traced and "'%smid'" in traced
    # A per-SM slot claim (gpu scope), not a system-wide atomic; one thread's, in inline PTX.
    assert re.search(r"atom\.(global\.gpu\.relaxed|relaxed\.gpu\.global)\.add", traced), traced


def test_the_tracing_switch_is_read_once_before_a_loop_of_traced_ops(ptx_report):
    # A plain load of the switch after every op's stores cost the all-scatter ~2 L2 round
    # trips per tile and peer; the switch is read through the invariant path, hoisted.
    reads, in_loops = re.fullmatch(r"(\d+) in_loops (\d+)", ptx_report["tracing_switch_reads"]).groups()
    assert int(reads) >= 1 and int(in_loops) == 0, ptx_report["tracing_switch_reads"]


def test_a_traced_masked_put_exchanges_between_warps_once(ptx_report):
    # The first address and the active-lane count are summed in one reduction (two
    # barriers); thread 0 alone claims the slot and writes the record, so no barrier
    # hands the slot to the other threads. It was seven: two reductions and a broadcast.
    assert int(ptx_report["traced_put_cta_barriers"]) <= 2, ptx_report["traced_put_cta_barriers"]


@pytest.mark.skipif(
    not os.environ.get("NVSHMEM_LIB_DIR"), reason="NVSHMEM's device bitcode is not here (NVSHMEM_LIB_DIR)"
)
@pytest.mark.parametrize("routing", [[], ["--nodes-of-one"]], ids=["always", "per_op"])
def test_the_cross_node_path_links_nvshmem_into_every_kernel(routing):
    # per_op: ops between a rank and itself in a job of one rank per node, where the
    # compiler sees that the cross-node branch is never taken (Triton 3.6 once failed there).
    lines = run_cuda_script("compile_crossnode.py", *routing, timeout=300).strip().splitlines()
    assert len(lines) == 5, lines
    for line in lines:
        assert "nvshmem_state=True" in line and "unresolved=[]" in line and "cubin=True" in line, line
        # The thread-0 atomics share their result behind CTA barriers; a CAS retry loop
        # entered at two blocks would leave threads at different barriers (docs/design.md).
        # Per op, the wait loops hold both paths and LLVM gives them several entries; their
        # branches are uniform over the CTA, so that count is not a hazard there.
        if not routing:
            assert "barriers_in_multi_entry_loops=0" in line, line
    report = dict(line.split(" ", 1) for line in lines)
    assert "rma_p" in report["_rma_kernel"] and "rma_g" in report["_rma_kernel"]
    # Blocks that are runs cross as NVSHMEM block transfers (nvshmemi_transfer_rma): puts and
    # gets directly, register values of loads and stores through a staging slot.
    for kernel in ("_rma_kernel", "_scattered_kernel", "_staged_kernel"):
        assert ",rma," in report[kernel], report[kernel]
    assert "amo_fetch" in report["_atomics_kernel"]
