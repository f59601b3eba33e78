"""A TorchTitan 0.3.0 config registry for Qwen3-235B-A22B (chapter 26).

TorchTitan ships the model (`model_registry("235B-A22B")`) but no training
recipe for it. `qwen3_235b_a22b` takes TorchTitan's own Qwen3-30B-A3B
recipe and swaps in the 235B model and its vocabulary; everything a plan
decides comes from command-line flags. Run with the TorchTitan venv's
Python, with this folder on the path:

    python -m torchtitan.train --module qwen3_235b --config qwen3_235b_a22b
"""

from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.qwen3 import model_registry
from torchtitan.models.qwen3.config_registry import qwen3_30b_a3b
from torchtitan.trainer import Trainer


def qwen3_235b_a22b() -> Trainer.Config:
    """TorchTitan's Qwen3-30B-A3B recipe with the 235B-A22B model."""
    config = qwen3_30b_a3b()
    config.model_spec = model_registry("235B-A22B")
    config.loss = ChunkedLossWrapper.Config(
        loss_fn=CrossEntropyLoss.Config(
            global_vocab_size=decoder_vocab_size(config.model_spec),
        ),
    )
    config.hf_assets_path = "./assets/hf/Qwen3-235B-A22B"
    return config
