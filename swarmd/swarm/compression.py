"""Config names -> hivemind compression objects."""

from __future__ import annotations

from swarmd.errors import ConfigError

__all__ = ["make_compression"]


def make_compression(name: str, field: str):
    import hivemind.compression as hc
    import numpy

    if name == "none":
        return hc.NoCompression()
    if name == "fp16":
        return hc.Float16Compression()
    if name == "scaled-fp16":
        return hc.ScaledFloat16Compression()
    if name in ("uint8", "quantile8"):
        if int(numpy.__version__.split(".")[0]) >= 2:
            raise ConfigError(
                f"{field}: {name} fails to decode with NumPy 2 in hivemind 1.1.12 (fixed upstream after that tag); "
                "use fp16 or scaled-fp16, or install numpy<2"
            )
        return hc.Uniform8BitQuantization() if name == "uint8" else hc.Quantile8BitQuantization()
    if name == "blockwise8":
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            raise ConfigError(f"{field}: blockwise8 needs the bitsandbytes package; pip install bitsandbytes") from None
        return hc.BlockwiseQuantization()
    raise ConfigError(f"{field}: unknown compression {name!r}")
