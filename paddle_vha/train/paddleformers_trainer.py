"""PaddleFormers' trainer package as the training glue uses it, imported once with this environment's work-around.

PaddleFormers' Trainer imports Hugging Face `datasets` when it is installed; `_hf_datasets_importable` runs before
`paddleformers.trainer` is first imported (see its docstring). arguments.py, callbacks.py and trainer.py import
PaddleFormers' trainer and LLM-config names from here.
"""
from __future__ import annotations


def _hf_datasets_importable() -> bool:
    """PaddleFormers' Trainer imports Hugging Face `datasets` when it is installed, only to special-case
    datasets.Dataset inputs (which this tool never passes). In the pinned environment `import datasets` fails
    (pyarrow 26.0.1 needs NumPy >= 2, numpy is pinned to 1.26.4); then that optional integration is switched off
    instead of failing the import. Once the pins agree, nothing here changes anything."""
    try:
        import datasets  # noqa: F401
    except ImportError:
        import paddleformers.utils.import_utils as iu

        iu.is_datasets_available = lambda: False
        return False
    return True


HF_DATASETS_OK = _hf_datasets_importable()

from paddleformers.trainer import (  # noqa: E402
    PdArgumentParser,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    get_last_checkpoint,
    set_seed,
)
from paddleformers.transformers.configuration_utils import LlmMetaConfig, llmmetaclass  # noqa: E402

__all__ = ["HF_DATASETS_OK", "PdArgumentParser", "Trainer", "TrainerCallback", "TrainingArguments",
           "get_last_checkpoint", "set_seed", "LlmMetaConfig", "llmmetaclass"]
