# The two commands of the README: `make demo` and `make test`. Each installs what it needs first.
PYTHON ?= python3
export XDG_RUNTIME_DIR ?= /tmp

.PHONY: demo test install-test system-packages

demo:
	$(PYTHON) -m pip install -q -e ".[demo]"
	$(PYTHON) examples/train_digits.py

system-packages:
	@# Vulkan on the CPU (Mesa lavapipe) for the wgpu backend, and PoCL comes from pip; best effort when not root.
	@if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null && ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then \
		(apt-get update -qq && apt-get install -y -qq mesa-vulkan-drivers >/dev/null) || echo "note: mesa-vulkan-drivers not installed; wgpu tests will be skipped"; \
	fi

install-test: system-packages
	$(PYTHON) -m pip install -q -e ".[test]"

test: install-test
	$(PYTHON) -m pytest -q -n 2 --dist loadgroup --durations=20 tests; status=$$?; \
	if [ $$status -eq 5 ]; then echo "no tests collected"; exit 1; fi; exit $$status
