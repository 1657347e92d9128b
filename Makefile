# The two set-up commands of README.md. Each installs what is missing first.
#   make demo   the main job: fit, test, checkpoint and release a small GPT on 2 local CPU ranks
#   make test   the whole test suite, then the consumer workspace examples/consumer

BAZEL ?= bazel
DEMO_ARGS ?=

.PHONY: demo test setup sanitize

setup:
	@bash tools/setup.sh

demo: setup
	$(BAZEL) run //integration:main_job -- $(DEMO_ARGS)

test: setup
	$(BAZEL) test //...
	cd examples/consumer && $(BAZEL) test //...

# The unit tests under AddressSanitizer and UndefinedBehaviorSanitizer.
sanitize: setup
	$(BAZEL) test --config=asan //core/... //nn/... //optim/... //data/... //flatten/... //policy/... //comm/... //fsdp/... //checkpoint/... //integration/...
	$(BAZEL) test --config=ubsan //core/... //nn/... //optim/... //data/... //flatten/... //policy/... //comm/... //fsdp/... //checkpoint/... //integration/...
