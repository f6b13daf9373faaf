"""Tuning and timing of lowered kernels on a GPU (filled in with the Triton lowering).

GPU code imports neither egglog nor JAX: μGraphs reach the GPU machine as JSON.
"""
