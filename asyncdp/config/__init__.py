"""Configuration: the flags and environment (:mod:`.flags`, the only reader of ``os.environ``) and the pure
deployment derivation (:mod:`.deployment`). Nothing here starts a task or a process."""
