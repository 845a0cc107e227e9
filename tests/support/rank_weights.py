"""A custom hook (loaded by path in tests) that saves every rank's final weights."""

from safetensors.torch import save_file

from largebatch.engine.hook import Hook


class SaveRankWeights(Hook):
    def __init__(self, prefix: str = "rank"):
        super().__init__()
        self.prefix = prefix

    def after_run(self, state):
        tensors = {k: v.detach().contiguous() for k, v in state.model.state_dict().items()}
        save_file(tensors, str(state.run_dir / f"{self.prefix}{state.rank}.safetensors"))
