"""Fixes to the Triton interpreter, applied by the emulation backend at ``import iris``.

Each fix changes nothing where the interpreter already works:

- **NumPy >= 2.4.** The interpreter stores scalars as one-element arrays and
  converts them with ``int(array)``, which NumPy 2.4 turned into an error;
  ``for i in range(n)`` with a runtime ``n`` then fails. ``tensor.__index__`` is
  re-installed with an explicit element read.
- **Import order.** ``@triton.jit`` picks the interpreter only if
  ``TRITON_INTERPRET`` is set when it runs. A program that imports Triton (or
  defines kernels) before ``import iris`` holds compiled-mode ``JITFunction``
  objects, Triton's own ``tl.min``/``tl.max``/``tl.sum`` among them, and calling
  one raises "Cannot call @triton.jit'd outside of the scope of a kernel" or
  looks for a GPU driver. Under emulation a ``JITFunction`` runs through an
  ``InterpretedFunction`` of the same Python function, so kernels behave the
  same whatever the import order (``iris.run`` also sets the variable in its
  ranks' environment, so there nothing needs converting).
- **bf16 constants.** ``tl.full(..., tl.bfloat16)`` asks the builder for
  ``get_bf16``, which the interpreter lacks; bf16 values are stored as their
  upper 16 bits (``uint16``), rounded to nearest even.
- **Floating-point exchange.** The interpreter's ``atomic_xchg`` accepts only
  integers; an exchange moves bits, so 32- and 64-bit floats go through the
  integer of their width.
- **bf16 atomic add.** The interpreter adds bf16 values (stored as ``uint16``) as
  integers; a bf16 add becomes a compare-swap loop on the 16-bit words, atomic
  across the rank processes that share the heaps.
- **bf16 arithmetic.** For the same reason every other bf16 computation ran on the
  bits: ``1 + 1`` gave ``2**127``, ``tl.dot`` and ``tl.sum`` of bf16 tiles nonsense,
  comparisons of negative values the wrong way round, and ``tl.abs`` (and, from
  Triton 3.9, unary minus) left a negative value's bits as they were. Float
  arithmetic, negation, absolute values, comparisons, math functions, ``tl.dot``,
  the reductions and scans numpy computes directly (sum, min, max, cumsum,
  cumprod) and casts to and from bf16 now widen bf16 operands to fp32 and round a
  bf16 result to nearest even, as a GPU does (the interpreter's own fp32-to-bf16
  cast truncated).
- **Launch hooks.** :data:`AFTER_LAUNCH` runs after every interpreted launch (the
  emulation backend delivers cross-node writes there); :class:`Launches` numbers the
  launches, so trace records can say which one they came from.
- **Helper calls.** The interpreter patches ``triton.language`` (every builtin of
  ``tl``, ``tl.tensor`` and ``tl.math``, found with ``inspect.getmembers``) when a
  launch starts, and again at *every* call of a ``@triton.jit`` helper inside it,
  though nothing has changed since; in Iris's kernels, helpers calling helpers, that
  was over half of an emulated cross-node all-reduce's time. A launch now patches
  both language modules (``tl`` and ``tl.core``) once, and helper calls inside it
  reuse that; outside a launch nothing changes.
- **Reductions with a combine function of their own** (``tl.reduce(x, axis, fn)``: the
  tracing recorder sums an access's first address and active lanes in one such
  reduction) ran ``fn`` once per element in Python: 25 ms per traced 1024-element
  store, longer than the store. They now combine neighbouring pairs, a whole array at a
  time, ``log2(n)`` calls in all, the order a GPU's tree keeps (``fn`` must be
  associative, as on a GPU); a function that cannot take arrays still runs element by
  element.
- **Overflow checks nobody reads.** With ``sanitize_overflow`` on (the interpreter's
  default), every 8-to-32-bit integer add, subtract and multiply is computed again in
  64 bits and compared against the type's range for a ``device_assert``, which drops
  the result unless ``debug`` is set, and the interpreter never sets it. A compiler
  removes such dead code; the interpreter ran it, about a third of an emulated
  cross-node all-reduce's time. The interpreter's options now turn it off while
  ``debug`` is off; the values computed are the same.
- **Element types.** The interpreter built its table of NumPy types (twenty hashed
  Triton types) at every lookup, tens of thousands per collective; the table is now
  built once per type.
- **Gluon kernels.** ``@gluon.jit`` kernels cannot be interpreted (Triton 3.6 then
  looks for a GPU driver and fails with "0 active drivers"); launching one raises an
  error that says so and what to do instead.
- **Aggregate methods.** Triton's ``_aggregate`` attaches only compiled-mode
  ``JITFunction`` members; under the interpreter they are ``InterpretedFunction``
  objects and would be dropped (:func:`finish_aggregate` attaches them).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import triton.language as tl
from triton._C.libtriton import interpreter as _native
from triton.runtime import interpreter as _interpreter
from triton.runtime import jit as _jit


def _index(tensor) -> int:
    return int(tensor.handle.data.reshape(-1)[0])


def _patch_numpy_index() -> None:
    original = _interpreter._patch_lang_tensor
    if getattr(original, "_iris_fixed", False):
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", _index)

    patch_lang_tensor._iris_fixed = True
    _interpreter._patch_lang_tensor = patch_lang_tensor


def _interpreted(jit_function):
    """The ``InterpretedFunction`` of a compiled-mode ``JITFunction``, made once."""
    interpreted = jit_function.__dict__.get("_iris_interpreted")
    if interpreted is None:
        interpreted = _interpreter.InterpretedFunction(jit_function.fn)
        jit_function.__dict__["_iris_interpreted"] = interpreted
    return interpreted


#: Called after every interpreted launch (the emulation backend completes cross-node writes there).
AFTER_LAUNCH: list = []


class Launches:
    """The interpreted launches of this process: how many so far, and the running one's kernel.

    A launch's number is its tag in trace records (``intrinsics.launch_tag``).
    """

    count = 0
    kernel = ""
    #: Whether the running launch is in ``call_sites.LAUNCHES`` yet (it is, once it records).
    noted = False


def _patch_launch_hooks() -> None:
    cls = _interpreter.InterpretedFunction
    original = cls.run
    if getattr(original, "_iris_hooked", False):
        return

    def run(self, *args, **kwargs):
        if not kwargs.get("warmup"):
            Launches.count += 1
            Launches.kernel, Launches.noted = self.fn.__name__, False
        try:
            result = original(self, *args, **kwargs)
        except Exception as error:
            fault = _device_fault(error)
            if fault is None:
                raise
        else:
            for hook in AFTER_LAUNCH:
                hook()
            return result
        # The interpreter wraps an error once per @triton.jit frame it passes through (five
        # deep for a wait inside a collective): the user gets Iris's own, once, raised here.
        fault.__cause__ = fault.__context__ = None
        raise fault.with_traceback(None)

    run._iris_hooked = True
    cls.run = run


def _device_fault(error: BaseException):
    """The Iris device fault (a wait timeout, a failed debug check) an interpreter error wraps, if any."""
    from ..errors import DeviceCheckError, WaitTimeoutError

    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, (WaitTimeoutError, DeviceCheckError)):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


class _LaunchPatches:
    """Whether an interpreted launch is running, and whether it has patched the language yet."""

    running = 0
    patched = False


class _NoPatches:
    # What a helper call inside a launch gets instead of a patch scope: nothing to undo.
    @staticmethod
    def restore() -> None:
        pass


def _patch_language_once_per_launch() -> None:
    original_patch = _interpreter._patch_lang
    executor = getattr(_interpreter, "GridExecutor", None)
    if getattr(original_patch, "_iris_fixed", False) or executor is None:
        return
    import types

    import triton.language as tl

    # What ``_patch_lang`` reads of a function is its globals' language modules: these are both.
    every_language = types.SimpleNamespace(__globals__={"tl": tl, "core": tl.core})

    def patch_lang(fn):
        if not _LaunchPatches.running:
            return original_patch(fn)
        if _LaunchPatches.patched:
            return _NoPatches
        _LaunchPatches.patched = True
        return original_patch(every_language)

    original_launch = executor.__call__

    def launch(self, *args, **kwargs):
        _LaunchPatches.running += 1
        try:
            return original_launch(self, *args, **kwargs)
        finally:
            _LaunchPatches.running -= 1
            _LaunchPatches.patched = False

    patch_lang._iris_fixed = True
    _interpreter._patch_lang = patch_lang
    executor.__call__ = launch


def _patch_jit_functions() -> None:
    cls = _jit.JITFunction
    if getattr(cls, "_iris_interprets", False):
        return

    def run(self, *args, grid, warmup, **kwargs):
        return _interpreted(self).run(*args, grid=grid, warmup=warmup, **kwargs)

    def call(self, *args, **kwargs):
        return _interpreted(self)(*args, **kwargs)

    def bind(self, instance, owner=None):
        # Methods of an aggregate defined before ``import iris`` are JITFunctions
        # stored on the class; the interpreter calls them as plain Python methods.
        if instance is None:
            return self
        return lambda *args, **kwargs: call(self, instance, *args, **kwargs)

    cls.run = run
    cls.__call__ = call
    cls.__get__ = bind
    cls._iris_interprets = True


def _bf16_bits(value) -> np.ndarray:
    bits = np.array([value], dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def _patch_bf16_constants() -> None:
    builder = _interpreter.InterpreterBuilder
    if hasattr(builder, "get_bf16"):
        return
    import triton.language as tl

    builder.get_bf16 = lambda self, value: _interpreter.TensorHandle(_bf16_bits(value), tl.bfloat16)


def _bf16_to_float(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _float_to_bf16(values: np.ndarray) -> np.ndarray:
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def _bf16_atomic_add(pointers: np.ndarray, addends: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """bf16 atomic add (the interpreter adds bf16 bits as integers): a compare-swap loop per element.

    Ranks are processes adding into shared memory at once, so each element is swapped
    in only if nobody changed it since it was read; the others read again and retry.
    """
    shape = pointers.shape
    pointers, addends = pointers.reshape(-1), np.broadcast_to(addends, shape).reshape(-1)
    pending = np.broadcast_to(mask, shape).reshape(-1).copy()
    old = np.zeros(pointers.size, np.uint16)
    seen = _native.load(pointers, pending, old.copy(), np.dtype(np.uint16))
    acq_rel = _native.MEM_SEMANTIC.ACQUIRE_RELEASE
    while pending.any():
        at = np.nonzero(pending)[0]
        wanted = _float_to_bf16(_bf16_to_float(seen[at]) + _bf16_to_float(addends[at]))
        got = _native.atomic_cas(pointers[at], seen[at], wanted, acq_rel)
        swapped = got == seen[at]
        old[at[swapped]] = seen[at[swapped]]
        pending[at[swapped]] = False
        seen[at[~swapped]] = got[~swapped]
    return old.reshape(shape)


def _patch_float_exchange() -> None:
    builder = _interpreter.InterpreterBuilder
    original = builder.create_atomic_rmw
    if getattr(original, "_iris_fixed", False):
        return
    import triton.language as tl
    from triton._C.libtriton import ir

    integer_of = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}

    def create_atomic_rmw(self, rmw_op, ptr, val, mask, sem, scope):
        if rmw_op == ir.ATOMIC_OP.FADD and val.dtype.scalar == tl.bfloat16:
            old = _bf16_atomic_add(ptr.data, val.data, mask.data)
            return _interpreter.TensorHandle(old, val.dtype.scalar)
        as_integer = integer_of.get(val.data.dtype)
        if rmw_op != ir.ATOMIC_OP.XCHG or as_integer is None:
            return original(self, rmw_op, ptr, val, mask, sem, scope)
        bits = _interpreter.TensorHandle(val.data.view(as_integer), val.dtype)
        old = original(self, rmw_op, ptr, bits, mask, sem, scope)
        return _interpreter.TensorHandle(old.data.view(val.data.dtype), old.dtype)

    create_atomic_rmw._iris_fixed = True
    builder.create_atomic_rmw = create_atomic_rmw


_RELATIONS = ("EQ", "NE", "LT", "GT", "LE", "GE")
#: Builder methods that compute on floats, and which argument's dtype their result takes.
_BF16_FLOAT_OPS = {
    **{
        name: 0
        for name in (
            "create_fadd",
            "create_fsub",
            "create_fmul",
            "create_fdiv",
            "create_frem",
            "create_precise_divf",
            "create_approx_divf",  # Triton 3.9
            "create_fneg",  # Triton 3.9 (3.6 negated by subtracting from zero)
            "create_fabs",
            "create_minimumf",
            "create_minnumf",
            "create_maximumf",
            "create_maxnumf",
            "create_clampf",
            "create_cos",
            "create_sin",
            "create_exp",
            "create_exp2",
            "create_log",
            "create_log2",
            "create_sqrt",
            "create_precise_sqrt",
            "create_rsqrt",
            "create_floor",
            "create_ceil",
            "create_erf",
            *(f"create_fcmp{order}{relation}" for order in "OU" for relation in _RELATIONS),
        )
    },
    "create_fma": 2,
    "create_dot": 2,
}


def _is_bf16(value) -> bool:
    # bf16 lives in uint16 arrays; the cheapest test first (every float op passes here).
    return (
        type(value) is _interpreter.TensorHandle
        and value.data.dtype == np.uint16
        and value.dtype.scalar.is_bf16()
    )


def _widened(value):
    import triton.language as tl

    return _interpreter.TensorHandle(_bf16_to_float(value.data), tl.float32) if _is_bf16(value) else value


def _computing_in_fp32(original, result_from: int):
    def method(self, *args):
        for arg in args:
            if _is_bf16(arg):
                break
        else:
            return original(self, *args)
        result = original(self, *(_widened(arg) for arg in args))
        source = args[result_from]
        if not _is_bf16(source):
            return result
        if result.data.dtype == np.float32:  # a value: round it back to bf16
            return _interpreter.TensorHandle(_float_to_bf16(result.data), source.dtype.scalar)
        return _interpreter.TensorHandle(result.data, source.dtype.scalar)  # a comparison's booleans

    method._iris_fixed = True
    return method


def _bf16_tensor(tensor):
    # A reduction's or scan's fp32 result as the bf16 tensor of the same shape.
    import triton.language as tl

    kind = tl.block_type(tl.bfloat16, tensor.type.shape) if tensor.type.is_block() else tl.bfloat16
    bits = _float_to_bf16(np.asarray(tensor.handle.data))
    return tl.core.tensor(_interpreter.TensorHandle(bits, tl.bfloat16), kind)


def _reducing_in_fp32(original):
    def method(self, input, *args, **kwargs):
        value = input[0] if isinstance(input, tuple) else input
        if not _is_bf16(value.handle):
            return original(self, input, *args, **kwargs)
        import triton.language as tl

        wide = self.to_tensor(_bf16_to_float(value.handle.data), tl.float32)
        result = original(self, (wide, *input[1:]) if isinstance(input, tuple) else wide, *args, **kwargs)
        if isinstance(result, list):  # scans
            return [_bf16_tensor(item) for item in result]
        if isinstance(result, tuple):  # (value, index)
            return (_bf16_tensor(result[0]), *result[1:])
        return _bf16_tensor(result)

    method._iris_fixed = True
    return method


def _casting_through_fp32(original):
    def cast_impl(self, src, dst_type):

        source, target = src.dtype.scalar, dst_type.scalar
        if source == target or not (source.is_bf16() or target.is_bf16()):
            return original(self, src, dst_type)
        if source.is_bf16():
            return original(self, _widened(src), dst_type)
        # Any value to bf16 through fp32, rounded to nearest even (the interpreter truncated).
        return _interpreter.TensorHandle(_float_to_bf16(src.data.astype(np.float32)), target)

    cast_impl._iris_fixed = True
    return cast_impl


def _patch_bf16_arithmetic() -> None:
    builder = _interpreter.InterpreterBuilder
    if getattr(builder.cast_impl, "_iris_fixed", False):
        return
    for name, result_from in _BF16_FLOAT_OPS.items():
        original = getattr(builder, name, None)
        if original is not None:
            setattr(builder, name, _computing_in_fp32(original, result_from))
    builder.cast_impl = _casting_through_fp32(builder.cast_impl)
    reductions = {_interpreter.ReduceOps: ("sum", "min_max"), _interpreter.ScanOps: ("cumsum", "cumprod")}
    for cls, names in reductions.items():
        for name in names:
            original = getattr(cls, name, None)
            if original is not None:
                setattr(cls, name, _reducing_in_fp32(original))


def _combine_pairwise(self, input):
    # tl.reduce's generic path: neighbouring elements along the axis combined a whole array
    # at a time until one is left (element i with i + 1, results in order, so an associative
    # function gives what the element-by-element loop gives, up to rounding).
    import triton.language as tl

    original_axis = self.axis
    input, axis = self.unravel(input, self.axis)
    dtypes = [arg.dtype for arg in input]
    data = [np.asarray(arg.handle.data) for arg in input]
    rank = data[0].ndim
    while data[0].shape[axis] > 1:
        count = data[0].shape[axis]
        firsts, seconds = np.arange(0, count - 1, 2), np.arange(1, count, 2)
        left = [self.to_tensor(np.take(d, firsts, axis=axis), t) for d, t in zip(data, dtypes)]
        right = [self.to_tensor(np.take(d, seconds, axis=axis), t) for d, t in zip(data, dtypes)]
        combined = self.combine_fn.fn(*left, *right)
        combined = combined if isinstance(combined, tuple) else (combined,)
        shape = left[0].handle.data.shape
        merged = [
            np.broadcast_to(np.asarray(c.handle.data if isinstance(c, tl.core.tensor) else c), shape).astype(
                d.dtype
            )
            for c, d in zip(combined, data)
        ]
        if count % 2:  # the odd one out goes on to the next round as it is
            merged = [
                np.concatenate([m, np.take(d, [count - 1], axis=axis)], axis=axis)
                for m, d in zip(merged, data)
            ]
        data = merged
    results = []
    for values, dtype in zip(data, dtypes):
        values = np.take(values, 0, axis=axis)
        if self.keep_dims:
            for _ in range(1 if original_axis is not None else rank):
                values = np.expand_dims(values, axis if original_axis is not None else 0)
        elif original_axis is None:
            values = values.item()
        results.append(self.to_tensor(values, dtype))
    return results


def _reducing_pairwise(original):
    def generic_reduce(self, input):
        arrays = input if isinstance(input, tuple) else (input,)
        if any(np.asarray(a.handle.data).size == 0 for a in arrays):
            return original(self, input)
        try:
            return _combine_pairwise(self, input)
        except Exception:  # noqa: BLE001 - a combine function that takes only scalars
            return original(self, input)

    generic_reduce._iris_fixed = True
    return generic_reduce


def _patch_generic_reduce() -> None:
    cls = _interpreter.ReduceOps
    if not getattr(cls.generic_reduce, "_iris_fixed", False):
        cls.generic_reduce = _reducing_pairwise(cls.generic_reduce)


_applied = False


def _patch_unread_overflow_checks() -> None:
    builder = _interpreter.interpreter_builder
    if builder.options.sanitize_overflow and not builder.options.debug:
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


def _patch_element_type_lookup() -> None:
    original = _interpreter._get_np_dtype
    if getattr(original, "_iris_fixed", False):
        return
    by_name: dict = {}

    def get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, tl.pointer_type):
            return _ADDRESS
        found = by_name.get(tt_dtype.name)
        if found is None:
            found = by_name[tt_dtype.name] = original(tt_dtype)
        return found

    get_np_dtype._iris_fixed = True
    _interpreter._get_np_dtype = get_np_dtype


_ADDRESS = np.dtype(np.uint64)


def finish_aggregate(value_cls, cls) -> None:
    """Attach ``cls``'s methods to its aggregate ``value_cls`` where the interpreter runs (else nothing)."""
    if not _applied:
        return
    for name, member in vars(cls).items():
        if isinstance(member, staticmethod):
            setattr(value_cls, name, member)
        elif callable(member) and not name.startswith("__"):
            setattr(value_cls, name, _as_method(member))


def _as_method(interpreted):
    def method(self, *args, **kwargs):
        return interpreted(self, *args, **kwargs)

    return method


def _refuse_gluon_launches() -> None:
    try:
        from triton.experimental.gluon._runtime import GluonJITFunction
    except ImportError:
        return
    if getattr(GluonJITFunction.run, "_iris_refuses", False):
        return

    def run(self, *args, **kwargs):
        raise RuntimeError(
            f"iris: Gluon kernel {self.fn.__name__!r} cannot run under the emulation backend: "
            "Triton's interpreter runs @triton.jit kernels only; run it with IRIS_BACKEND=cuda on a GPU"
        )

    run._iris_refuses = True
    GluonJITFunction.run = run


def apply() -> None:
    """Install every fix once per process."""
    global _applied
    _applied = True
    _patch_numpy_index()
    _patch_jit_functions()
    _patch_launch_hooks()
    _patch_language_once_per_launch()
    _patch_bf16_constants()
    _patch_bf16_arithmetic()
    _patch_float_exchange()
    _patch_generic_reduce()
    _patch_unread_overflow_checks()
    _patch_element_type_lookup()
    _refuse_gluon_launches()
