"""Everything about checkpoint folders, for every family (docs/checkpoint.md):

contract.py        what all folders share: CheckpointError, file names, the Linear-layout rule, shape comparison
safetensors_io.py  the one safetensors reader (headers, row ranges by pread) and the streaming shard writer
folder.py          CheckpointFolder (config and headers read once, passed along) and write_checkpoint_folder
fsutil.py          output folders that appear whole or not at all, read-only views of input folders
load.py            checkpoint tensors into a built Paddle model (tensor-parallel ranks, export reference models)
tp_shards.py       tensor-parallel sharded save and the merge back into a single-device folder

Each family's tensor names and shapes are declared in its own folder (paddle_vha/{qwen3,vha,mea,shared_kv}/spec.py);
validation of a folder against them: paddle_vha/spec/validate.py (through the registry: family_of(path).validate(path)).
"""
from .contract import CheckpointError
from .folder import CheckpointFolder

__all__ = ["CheckpointError", "CheckpointFolder"]
