# Two targets: `make demo` and `make test`. Both install what is missing and build into build/
# (CMake underneath: `cmake -S . -B build` works directly too).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

# build_tree PURPOSE: install-deps for it (empty: build and demo; --test), configure, build.
define build_tree
	@bash scripts/install-deps.sh $(1)
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)
endef

.PHONY: demo test

demo:
	$(call build_tree,)
	@$(BUILD)/fsdpctl run examples/tiny.ini

# The interop tests' Python environment (scripts/test-env.sh) and, with the CUDA toolkit, the
# binary tools of the static SASS check (scripts/cuda-tools.sh) are made before ctest, outside any
# test's timeout, and cached outside the clone.
test:
	$(call build_tree,--test)
	@bash scripts/test-env.sh >/dev/null
	@if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then bash scripts/cuda-tools.sh >/dev/null; fi
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
