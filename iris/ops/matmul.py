"""The plain persistent GEMM ``C = A @ B`` as one prepared launch, the way the ops run it.

Where every matrix allows it (:func:`tma_compatible`, 16-bit inputs), the GEMM reads and writes
through tensor descriptors (:func:`iris.ops.gemm.matmul_tma_kernel`, Hopper's TMA copy
engine); otherwise it uses pointer loads with any strides
(:func:`iris.ops.gemm.matmul_kernel`). Tiles come from the :class:`FusedConfig`, the
flattened tile loop from :func:`iris.ops.config.flatten_tile_loop`. The bulk-synchronous
fused ops and ``benchmarks/gemm.py`` launch it from here, so the benchmark times what
the ops run.
"""

from __future__ import annotations

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ..host.prepared import PreparedLaunch
from .config import FusedConfig, descriptor_stages, flatten_tile_loop, gemm_launch_options
from .gemm import matmul_kernel, matmul_tma_kernel

#: Tensor descriptors address rows of 16-byte multiples from 16-byte aligned bases.
_TMA_ALIGN = 16


def tma_compatible(tensor: torch.Tensor) -> bool:
    """Whether a tensor descriptor can address the 2-D ``tensor``: unit inner stride, 16-byte aligned rows.

    Example:
        >>> tma_compatible(torch.empty(64, 256, dtype=torch.bfloat16))
        True
        >>> tma_compatible(torch.empty(256, 64, dtype=torch.bfloat16).t())   # column-major
        False
    """
    if tensor.dim() != 2 or tensor.stride(1) != 1 or tensor.shape[0] == 0 or tensor.shape[1] == 0:
        return False
    size = tensor.element_size()
    row_bytes = tensor.stride(0) * size if tensor.shape[0] > 1 else tensor.shape[1] * size
    return tensor.data_ptr() % _TMA_ALIGN == 0 and row_bytes % _TMA_ALIGN == 0


def _has_tensor_memory_accelerator(tensor: torch.Tensor) -> bool:
    # TMA arrived with Hopper (sm_90); the interpreter (CPU tensors) models descriptors itself.
    return not tensor.is_cuda or torch.cuda.get_device_capability(tensor.device)[0] >= 9


def matmul_launch(
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    config: FusedConfig,
    num_sms: int,
    heap_bases: torch.Tensor,
    *,
    tma: bool | None = None,
) -> PreparedLaunch:
    """``C = A @ B`` as a :class:`PreparedLaunch` of ``num_sms`` programs (fewer if there are fewer tiles).

    ``A`` is ``(M, K)``, ``B`` ``(K, N)``, ``C`` ``(M, N)``, of one dtype.

    Args:
        config: tiles, warps and stages (``block_m``, ``block_n``, ``block_k``, ``group_m``,
            ``num_warps``, ``num_stages``).
        heap_bases: the context's (``ctx.get_heap_bases()``): with tracing on, each tile is a
            ``gemm tile`` compute scope.
        tma: ``None`` (default) uses tensor descriptors for 16-bit inputs (bf16, fp16: what
            was measured) where :func:`tma_compatible` holds for all three matrices;
            ``False`` always uses pointer loads; ``True`` requires descriptors and raises
            ``ValueError`` where the inputs do not allow them.

    Example:
        >>> step = matmul_launch(a, b, c, gemm_config(M, N, K, 132), 132, ctx.get_heap_bases())
        >>> step()
    """
    M, K = A.shape
    N = B.shape[1]
    tiles = triton.cdiv(M, config.block_m) * triton.cdiv(N, config.block_n)
    grid = (max(1, min(num_sms, tiles)),)
    options = dict(gemm_launch_options(config), FLATTEN=flatten_tile_loop(config))
    usable = (
        A.element_size() == 2
        and all(tma_compatible(t) for t in (A, B, C))
        and _has_tensor_memory_accelerator(C)
    )
    if tma and not usable:
        raise ValueError(
            "iris.ops.matmul_launch: tma=True needs 16-bit inputs, unit inner strides, 16-byte "
            f"aligned rows and a Hopper GPU, got {A.dtype} with strides {A.stride()}, {B.stride()}, "
            f"{C.stride()} on {C.device}"
        )
    if usable and tma is not False:
        descriptors = (
            TensorDescriptor.from_tensor(A, [config.block_m, config.block_k]),
            TensorDescriptor.from_tensor(B, [config.block_k, config.block_n]),
            TensorDescriptor.from_tensor(C, [config.block_m, config.block_n]),
        )
        options["num_stages"] = descriptor_stages(config, A.element_size())
        return PreparedLaunch(matmul_tma_kernel, grid, (*descriptors, M, N, K, heap_bases), options)
    args = (A, B, C, M, N, K, *A.stride(), *B.stride(), *C.stride(), heap_bases)
    return PreparedLaunch(matmul_kernel, grid, args, dict(options, EVEN_K=K % config.block_k == 0))
