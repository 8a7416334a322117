"""swarmd's hivemind subclasses answer under upstream's RPC names, so peers that are not swarmd interoperate."""

from __future__ import annotations

__all__ = ["UpstreamRpcNames"]


class UpstreamRpcNames:
    """hivemind names RPC handlers after the servicer's class (`TrainingStateAverager.rpc_download_state`), so a
    subclass would speak a protocol no other peer answers: not plain hivemind peers, nor swarmd peers that use
    the upstream class (e.g. with the gradient guard off). Subclasses keep their parent's names (`_upstream`)."""

    _upstream: type

    @classmethod
    def _get_handle_name(cls, namespace, method_name):
        return cls._upstream._get_handle_name(namespace, method_name)
