"""The pieces of the GPU acceptance run (tools/gpu_bundle/run.py says what runs and why).

settings       the environment variables and the phases of each --call
steps          the run's log lines, the steps' records, the runner (timeouts, the budget)
libraries      the CUDA libraries our binaries need, LD_LIBRARY_PATH, ldd -r
job            our main job's command line and its retries
phases         one function per phase
summary        the JSON summary, assembled from the pieces below
sources        what the pieces read: the records, the settings, the work directory's files
job_figures    the pieces on our job's runs and on PyTorch FSDP2's
bench_figures  the pieces on the gpu tests, the collectives and attention benchmarks, ncu
ncu            Nsight Compute's raw page, per kernel
outdir         the copy of the summary and the logs to $OUT
"""
