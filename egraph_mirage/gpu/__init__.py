"""The GPU side: timing, the bandwidth floor, PyTorch baselines and tuning of lowered μGraphs.

- ``torch_eval``: any kernel graph (μGraphs too) as a PyTorch function, one entry per operator;
- ``timing``: random inputs, plain-launch and CUDA-graph timers;
- ``floor``: bytes that must cross device memory, measured copy bandwidth;
- ``baselines``: eager, ``torch.compile``, SDPA for attention programs;
- ``tune``: the lowering's knobs tried, checked and timed, with an on-disk cache; ``rank``.

``egraph-mirage bench gpu`` (``bench.gpu_bench``) puts them together. Nothing here imports egglog
or JAX (the GPU machine has neither): μGraphs arrive as JSON. The modules import torch, so this
package is imported only where it is used.
"""
