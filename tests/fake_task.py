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
