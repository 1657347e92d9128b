"""Flags of the targets whose CPU loops use FSDP_CPU_CLONES (kernels/cpu.h).

Vectorisable selects, no libm calls and no errno (sqrt), no FMA contraction (each clone
computes elements bit for bit like the scalar bodies), OpenMP teams (ParallelChunks)
linked with libgomp.
"""

CPU_LOOP_COPTS = [
    "-fopenmp",
    "-fno-trapping-math",
    "-fno-math-errno",
    "-ffp-contract=off",
]

CPU_LOOP_LINKOPTS = ["-fopenmp"]
