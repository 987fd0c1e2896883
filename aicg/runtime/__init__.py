"""Layer A: running cubins through the CUDA driver (cuda-python)."""
