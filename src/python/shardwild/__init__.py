"""Shardwild from Python: train, evaluate and predict with Shardwild's jobs, and
use its shared-memory parameter store and its task dispatcher from your own
training loop (PyTorch or anything else).

    import shardwild
    cfg = shardwild.load_config("configs/fashion_mnist_mlp.yaml", overrides={"train.epochs": 2})
    summary = shardwild.train(cfg)          # the same dict as `shardwild train --json`
    probs = shardwild.predict(cfg, "ckpts", images)

Every error is a shardwild.Error (ConfigError, DataError, CheckpointError,
StoreError) whose message is the command line's one line.
"""
from ._shardwild import (  # noqa: F401
    __version__,
    Error,
    ConfigError,
    DataError,
    CheckpointError,
    StoreError,
    Config,
    load_config,
    train,
    evaluate,
    predict,
    load_checkpoint,
    Store,
    Dispatcher,
    Task,
)
