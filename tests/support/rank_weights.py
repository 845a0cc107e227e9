"""A custom hook (loaded by path in tests) that saves every rank's final weights (or
those of one of ``state.extra_models``: ``extra='ema'``)."""

from safetensors.torch import save_file

from largebatch.engine.hook import Hook


class SaveRankWeights(Hook):
    def __init__(self, prefix: str = "rank", extra: str | None = None):
        super().__init__()
        self.prefix = prefix
        self.extra = extra

    def after_run(self, state):
        model = state.run.model if self.extra is None else state.extra_models[self.extra]
        tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        save_file(tensors, str(state.run.run_dir / f"{self.prefix}{state.run.rank}.safetensors"))
