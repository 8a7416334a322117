"""The least a task must be for the training worker (swarmd.worker.trainer.TrainingWorker) in unit tests that drive
it with a fake optimizer: a CPU context, no evaluation, and the same batch forever."""

from types import SimpleNamespace


class CpuTask:
    context = SimpleNamespace(device="cpu")
    eval_every_epochs = 0
    batch = None  # what train_batches yields, again and again

    def set_epoch(self, epoch):
        pass

    def train_batches(self, seed):
        while True:
            yield self.batch


class FakeOptimizer:
    """The least of a strategy's optimizer (swarm/strategies/protocol.py SwarmStrategy) that the worker reads between
    steps: epoch 0, no catch-up, one parameter group, no gradient averager, no download yet; `model`'s parameters
    are its state averager's. Subclasses say what `step` does."""

    local_epoch = 0
    catching_up = False
    grad_averager = None
    state_loads_total = 0

    def __init__(self, model, lr: float = 0.1):
        self.param_groups = [{"lr": lr}]
        self.state_averager = SimpleNamespace(main_parameters=list(model.parameters()))
