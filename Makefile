# The two set-up commands of README.md. Each installs what is missing first.
#   make demo   the main job: fit, test, checkpoint and release a small GPT on 2 local CPU ranks
#   make test   the whole test suite: the source checks (formatting, function lengths), the
#               CUDA build where nvcc is installed, every test, then the consumer workspace
#               examples/consumer
#   make gpu_bundle   the archive for a GPU machine (tools/gpu_bundle.sh)

BAZEL ?= bazel
NVCC ?= /usr/local/cuda/bin/nvcc
DEMO_ARGS ?=

.PHONY: demo test setup sanitize gpu_bundle format

setup:
	@bash tools/setup.sh

# Formats every C++ source in place (the style `make test` checks).
format: setup
	@bash tools/format.sh --fix

# --device=cuda in DEMO_ARGS builds the CUDA paths (--config=cuda).
DEMO_BAZEL_FLAGS ?= $(if $(findstring --device=cuda,$(DEMO_ARGS)),--config=cuda,)

demo: setup
	$(BAZEL) run $(DEMO_BAZEL_FLAGS) //trainer:main_job -- $(DEMO_ARGS)

# The CUDA build (compile and link only: no GPU here) runs when the toolkit is present. It
# builds what --config=cuda changes: every library and binary, and the tests tagged gpu (the
# only tests with CUDA code; the others compile the same sources in both builds and run in
# the CPU build). Objects whose command line --config=cuda leaves alone are shared with the
# CPU build (.bazelrc), so they are compiled once.
CUDA_BUILD_QUERY = let all = //... in (kind("cc_library|cc_binary", $$all) + attr(tags, "\bgpu\b", tests($$all))) except attr(tags, "\bmanual\b", $$all)

# Source checks first (seconds): C++ formatting (tools/format.sh; `tools/format.sh --fix`
# fixes it) and functions over 100 lines without a comment saying why (tools/function_lengths.py).
test: setup
	@bash tools/format.sh
	@python3 tools/function_lengths.py
	@if [ -x $(NVCC) ]; then \
	  echo "make test: bazel build --config=cuda (every library and binary and the gpu tests: the CUDA code compiles and links)"; \
	  targets=$$($(BAZEL) query --noshow_progress '$(CUDA_BUILD_QUERY)') && \
	  $(BAZEL) build --config=cuda $$targets; \
	else \
	  echo "make test: SKIPPED bazel build --config=cuda: $(NVCC) not found"; \
	fi
	$(BAZEL) test //...
	cd examples/consumer && $(BAZEL) test //...

# The unit tests under AddressSanitizer and UndefinedBehaviorSanitizer.
sanitize: setup
	$(BAZEL) test --config=asan //core/... //nn/... //optim/... //data/... //flatten/... //policy/... //comm/... //fsdp/... //checkpoint/... //integration/... //trainer/...
	$(BAZEL) test --config=ubsan //core/... //nn/... //optim/... //data/... //flatten/... //policy/... //comm/... //fsdp/... //checkpoint/... //integration/... //trainer/...

# Everything the GPU acceptance run needs, in out/gpu_bundle.tar.xz (tools/gpu_bundle.sh).
gpu_bundle: setup
	bash tools/gpu_bundle.sh
