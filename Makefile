# The README's two commands: `make book` and `make test`.
SHELL  := /bin/bash
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CHAPTERS := $(sort $(wildcard book/*.ipynb))
# Two processes share the cores in `make test`; one BLAS/OpenMP thread each avoids oversubscription.
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYDEVD_DISABLE_FILE_VALIDATION=1

.PHONY: book test unit notebooks build-strict env clean

env: $(STAMP)

# (Re)create the environment when requirements or packaging change.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

## make book: execute the chapters and build the HTML book into _build/html/
book: $(STAMP)
	$(VENV)/bin/jupyter-book build .
	@echo "Book: file://$(CURDIR)/_build/html/index.html"

## make test: unit tests + nbval on every chapter, side by side with a strict book build
test: $(STAMP)
	@set -e -o pipefail; rm -rf _build/.jupyter_cache _build/html _build/jupyter_execute; \
	  ( $(TEST_ENV) $(MAKE) --no-print-directory build-strict > _build-strict.log 2>&1; echo $$? > _build-strict.rc ) & \
	  pid=$$!; status=0; \
	  $(TEST_ENV) $(PY) -m pytest tests $(CHAPTERS) --nbval-lax --nbval-current-env -p no:cacheprovider 2>&1 | tee _pytest.log || status=$$?; \
	  wait $$pid; brc=$$(cat _build-strict.rc); \
	  echo "---- strict book build (exit $$brc): last lines of _build-strict.log ----"; tail -n 15 _build-strict.log; \
	  rm -f _build-strict.rc; \
	  echo "---- pytest (unit tests + nbval on $(words $(CHAPTERS)) notebooks), exit $$status ----"; tail -n 1 _pytest.log; \
	  if [ $$status -ne 0 ] || [ $$brc -ne 0 ]; then echo "make test: FAILED"; exit 1; fi

# The book build that fails on any warning or any cell error, or on a figure rendered as text
# (which happens when a non-interactive matplotlib backend is forced on the kernel).
build-strict: $(STAMP)
	$(VENV)/bin/jupyter-book build . -W -n --keep-going
	@if grep -rl "&lt;Figure size" _build/html --include=*.html; then echo "figures rendered as text (above)"; exit 1; fi

clean:
	rm -rf _build _build-strict.log _pytest.log .pytest_cache
