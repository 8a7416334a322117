"""Error of each wire compression against fp32, bytes per value, and codec time.

For every `swarm.*_compression` name: one encode/decode round trip through swarmd's codec (the classes hivemind's
averager uses, swarm/upstream/quantization.py for the 8-bit ones) on
- N(0, s^2) tensors of 1M values at scales s = 1e-4, 1, 1e2 (the worst of the three is shown: the 8-bit codecs
  scale with the data, fp16 loses more in its subnormal range and at large magnitudes),
- the gradients of the micro Swin (the default task; 0.54M parameters in 50 tensors) on one batch of 32 random
  images, each tensor compressed on its own as hivemind does (its parts are at most 2^19 bytes, larger than any
  tensor of this model),
and what a 2-peer all-reduce hands back: the reducer averages its own exact part with the other peer's decoded
part and returns the difference, encoded again (hivemind's allreduce.py); the error is that of the receiving
peer's result against the exact fp32 mean of both peers' gradients (two batches).

Columns: bytes/value = message payload bytes per fp32 value (codebooks and block scales included); relative L2 =
|decoded - x| / |x|; max err = max |decoded - x| divided by the tensor's std (randn) or by each gradient
tensor's max |g| (worst tensor shown); ms/1M = encode + decode time per million values.

    python benchmarks/compression_error.py          # about a minute on 2 cores
"""

from __future__ import annotations

import time

from common import machine, print_table

NAMES = ("none", "fp16", "scaled-fp16", "uint8", "quantile8", "blockwise8")
SCALES = (1e-4, 1.0, 1e2)


def round_trip(codec, tensor):
    from hivemind.compression import CompressionInfo

    message = codec.compress(tensor, CompressionInfo.from_tensor(tensor))
    return codec.extract(message).float(), len(message.buffer)


def relative_l2(actual, expected) -> float:
    return float((actual - expected).norm() / expected.norm())


def swin_gradients(seed: int):
    import torch

    from swarmd.tasks.swin import SwinModelConfig
    from swarmd.tasks.swin.model import build_swin

    torch.manual_seed(0)  # the same model for every batch
    model = build_swin(SwinModelConfig(), num_classes=10, device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(32, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (32,), generator=generator)
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def gaussian_errors(codec) -> tuple[float, float, float, float]:
    """Worst relative L2 and max error (in std) over the scales, bytes per value, ms per 1M values."""
    import torch

    l2, worst, seconds, size = 0.0, 0.0, 0.0, 0
    for scale in SCALES:
        x = torch.randn(1_000_000, generator=torch.Generator().manual_seed(1)) * scale
        began = time.perf_counter()
        y, size = round_trip(codec, x)
        seconds += time.perf_counter() - began
        l2 = max(l2, relative_l2(y, x))
        worst = max(worst, float((y - x).abs().max()) / scale)
    return l2, worst, size / 1_000_000, 1000 * seconds / len(SCALES)


def gradient_errors(codec, grads) -> tuple[float, float]:
    import torch

    decoded = [round_trip(codec, g)[0] for g in grads]
    l2 = relative_l2(torch.cat([d.flatten() for d in decoded]), torch.cat([g.flatten() for g in grads]))
    worst = max(float((d - g).abs().max() / g.abs().max().clamp(min=1e-30)) for d, g in zip(decoded, grads))
    return l2, worst


def two_peer_average_error(codec, mine, theirs) -> float:
    """What the non-reducing peer holds after one all-reduce, against the exact mean."""
    import torch

    results, exact = [], []
    for own, other in zip(theirs, mine):  # the reducer holds `mine`, this peer holds `theirs`
        received = round_trip(codec, own)[0]
        averaged = (other + received) / 2
        results.append(own + round_trip(codec, averaged - own)[0])
        exact.append((other + own) / 2)
    return relative_l2(torch.cat([r.flatten() for r in results]), torch.cat([e.flatten() for e in exact]))


def main() -> None:
    import torch

    from swarmd.swarm.compression import make_compression

    torch.set_num_threads(1)
    grads_a, grads_b = swin_gradients(seed=1), swin_gradients(seed=2)
    values = sum(g.numel() for g in grads_a)
    rows = []
    for name in NAMES:
        codec = make_compression(name, "benchmark")
        gauss_l2, gauss_max, bytes_per_value, ms = gaussian_errors(codec)
        grad_l2, grad_max = gradient_errors(codec, grads_a)
        average_l2 = two_peer_average_error(codec, grads_a, grads_b)
        rows.append([
            name, f"{bytes_per_value:.3f}", f"{gauss_l2:.2e}", f"{gauss_max:.3f}",
            f"{grad_l2:.2e}", f"{grad_max:.3f}", f"{average_l2:.2e}", f"{ms:.0f}",
        ])
    print_table(
        f"Wire compression vs fp32: N(0, s^2) x 1M at s = {', '.join(map(str, SCALES))}; micro Swin gradients "
        f"({values / 1e6:.2f}M values in {len(grads_a)} tensors)\n{machine()}",
        ["compression", "bytes/value", "randn rel L2", "randn max err/std", "grads rel L2", "grads max err/max|g|",
         "2-peer mean rel L2", "ms/1M"],
        rows,
    )


if __name__ == "__main__":
    main()
