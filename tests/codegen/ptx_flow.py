"""Control flow of compiled PTX: CTA barriers that threads may not reach together.

Pure Python (no Triton, no GPU), used by the compile checks (``inspect_ptx.py``,
``compile_ccl.py``, ``compile_ops_kernels.py``) and their tests.
"""

from __future__ import annotations

import re


def _control_flow(ptx: str) -> tuple[list[str], dict[str, list[str]], dict[str, list[str]]]:
    # Basic blocks of the kernel body (a block per label, and after each unconditional
    # branch), their instructions and successors.
    body = ptx.split(".section\t.debug")[0]
    body = body[body.index("{", body.index(".entry")) :]
    current, order = "entry", ["entry"]
    code: dict[str, list[str]] = {"entry": []}
    successors: dict[str, list[str]] = {"entry": []}
    falls_through = True
    for raw in body.splitlines():
        line = raw.split("//")[0].strip()
        label = re.match(r"(\$L__BB\d+_\d+):", line)
        if label or not falls_through:
            name = label.group(1) if label else f"after_{len(order)}"
            if falls_through:
                successors[current].append(name)
            current = name
            order.append(name)
            code[name], successors[name] = [], []
            falls_through = True
            if label:
                continue
        if not line or line.startswith((".loc", "$L__")):
            continue
        code[current].append(line)
        branch = re.search(r"(@!?%p\d+\s+)?bra(?:\.uni)?\s+(\$L__BB\d+_\d+);", line)
        if branch:
            successors[current].append(branch.group(2))
            falls_through = bool(branch.group(1))
        elif line.startswith(("ret;", "exit;")):
            falls_through = False
    return order, code, successors


def _closure(starts: list[str], edges: dict[str, list[str]]) -> set[str]:
    """The blocks reachable from ``starts`` along ``edges`` (``starts`` included)."""
    seen, pending = set(), list(starts)
    while pending:
        block = pending.pop()
        if block not in seen:
            seen.add(block)
            pending.extend(edges[block])
    return seen


def barriers_in_multi_entry_loops(ptx: str) -> int:
    """CTA barriers (``bar.sync``) inside loops that control can enter at more than one block.

    Such loops (irreducible control flow) come from the compiler merging copies of the
    same code, e.g. an op called before a loop and inside it. Threads need not reach a
    barrier there together: on Hopper a spinlock built that way hung a later wait.
    A loop is irreducible where a branch back to a block on the current path goes to
    a block that does not dominate the branch (every path from the entry passes a
    dominator first); the loop is the blocks between the two.
    """
    order, code, successors = _control_flow(ptx)
    predecessors: dict[str, list[str]] = {block: [] for block in order}
    reachable = _closure([order[0]], successors)
    for block in reachable:
        for target in successors[block]:
            predecessors[target].append(block)
    dominators = {block: set(reachable) for block in reachable}
    dominators[order[0]] = {order[0]}
    changed = True
    while changed:
        changed = False
        for block in order:
            if block in reachable and block != order[0]:
                new = set.intersection(*(dominators[p] for p in predecessors[block])) | {block}
                if new != dominators[block]:
                    dominators[block], changed = new, True
    # Depth-first search for branches back to a block on the current path.
    irreducible, on_path, done = [], set(), set()
    work = [(order[0], 0)]
    on_path.add(order[0])
    while work:
        block, child = work.pop()
        targets = successors[block]
        if child == len(targets):
            on_path.discard(block)
            done.add(block)
            continue
        work.append((block, child + 1))
        target = targets[child]
        if target in on_path:
            if target not in dominators[block]:
                irreducible.append((block, target))
        elif target not in done:
            on_path.add(target)
            work.append((target, 0))

    loop: set[str] = set()
    for source, target in irreducible:
        loop |= _closure([target], successors) & _closure([source], predecessors)
    return sum(line.startswith("bar.sync") for block in loop for line in code[block])


def barriers_in_loops(ptx: str) -> int:
    """CTA barriers (``bar.sync``) inside any loop: none may sit in a spin loop.

    Each thread of a spinning program leaves the loop at its own poll (and times out
    at its own clock read), so a barrier in the loop's body can wait for threads that
    have left. Loops with a fixed trip count (a GEMM's K loop) may hold barriers:
    apply this to kernels whose only loops are spin loops.
    """
    return instructions_in_loops(ptx, "bar.sync")


def instructions_in_loops(ptx: str, prefix: str) -> int:
    """Instructions starting with ``prefix`` inside any loop of the kernel.

    Example:
        >>> instructions_in_loops(ptx, "ld.global.nc")  # 0: hoisted out of every loop
    """
    order, code, successors = _control_flow(ptx)
    in_loop = [block for block in order if block in _closure(successors[block], successors)]
    return sum(line.startswith(prefix) for block in in_loop for line in code[block])


def print_barrier_hazards(counts: dict[str, int]) -> None:
    """The closing report line of the compile checks: kernels with :func:`barriers_in_multi_entry_loops`."""
    print("barriers_in_multi_entry_loops", {name: count for name, count in counts.items() if count})
