"""The torch thread count of an engine process (the brief: cores divided among the node's local ranks).

torch is imported only when a count is set, so a rank on the simulated executor never loads it. That import takes
seconds (some of them holding the GIL): an engine sets the count on its execution thread, never on its event loop,
which must stay free to act on a stop signal meanwhile.
"""
from __future__ import annotations


def set_torch_threads(n: int | None) -> None:
    """``torch.set_num_threads(n)``; ``None`` leaves torch's default."""
    if n is None:
        return
    import torch

    torch.set_num_threads(n)
