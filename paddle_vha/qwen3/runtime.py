"""The runtime options every family's model classes refuse the same way (set by trainers after a config is built).

A family's config class mixes in `RuntimeSupport` and names, as class attributes, how messages call it, its error
class and why fused QKV and fleet's tensor-parallel layers do not fit it; `check_runtime_support` then raises one line:

* fuse_attention_qkv=True (the fused [q|k|v] layout is the stock one);
* tensor_model_parallel_size > 1 outside paddle_vha.parallel (fleet's mp layers split stock heads only);
* sequence_parallel=True outside paddle_vha.parallel (its plan applies it, docs/tensor_parallel.md).
"""
from __future__ import annotations

__all__ = ["RuntimeSupport"]


class RuntimeSupport:
    runtime_label = "Qwen3"  # "Qwen3-VHA"
    runtime_error = ValueError  # the family's config error class
    fused_qkv_reason = ""  # appended after the label: ": q_proj emits ..." or " (one projection ...)"
    tensor_parallel_reason = ""  # appended after "paddle_vha.parallel": " (fleet's mp layers would ...)"
    causal_lm_name = "Qwen3ForCausalLM"  # the class to pass to build_tensor_parallel_model

    def check_runtime_support(self, tensor_parallel_plan: bool = False) -> None:
        """Raise the family's error (one line) for a runtime option its model classes do not support.

        tensor_parallel_plan: the caller builds the model through paddle_vha.parallel (build_tensor_parallel_model),
        which accepts tensor_model_parallel_size > 1; the model classes alone build single-device layers only.
        """
        label, error = self.runtime_label, self.runtime_error
        if self.fuse_attention_qkv:
            raise error(f"fuse_attention_qkv=True is not supported by {label}{self.fused_qkv_reason}; set "
                        "fuse_attention_qkv=False")
        if self.tensor_model_parallel_size > 1 and not tensor_parallel_plan:
            raise error(
                f"tensor_model_parallel_size={self.tensor_model_parallel_size}: {label} is tensor-parallel only "
                f"through paddle_vha.parallel{self.tensor_parallel_reason}: build with "
                f"paddle_vha.parallel.build_tensor_parallel_model({self.causal_lm_name}, config, group), see "
                "docs/tensor_parallel.md")
        if self.sequence_parallel and not (tensor_parallel_plan and self.tensor_model_parallel_size > 1):
            raise error(f"sequence_parallel=True: {label} is sequence-parallel only under tensor parallelism "
                        "(tensor_parallel_degree > 1) through paddle_vha.parallel, see docs/tensor_parallel.md")
