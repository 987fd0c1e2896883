"""Backward kernels: the gradients of softmax, log-softmax, rmsnorm and layernorm.

A separate family class beside the forward rows, with the same pipeline in small modules:

- ops.py       what each backward operator takes and gives, its float64 reference and error scales
- families.toml, space.py
               its families and their ladders of parameters, decided by the legality engine on
               an instance's own rule sets, each candidate kept where its order keeps the bound
- codegen.py   a candidate's CUDA source (templates in kernels/backward/) and its launches
- build.py     NVRTC, and ptxas's report per entry
- check.py     validation on the device against float64, in a worker process
- jit.py       compiled on first use, validated before the first launch, cached per instance
- runtime.py   the launches on PyTorch tensors, for the operators' autograd
  (aicg/runtime/torch_ops.py)
"""
