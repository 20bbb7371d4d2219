"""The fused VHA prologue operator (Premix -> q_norm / k_norm -> RoPE in one op), outside any model family.

op_loader.py    build (ops/build.py) and load of the custom operator; FusedPrologueUnavailable
cpu_variant.py  which CPU kernel variant runs (CPUID / VHA_PROLOGUE_ISA), the CPU's model and vector ISA flags
dispatch.py     the dispatch policy: should_use_fused and the reasons it keeps the composed path
prologue.py     fused_prologue, the call the layers make (forward and, through the grad op, backward)

The sources are ops/csrc in a checkout, or paddle_vha/_ops in an installed wheel; see docs/prologue.md.
"""
