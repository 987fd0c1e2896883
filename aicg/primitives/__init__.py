"""The execution-primitive lab: how each realisation of a row primitive behaves on one GPU.

lab.py measures every family's kernels (the realisations: reduction
topology, online or two-pass, Welford or two-pass, vector width, a row held
in registers or read again, fast or exact exp) over a grid of row lengths,
per dtype: time, drift against float64 and bit stability. realisation.py
stores the result beside the GPU's hwdb entry and answers the planner's
questions from it.
"""
