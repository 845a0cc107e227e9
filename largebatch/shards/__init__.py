"""The offline shard tools: ``largebatch data convert | index | verify``.

``convert`` writes TFRecord shards of the ImageNet schema from an image folder or
Fashion-MNIST, ``verify`` indexes TFRecord files and checks every record of a split,
``records`` writes records, index files and Examples, ``pool`` runs one job per shard in
worker processes, and ``cli`` is the ``largebatch data`` command line.

They read shards through the loaders' own readers (``largebatch.data.tfrecord``,
``largebatch.data.example``), so a shard they write or pass is one the loaders read. The
runtime (launch, the engine, the loaders) never imports this package; only the command line,
``data/prepare_fmnist.py`` and the benches do.
"""

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist
