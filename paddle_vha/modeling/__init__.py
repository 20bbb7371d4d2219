"""A family's model classes from (base, variant): subclasses of the base's own classes that override only what the
variant changes (its attention, a few backbone deviations, its checkpoint rules).

slots.py          the class names a base's constructors look up, filled with the family's for one constructor call
factory.py        Variant (what a family changes) and build_family(base, variant) -> its four classes
checkpointing.py  save / from_pretrained checked against the family's declared tensors; flex-checkpoint name rules
                  for the Linears the base does not know
"""
