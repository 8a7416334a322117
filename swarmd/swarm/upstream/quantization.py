"""hivemind's 8-bit wire formats, decodable under NumPy 2 and without bitsandbytes.

hivemind 1.1.12 reads the codebook length with `int(np.frombuffer(buffer, count=1))`, which NumPy 2 refuses
(a 1-element array is not a scalar; fixed upstream after the tag), so every UNIFORM_8BIT, QUANTILE_8BIT and
BLOCKWISE_8BIT message fails to decode; BLOCKWISE_8BIT also needs bitsandbytes on both ends. The classes here keep
the bytes on the wire exactly as upstream writes them, so plain hivemind peers with a working NumPy (and
bitsandbytes, for blockwise) decode what we send and we decode what they send:

- UNIFORM_8BIT / QUANTILE_8BIT: int64 codebook length, float32 codebook, one uint8 index per value;
  encoding is upstream's own, only the decoding is fixed.
- BLOCKWISE_8BIT: int64 absmax count, int64 codebook length, float32 absmax per block of 4096 values,
  float32 codebook (bitsandbytes' signed dynamic map), one uint8 index per value; value = codebook[index] x absmax
  of its block. Both directions are plain torch here, the same arithmetic as bitsandbytes' reference kernel.

A receiving peer picks the decoder by the message's compression type from hivemind's table
(`hivemind.compression.serialization._BASE_COMPRESSION_TYPES`), and the all-reduce also encodes the averaged
part it sends back through that table, so `register_fixed_quantizers()` puts these classes into it. It must run in
the daemon before the averagers fork (their processes inherit the table), whatever this peer's own compression:
a peer on fp16 still decodes the parts of a peer on uint8.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from hivemind.compression.quantization import (
    BlockwiseQuantization,
    Quantile8BitQuantization,
    Quantization,
    Uniform8BitQuantization,
)
from hivemind.proto import runtime_pb2

from swarmd.swarm.upstream.process_patches import register_codecs

__all__ = ["Blockwise8Bit", "Quantile8Bit", "Uniform8Bit", "register_fixed_quantizers"]

BLOCK_SIZE = 4096  # hivemind's _BLOCKWISE_QUANTIZATION_BLOCKSIZE: part of the wire format (absmax per block)


def _int64_at(buffer: bytes, offset: int) -> int:
    return int(np.frombuffer(buffer, offset=offset, count=1, dtype=np.int64)[0])


class _CodebookDecoding(Quantization):
    """upstream's `Quantization.extract`, reading the codebook length as a scalar."""

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        buffer = serialized_tensor.buffer
        codebook_size = _int64_at(buffer, 0)
        codebook = np.frombuffer(buffer, offset=8, count=codebook_size, dtype=self.codebook_dtype)
        indices = np.frombuffer(buffer, offset=8 + codebook.nbytes, dtype=self.indices_dtype)
        indices = torch.as_tensor(indices, dtype=torch.int64).reshape(tuple(serialized_tensor.size))
        codebook = torch.as_tensor(codebook).to(dtype=getattr(torch, serialized_tensor.dtype))
        return codebook[indices].requires_grad_(serialized_tensor.requires_grad)


class Uniform8Bit(_CodebookDecoding, Uniform8BitQuantization):
    """256 equal bins over mean +- 3 std; each bin decodes to the mean of the values that fell into it."""


class Quantile8Bit(_CodebookDecoding, Quantile8BitQuantization):
    """256 bins at the (approximate) quantiles of the values; each decodes to its values' mean."""


@functools.lru_cache(maxsize=1)
def signed_dynamic_codebook() -> torch.Tensor:
    """bitsandbytes' `create_dynamic_map(signed=True)`: 256 sorted float32 codes in [-1, 1], dense near 0.

    Each of 7 decades (1e-6..1e0) gets 2^i linearly spaced codes of each sign (i = 0..6), plus 0 and 1. Senders
    put their codebook on the wire, so receivers need not know it; it equals bitsandbytes' (a test checks it).
    """
    max_exponent_bits, non_sign_bits = 7, 7
    codes: list[float] = []
    for i in range(max_exponent_bits):
        count = 2 ** (i + non_sign_bits - max_exponent_bits) + 1
        boundaries = torch.linspace(0.1, 1, count, dtype=torch.float32)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        decade = 10 ** (-(max_exponent_bits - 1) + i)
        codes += (decade * means).tolist() + (-decade * means).tolist()
    codes += [0.0, 1.0]
    return torch.tensor(sorted(codes), dtype=torch.float32)


# A grid over [-1, 1] finer than the dynamic map's smallest gap between codes (5.5e-7): the nearest code of each grid
# point, looked up, replaces a binary search among the 255 midpoints per value (torch.bucketize: 59 of 68 ms per 1M
# values on one core, and a DiLoCo round encodes and decodes every value about twice, in the averager's process on
# the training's core: docs/PERFORMANCE.md section 9). A value within one grid step of a midpoint may get the other
# neighbour of the two: at most 2 / LOOKUP_STEPS (of its block's max |value|) more error, against the code gaps
# of up to 1.4e-2 that set the error.
LOOKUP_STEPS = 1 << 22


@functools.lru_cache(maxsize=1)
def nearest_code_table() -> torch.Tensor:
    """For grid point k (value -1 + 2k / LOOKUP_STEPS): the index of its nearest code, as uint8. 4 MB, built once
    per process on first use (0.1 s on this VM)."""
    code = signed_dynamic_codebook()
    midpoints = (code[:-1] + code[1:]) / 2
    grid = torch.linspace(-1.0, 1.0, LOOKUP_STEPS + 1, dtype=torch.float64).float()
    return torch.bucketize(grid, midpoints).to(torch.uint8)


class Blockwise8Bit(BlockwiseQuantization):
    """Per block of 4096 values: scale by the block's max |value|, round to the nearest dynamic-map code."""

    def quantize(self, tensor: torch.Tensor, allow_inplace: bool = False):
        flat = tensor.detach().reshape(-1).float()
        num_blocks = -(-flat.numel() // BLOCK_SIZE)
        # zero padding leaves each block's max |value| unchanged; the floor is bitsandbytes': 0/0 -> 0 for zero blocks
        blocks = torch.nn.functional.pad(flat, (0, num_blocks * BLOCK_SIZE - flat.numel())).view(num_blocks, BLOCK_SIZE)
        absmax = blocks.abs().amax(dim=1).clamp(min=1e-38)
        scaled = (blocks * (1.0 / absmax[:, None])).reshape(-1)[: flat.numel()].clamp_(-1, 1)
        # scaling by a power of two and rounding are exact in float32 (an offset of +1 first would not be near 0)
        grid_points = scaled.mul_(LOOKUP_STEPS / 2).round_().long().add_(LOOKUP_STEPS // 2)
        indices = nearest_code_table()[grid_points].reshape(tensor.shape)
        return indices.numpy(), (absmax.numpy(), signed_dynamic_codebook().numpy())

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        buffer = serialized_tensor.buffer
        absmax_size, codebook_size = _int64_at(buffer, 0), _int64_at(buffer, 8)
        absmax = np.frombuffer(buffer, offset=16, count=absmax_size, dtype=self.codebook_dtype)
        codebook = np.frombuffer(buffer, offset=16 + absmax.nbytes, count=codebook_size, dtype=self.codebook_dtype)
        indices = np.frombuffer(buffer, offset=16 + absmax.nbytes + codebook.nbytes, dtype=self.indices_dtype)
        values = torch.as_tensor(codebook)[torch.as_tensor(indices, dtype=torch.int64)]
        scales = torch.as_tensor(absmax).repeat_interleave(BLOCK_SIZE)[: values.numel()]
        result = (values * scales).reshape(tuple(serialized_tensor.size))
        return result.to(getattr(torch, serialized_tensor.dtype)).requires_grad_(serialized_tensor.requires_grad)


_FIXED = {
    "UNIFORM_8BIT": Uniform8Bit(),
    "QUANTILE_8BIT": Quantile8Bit(),
    "BLOCKWISE_8BIT": Blockwise8Bit(),
}


def register_fixed_quantizers() -> None:
    """Make hivemind encode and decode the 8-bit types with the classes above, in this process and its forks."""
    register_codecs(_FIXED)

