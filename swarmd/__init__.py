"""swarmd: a swarm peer daemon for decentralized deep-learning training on hivemind.

Importing this package is cheap on purpose: torch, hivemind, timm and transformers are imported only by the
modules that train, so `swarmd --help` and `swarmd status` answer instantly.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
