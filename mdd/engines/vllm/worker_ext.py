"""Methods mixed into vLLM's worker (``worker_extension_cls``), called through ``collective_rpc``."""
from __future__ import annotations


class CPUThreads:
    """Intra-op threads of the CPU build's model runner, settable while the engine runs."""

    def mdd_set_threads(self, n: int) -> int:
        import torch

        torch._C.set_num_threads(max(1, int(n)))  # vLLM's CPU worker stubs out torch.set_num_threads
        return torch.get_num_threads()
