"""Declares the external repositories the fsdp targets need, offline.

A workspace that depends on fsdp calls this from its WORKSPACE (examples/consumer does):

    local_repository(name = "fsdp", path = "/path/to/this/repo")
    load("@fsdp//tools:deps.bzl", "fsdp_dependencies")
    fsdp_dependencies()

It defines the offline stand-ins Bazel 4 would otherwise download (rules_cc, rules_java,
remote_coverage_tools, platforms), protobuf over the system protoc, the system libraries
from Debian's packages (tools/setup.sh installs them) and the CUDA toolkit at
/usr/local/cuda (used only under --config=cuda).

Each repository is declared only when the workspace has not declared one of that name
already (Bazel's `maybe`), so a consumer may define its own first, before this call; it
must then offer the targets fsdp's BUILD files use (FSDP_REPOSITORIES below lists the
repositories and the versions fsdp is built and tested with; README.md, "Depending on
fsdp", says the same).
"""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")

# Every repository fsdp_dependencies() may declare, with what fsdp expects of it.
FSDP_REPOSITORIES = {
    "rules_cc": "offline stand-in re-exporting the native C++ rules (cc/defs.bzl)",
    "rules_java": "offline stand-in re-exporting the native Java rules (java/defs.bzl)",
    "remote_coverage_tools": "offline stand-in (empty coverage filegroups)",
    "platforms": "Debian's bazel-platforms 0.0.2 (/usr/share/bazel/tools/platforms)",
    "com_google_protobuf": "protobuf 3.21 (Debian's protobuf-compiler, libprotobuf-dev)",
    "com_google_absl": "Abseil 20220623 (libabsl-dev), targets //:status, //:strings, ...",
    "com_github_google_glog": "glog 0.6 (libgoogle-glog-dev), target //:glog",
    "com_google_googletest": "GoogleTest 1.12 (libgtest-dev), //:gtest, //:gtest_main",
    "com_github_google_benchmark": "Google Benchmark 1.7 (libbenchmark-dev)",
    "gloo": "Gloo 2022-05-18 snapshot (libgloo-dev), TCP transport",
    "onednn": "oneDNN 2.6.3 (libdnnl-dev), //:onednn (dnnl_sgemm) and //:openmp (libgomp)",
    "nlohmann_json": "nlohmann-json 3.11 (nlohmann-json3-dev)",
    "cuda": "CUDA 13 at /usr/local/cuda (cudart, cuBLAS, NCCL 2.28); --config=cuda only",
}

def _files_repo_impl(ctx):
    for path, content in ctx.attr.files.items():
        ctx.file(path, content)
    for path, target in ctx.attr.symlinks.items():
        ctx.symlink(target, path)

# A repository made of the given files, written at fetch time (no download).
_files_repo = repository_rule(
    implementation = _files_repo_impl,
    attrs = {
        "files": attr.string_dict(),
        "symlinks": attr.string_dict(),
    },
    local = True,
)

_RULES_CC_DEFS = """\"\"\"Offline stand-in for rules_cc under Bazel 4: re-exports the native C++ rules.\"\"\"

cc_library = native.cc_library
cc_binary = native.cc_binary
cc_test = native.cc_test
cc_import = native.cc_import
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
cc_proto_library = native.cc_proto_library
"""

_RULES_JAVA_DEFS = """\"\"\"Offline stand-in for rules_java under Bazel 4: re-exports the native Java rules.\"\"\"

java_import = native.java_import
java_runtime = native.java_runtime
java_toolchain = native.java_toolchain
java_library = native.java_library
java_binary = native.java_binary
"""

_COVERAGE_BUILD = """# Bazel 4 references these even when coverage is not collected.
filegroup(name = "coverage_report_generator", visibility = ["//visibility:public"])
filegroup(name = "lcov_merger", visibility = ["//visibility:public"])
"""

_PROTOBUF_BUILD = """# The system protobuf (Debian's protobuf-compiler and libprotobuf-dev) under the
# repository name that proto_library and cc_proto_library look for.
package(default_visibility = ["//visibility:public"])

sh_binary(name = "protoc", srcs = ["protoc.sh"])

cc_library(name = "protobuf", linkopts = ["-lprotobuf"])

proto_lang_toolchain(
    name = "cc_toolchain",
    command_line = "--cpp_out=$(OUT)",
    runtime = ":protobuf",
)
"""

_SYSTEM_LIBRARIES = {
    "com_google_absl": "absl",
    "com_github_google_glog": "glog",
    "com_google_googletest": "gtest",
    "com_github_google_benchmark": "benchmark",
    "gloo": "gloo",
    "onednn": "onednn",
    "nlohmann_json": "nlohmann_json",
}

def fsdp_dependencies():
    """Defines the external repositories the workspace has not defined yet; call it in the WORKSPACE."""
    maybe(
        _files_repo,
        name = "rules_cc",
        files = {"WORKSPACE": "", "BUILD": "", "cc/BUILD": "", "cc/defs.bzl": _RULES_CC_DEFS},
    )
    maybe(
        _files_repo,
        name = "rules_java",
        files = {"WORKSPACE": "", "BUILD": "", "java/BUILD": "", "java/defs.bzl": _RULES_JAVA_DEFS},
    )
    maybe(
        _files_repo,
        name = "remote_coverage_tools",
        files = {"WORKSPACE": "", "BUILD": _COVERAGE_BUILD},
    )
    maybe(native.local_repository, name = "platforms", path = "/usr/share/bazel/tools/platforms")
    maybe(
        _files_repo,
        name = "com_google_protobuf",
        files = {
            "WORKSPACE": "",
            "BUILD": _PROTOBUF_BUILD,
            "protoc.sh": "#!/bin/sh\nexec /usr/bin/protoc \"$@\"\n",
        },
    )
    for name, folder in _SYSTEM_LIBRARIES.items():
        maybe(
            native.new_local_repository,
            name = name,
            path = "/usr",
            build_file = str(Label("//third_party/%s:%s.BUILD" % (folder, folder))),
        )
    maybe(
        native.new_local_repository,
        name = "cuda",
        path = "/usr/local/cuda",
        build_file = str(Label("//third_party/cuda:cuda.BUILD")),
    )
