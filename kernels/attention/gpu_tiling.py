"""Tiles and the default launch of the GPU (Triton) attention kernels, without importing them.

    gpu_blocks(tq, tk, max_block=MAX_BLOCK) -> (block_q, block_k)
    MAX_BLOCK, NUM_WARPS, NUM_STAGES         the launch when the caller names none

The kernels (``gpu``) need Pallas's Triton backend, which JAX deprecates and will remove; what
sizes them must import without it.
"""

MAX_BLOCK = 64
NUM_WARPS, NUM_STAGES = 4, 2  # the launch when the caller names none


def gpu_blocks(tq: int, tk: int, max_block: int = MAX_BLOCK) -> tuple[int, int]:
    """(block_q, block_k): the largest power of two up to ``max_block`` dividing each padded
    length (ValueError below 16)."""

    def block(length: int) -> int:
        size = max_block
        while length % size:
            size //= 2
        if size < 16:
            raise ValueError(f"a GPU attention length must be a multiple of 16, got {length}")
        return size

    return block(tq), block(tk)


__all__ = ["MAX_BLOCK", "NUM_STAGES", "NUM_WARPS", "gpu_blocks"]
