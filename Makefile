# Two commands do all set-up on a fresh clone:  `make demo`  and  `make test`.
# Both create .venv from the pinned lock file if it is missing or stale (idempotent).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv venv-mds demo test test-fast bench lock clean browser

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m datakit.cli warmup   # compile the numba kernels once into the package's cache (datakit/jit.py)
	@touch $(STAMP)

# mosaicml-streaming's own reader/writer for tests/test_mds.py, in a venv of its own: its pins (numpy<2.2,
# xxhash<4, transformers<5) conflict with requirements.lock. Built once; offline afterwards.
VENV_MDS := .venv-mds

venv-mds: $(VENV_MDS)/.installed

$(VENV_MDS)/.installed: requirements-mds.lock
	@test -x $(VENV_MDS)/bin/python || $(PYTHON) -m venv $(VENV_MDS)
	$(VENV_MDS)/bin/python -m pip install -q --no-deps -r requirements-mds.lock
	@touch $@

demo: venv
	$(PY) -m datakit.cli.demo

test: venv venv-mds browser
	$(PY) -m pytest -n 2 --dist loadgroup --durations=25

# Headless Chromium (Debian's `chromium`) renders report.html in tests/test_report_diff.py. CI runs as root on
# a fresh machine: install it there; elsewhere say why the rendering test will be skipped.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	        echo "make: could not install chromium: the report rendering test will be skipped"; \
	    else echo "make: no chromium and no root apt-get: the report rendering test will be skipped"; fi; }

test-fast: venv
	$(PY) -m pytest -m "not spark and not cluster and not slow"

bench: venv
	$(PY) benchmarks/run_all.py

# Re-resolve requirements.in into the pinned lock (needs the registry).
lock:
	rm -rf /tmp/datakit-lock && $(PYTHON) -m venv /tmp/datakit-lock
	/tmp/datakit-lock/bin/pip install -q --upgrade pip
	/tmp/datakit-lock/bin/pip install -q -r requirements.in
	/tmp/datakit-lock/bin/pip freeze --exclude-editable | grep -v '^datakit' > requirements.lock
	# hyperscan has no Linux aarch64 wheel: there scrub_pii falls back to polars (strategy auto)
	sed -i 's/^hyperscan==\(.*\)$$/hyperscan==\1; platform_machine != "aarch64"/' requirements.lock

clean:
	rm -rf $(VENV) $(VENV_MDS) demo out
