"""Configuration: the flags and environment (:mod:`.flags`, the only reader of ``os.environ``), the pure
deployment derivation (:mod:`.deployment`, which imports flags, never the other way) and each process role's
frozen config derived from it (:mod:`.roles`). Nothing here starts a task or a process."""
