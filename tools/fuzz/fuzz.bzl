"""fuzz_target: one parser of untrusted bytes, fuzzed by libFuzzer and regression-tested.

    load("//tools/fuzz:fuzz.bzl", "fuzz_target")

    fuzz_target(
        name = "metadata_fuzz",
        srcs = ["metadata_fuzz.cc"],          # defines LLVMFuzzerTestOneInput
        deps = [":metadata"],
    )

with its seed inputs in `testdata/<name>_corpus/` beside the BUILD file (at least one file),
makes
- `<name>_regression`, a cc_test that `make test` runs: every corpus file, then each file
  with seeded single-bit flips, truncations and byte changes, through the target; a crash,
  an abort or a sanitizer report fails it;
- `<name>`, a cc_binary: under `--config=fuzz` (clang, libFuzzer, ASan + UBSan) a libFuzzer
  binary, elsewhere the same corpus driver. `tools/fuzz/run.sh` builds and runs them all.
"""

def fuzz_target(name, srcs, deps = [], size = "small"):
    native.cc_library(
        name = name + "_lib",
        testonly = True,
        srcs = srcs,
        deps = deps,
        alwayslink = True,
    )
    corpus_dir = "testdata/" + name + "_corpus"
    corpus = native.glob([corpus_dir + "/**"])
    if not corpus:
        fail("fuzz_target %s: no seed inputs in %s/" % (name, corpus_dir))
    native.cc_test(
        name = name + "_regression",
        size = size,
        data = corpus,
        args = [native.package_name() + "/" + corpus_dir],
        deps = [":" + name + "_lib", "//tools/fuzz:corpus_main"],
    )
    native.cc_binary(
        name = name,
        testonly = True,
        data = corpus,
        tags = ["fuzz_target"],
        deps = [":" + name + "_lib"] + select({
            "//tools/fuzz:fuzzing": [],
            "//conditions:default": ["//tools/fuzz:corpus_main"],
        }),
        linkopts = select({
            "//tools/fuzz:fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
    )
