"""The 8-bit compressions decode under NumPy 2, without bitsandbytes, in hivemind's own wire format."""

import numpy as np
import pytest
import torch
from hivemind.compression import CompressionInfo
from hivemind.compression.quantization import Quantile8BitQuantization, Uniform8BitQuantization
from hivemind.compression.serialization import deserialize_torch_tensor, serialize_torch_tensor
from hivemind.proto import runtime_pb2

from swarmd.swarm.compression import make_compression
from swarmd.swarm.upstream.quantization import BLOCK_SIZE, Blockwise8Bit, Quantile8Bit, Uniform8Bit, register_fixed_quantizers

WIRE_TYPES = {"uint8": runtime_pb2.UNIFORM_8BIT, "quantile8": runtime_pb2.QUANTILE_8BIT,
              "blockwise8": runtime_pb2.BLOCKWISE_8BIT}
# relative L2 error of one round trip on N(0, s^2) values; a codec off by one bin, or scaled wrong, misses these
RELATIVE_L2_BOUND = {"uint8": 0.02, "quantile8": 0.04, "blockwise8": 0.02}
# worst error within +-2.5 sigma, in sigmas: uint8 one bin of 6/256; blockwise half a top-decade code step (1/128) of
# max|x| ~ 4.5 sigma; quantile8's outer bins are wide (each holds 1/256 of the values, out to the maximum)
MAX_ERROR_IN_SIGMAS = {"uint8": 0.025, "quantile8": 0.4, "blockwise8": 0.04}


def _gaussian(scale: float, n: int = 3 * BLOCK_SIZE + 123, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * scale


def _round_trip(codec, tensor):
    return codec.extract(codec.compress(tensor, CompressionInfo.from_tensor(tensor)))


def _relative_l2(actual, expected) -> float:
    return float((actual.float() - expected.float()).norm() / expected.float().norm())


@pytest.mark.parametrize("name", sorted(WIRE_TYPES))
@pytest.mark.parametrize("scale", [1e-6, 1e-2, 10.0])
def test_round_trip_error_is_that_of_eight_bits(name, scale):
    codec = make_compression(name, "swarm.grad_compression")
    x = _gaussian(scale).reshape(-1, 1)
    y = _round_trip(codec, x)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert _relative_l2(y, x) < RELATIVE_L2_BOUND[name]
    # uint8's edge bins hold the clipped tails (beyond ~3 sigma) and decode to their mean: outside this test
    inside = x.abs() < 2.5 * scale
    assert float((y - x)[inside].abs().max()) < MAX_ERROR_IN_SIGMAS[name] * scale


@pytest.mark.parametrize("name", sorted(WIRE_TYPES))
def test_a_receiving_peer_decodes_through_hiveminds_table(name):
    """The averager deserializes by the message's type, and encodes the averaged part it returns the same way."""
    make_compression("fp16", "swarm.grad_compression")  # any peer registers the decoders, whatever it sends
    x = _gaussian(0.1)
    message = serialize_torch_tensor(x, WIRE_TYPES[name])
    assert message.compression == WIRE_TYPES[name]
    assert _relative_l2(deserialize_torch_tensor(message), x) < RELATIVE_L2_BOUND[name]


@pytest.mark.parametrize("ours, upstream", [(Uniform8Bit, Uniform8BitQuantization),
                                            (Quantile8Bit, Quantile8BitQuantization)])
def test_codebook_types_send_upstreams_bytes_and_decode_them(ours, upstream):
    x = _gaussian(1.0)
    info = CompressionInfo.from_tensor(x)
    upstream_message = upstream().compress(x, info)
    assert ours().compress(x, info).buffer == upstream_message.buffer
    # upstream's layout read by hand: int64 length, float32 codebook, uint8 indices
    buffer = upstream_message.buffer
    length = int(np.frombuffer(buffer, count=1, dtype=np.int64)[0])
    codebook = np.frombuffer(buffer, offset=8, count=length, dtype=np.float32)
    indices = np.frombuffer(buffer, offset=8 + 4 * length, dtype=np.uint8)
    assert torch.equal(ours().extract(upstream_message), torch.as_tensor(codebook[indices.astype(np.int64)]))


def test_blockwise_wire_layout_is_hiveminds():
    x = _gaussian(1.0, n=2 * BLOCK_SIZE + 5)
    x[BLOCK_SIZE:2 * BLOCK_SIZE] *= 1e-3
    message = Blockwise8Bit().compress(x, CompressionInfo.from_tensor(x))
    buffer = message.buffer
    absmax_count, code_count = np.frombuffer(buffer, count=2, dtype=np.int64)
    assert (absmax_count, code_count) == (3, 256)
    absmax = np.frombuffer(buffer, offset=16, count=3, dtype=np.float32)
    code = np.frombuffer(buffer, offset=16 + 12, count=256, dtype=np.float32)
    indices = np.frombuffer(buffer, offset=16 + 12 + 1024, dtype=np.uint8)
    assert len(buffer) == 16 + 12 + 1024 + x.numel()
    blocks = x.split(BLOCK_SIZE)
    assert np.allclose(absmax, [float(b.abs().max()) for b in blocks])
    assert np.all(np.diff(code) > 0) and code[0] < -0.99 and code[-1] == 1.0
    by_hand = torch.as_tensor(code[indices.astype(np.int64)] * np.repeat(absmax, BLOCK_SIZE)[: x.numel()])
    assert torch.equal(Blockwise8Bit().extract(message), by_hand)


def test_blockwise_codes_are_the_nearest_ones_up_to_one_grid_step():
    """The lookup table (quantization.nearest_code_table) picks what a search among the codes would: the nearest
    code, or, for a value within one grid step of a midpoint between two codes, either of the two."""
    from swarmd.swarm.upstream.quantization import LOOKUP_STEPS, signed_dynamic_codebook

    code = signed_dynamic_codebook()
    midpoints = (code[:-1] + code[1:]) / 2
    near_zero = torch.randn(20000, generator=torch.Generator().manual_seed(1)) * 1e-5  # the densest codes
    x = torch.cat([_gaussian(1.0, n=BLOCK_SIZE), near_zero, torch.tensor([-1.0, 0.0, 1.0]), midpoints])
    x[:BLOCK_SIZE] /= x[:BLOCK_SIZE].abs().max()  # in [-1, 1] already: absmax 1 for the first block
    x[-midpoints.numel():] += 1e-4 * torch.linspace(-1, 1, midpoints.numel())  # beside each midpoint
    x[BLOCK_SIZE - 1] = 1.0  # so that every block's scale is 1 and the codes apply to x as it is
    for block in range(x.numel() // BLOCK_SIZE + 1):
        x[min(block * BLOCK_SIZE, x.numel() - 1)] = 1.0
    indices, (absmax, _) = Blockwise8Bit().quantize(x)
    assert np.all(absmax == 1.0)
    got = code[torch.as_tensor(indices, dtype=torch.int64)]
    exact = code[torch.bucketize(x, midpoints)]
    grid_step = 2.0 / LOOKUP_STEPS
    assert torch.all((got - x).abs() - (exact - x).abs() <= grid_step)
    differ = got != exact
    assert differ[:BLOCK_SIZE].float().mean() < 1e-3  # N(0, 1) values: hardly any; near 0 the codes are denser
    assert torch.all((x[differ][:, None] - midpoints[None, :]).abs().min(dim=1).values <= grid_step)


def test_blockwise_keeps_small_blocks_next_to_large_ones():
    """One scale per block: a block of tiny values beside a block of large ones keeps its precision."""
    x = _gaussian(1.0, n=4 * BLOCK_SIZE)
    scales = torch.tensor([1e2, 1e-4, 1.0, 1e-7]).repeat_interleave(BLOCK_SIZE)
    x = x * scales
    y = _round_trip(Blockwise8Bit(), x)
    for block_x, block_y in zip(x.split(BLOCK_SIZE), y.split(BLOCK_SIZE)):
        assert _relative_l2(block_y, block_x) < 0.02


@pytest.mark.parametrize("name", sorted(WIRE_TYPES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_tensors_come_back_in_their_dtype(name, dtype):
    codec = make_compression(name, "swarm.grad_compression")
    x = _gaussian(0.5).to(dtype)
    y = _round_trip(codec, x)
    assert y.dtype == dtype
    assert _relative_l2(y, x) < RELATIVE_L2_BOUND[name] + 0.01


@pytest.mark.parametrize("name", sorted(WIRE_TYPES))
def test_zero_and_tiny_tensors_round_trip_without_nan(name):
    codec = make_compression(name, "swarm.grad_compression")
    assert torch.equal(_round_trip(codec, torch.zeros(7, 3)), torch.zeros(7, 3))
    single = torch.tensor([0.25])
    assert torch.allclose(_round_trip(codec, single), single, rtol=0.02)


def test_blockwise_matches_bitsandbytes_when_installed():
    """Where bitsandbytes is importable: same codebook, and each side decodes the other's messages."""
    functional = pytest.importorskip("bitsandbytes.functional")
    from hivemind.compression.quantization import BlockwiseQuantization

    register_fixed_quantizers()
    x = _gaussian(0.3, n=3 * BLOCK_SIZE + 77)
    info = CompressionInfo.from_tensor(x)
    assert torch.equal(torch.as_tensor(Blockwise8Bit().quantize(x)[1][1]), functional.create_dynamic_map(signed=True))
    from_bnb = BlockwiseQuantization().compress(x, info)
    indices, state = functional.quantize_blockwise(x, blocksize=BLOCK_SIZE, nested=False)
    expected = functional.dequantize_blockwise(indices, absmax=state.absmax, code=state.code, blocksize=BLOCK_SIZE)
    assert torch.equal(Blockwise8Bit().extract(from_bnb), expected)
    ours = Blockwise8Bit().compress(x, info)
    q = torch.as_tensor(np.frombuffer(ours.buffer, offset=16 + 4 * 4 + 1024, dtype=np.uint8))
    absmax = torch.as_tensor(np.frombuffer(ours.buffer, offset=16, count=4, dtype=np.float32))
    decoded_by_bnb = functional.dequantize_blockwise(q, absmax=absmax, code=state.code, blocksize=BLOCK_SIZE)
    assert torch.equal(decoded_by_bnb, Blockwise8Bit().extract(ours))
    # ours rounds to the nearest code; bitsandbytes' CPU kernel differs on a few values next to a midpoint
    assert float((q != indices).float().mean()) < 0.01
