"""Hardware characterisation: probe kernels measure the GPU into hwdb/<gpu>.toml.

registry.py lists the probes; gpu.py runs kernels and times them; curves.py
reads plateaus and knees off the measured curves; record.py merges the
figures into the hwdb entry's measured section.
"""
