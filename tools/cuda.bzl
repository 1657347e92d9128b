"""cuda_library: compiles .cu files with nvcc for sm_80 and sm_90 (plus compute_90 PTX) into a cc_library.

Bazel 4 has no offline rules_cuda; a genrule per .cu file runs the toolkit's nvcc and
its object file goes into an ordinary cc_library. The genrule runs sandboxed, with its .cu
file, `hdrs` and every header of `deps` (transitively) as inputs, so its object is rebuilt
when any header it can include changes and is cached like any other output. Use only
behind select() on //:cuda, so that the default build needs no CUDA at all. The targets
are tagged "manual" so that `//...` leaves them out; they are built only when a
--config=cuda target depends on them.
"""

NVCC = "/usr/local/cuda/bin/nvcc"
NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O2",
    "-Xcompiler -fPIC",
    "-gencode arch=compute_80,code=sm_80",
    "-gencode arch=compute_90,code=sm_90",
    # PTX of the newest target too, so that GPUs newer than Hopper run it (the driver
    # compiles it at load).
    "-gencode arch=compute_90,code=compute_90",
    "-DFSDP_WITH_CUDA=1",
])

def _transitive_headers_impl(ctx):
    return [DefaultInfo(files = depset(transitive = [
        dep[CcInfo].compilation_context.headers
        for dep in ctx.attr.deps
    ]))]

# Every header the given cc_library targets offer, transitively: the nvcc genrule's inputs.
_transitive_headers = rule(
    implementation = _transitive_headers_impl,
    attrs = {"deps": attr.label_list(providers = [CcInfo])},
)

def cuda_library(name, srcs, hdrs = [], deps = [], **kwargs):
    _transitive_headers(
        name = name + "_dep_headers",
        deps = deps,
        tags = ["manual"],
        visibility = ["//visibility:private"],
    )
    objs = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs + [":" + name + "_dep_headers"],
            outs = [obj],
            cmd = NVCC + " " + NVCC_FLAGS + " -I. -I$(GENDIR) -c $(location " + src + ") -o $@",
            tags = ["manual"],
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        linkstatic = True,
        tags = kwargs.pop("tags", []) + ["manual"],
        **kwargs
    )
