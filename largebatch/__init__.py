"""largebatch: large-batch pretraining of vision transformers on CPU, GPU and Habana HPU."""

__version__ = "0.1.0"
