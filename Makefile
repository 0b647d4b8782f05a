# The two commands of the README: `make demo` and `make test`. Each installs what it needs first.
PYTHON ?= python3
export XDG_RUNTIME_DIR ?= /tmp

.PHONY: demo test install-test system-packages

demo:
	$(PYTHON) -m pip install -q -e ".[demo]"
	$(PYTHON) examples/train_digits.py

system-packages:
	@# Vulkan on the CPU (Mesa lavapipe) for the wgpu backend, and Debian's PoCL (LLVM 15) beside pip's (LLVM 14, which
	@# knows no CPU newer than itself: on an AMD Zen 5 it builds no kernel, "unknown target CPU 'generic'"); ember's
	@# opencl backend takes the devices that can build a plain kernel. Best effort, and only when root.
	@if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
		missing=""; \
		ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || missing="$$missing mesa-vulkan-drivers"; \
		[ -e /etc/OpenCL/vendors/pocl.icd ] || missing="$$missing pocl-opencl-icd"; \
		if [ -n "$$missing" ]; then \
			(apt-get update -qq && apt-get install -y -qq $$missing >/dev/null) || echo "note:$$missing not installed; wgpu or opencl tests may be skipped"; \
		fi; \
	fi

install-test: system-packages
	$(PYTHON) -m pip install -q -e ".[test]"

test: install-test
	$(PYTHON) -m pytest -q -n 2 --dist loadgroup --durations=20 tests; status=$$?; \
	if [ $$status -eq 5 ]; then echo "no tests collected"; exit 1; fi; exit $$status
