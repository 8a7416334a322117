"""Config names -> hivemind compression objects."""

from __future__ import annotations

from swarmd.errors import ConfigError

__all__ = ["make_compression"]


def make_compression(name: str, field: str):
    import hivemind.compression as hc

    from swarmd.swarm.upstream.quantization import Blockwise8Bit, Quantile8Bit, Uniform8Bit, register_fixed_quantizers

    # whatever this peer sends, it must decode the 8-bit parts other peers send (before the averagers fork)
    register_fixed_quantizers()
    if name == "none":
        return hc.NoCompression()
    if name == "fp16":
        return hc.Float16Compression()
    if name == "scaled-fp16":
        return hc.ScaledFloat16Compression()
    if name == "uint8":
        return Uniform8Bit()
    if name == "quantile8":
        return Quantile8Bit()
    if name == "blockwise8":
        return Blockwise8Bit()
    raise ConfigError(f"{field}: unknown compression {name!r}")
