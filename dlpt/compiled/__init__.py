"""torch.compile'd code in the model: the provenance records a recording carries (which model
lines each compiled kernel came from) and the pure transformation that puts compiled kernels on
those lines (`fused.attribute_compiled`). The recorder (collectors/record/provenance.py) fills
the records while the program compiles; nothing here imports torch or a collector."""
