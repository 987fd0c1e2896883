"""Constrained synthesis: proposers, the repair loop, and replayable proposals.

A proposal (a family with parameters, or a kernel body filled into a fixed
skeleton, with the transformations it declares) passes the same legality
check, NVRTC compilation and validation as any template candidate. Each
round of the loop is a cached step; failures are fed back to the proposers.
"""
