# The README's two commands: `make book` and `make test`.
SHELL  := /bin/bash
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CHAPTERS := $(sort $(wildcard book/*.ipynb))
# Two test processes share the cores in `make test`; one BLAS/OpenMP thread each avoids oversubscription.
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYDEVD_DISABLE_FILE_VALIDATION=1 POSENC_REQUIRE_TRANSFORMERS=1
# In CI the browser test must run (Chromium is installed there), not skip.
BROWSER_ENV := $(if $(filter true,$(CI)),POSENC_REQUIRE_BROWSER=1)

.PHONY: book test unit notebooks build-strict env clean chromium screenshot

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

## make test: unit tests and every chapter under nbval (two processes), then the strict book build
## (which renders the chapters from what nbval executed), then the built HTML in headless Chromium
test: $(STAMP)
	@set -e -o pipefail; rm -rf _build/.jupyter_cache _build/html _build/jupyter_execute _build/browser _*.rc; \
	  ( set +e; $(MAKE) --no-print-directory chromium > _chromium.log 2>&1; echo $$? > _chromium.rc ) & cpid=$$!; \
	  status=0; brc=0; wrc=0; \
	  $(TEST_ENV) POSENC_NB_CACHE=_build/.jupyter_cache $(PY) -m pytest -n 2 --dist loadfile $(CHAPTERS) tests \
	    --ignore=tests/browser --nbval-lax --nbval-current-env -p no:cacheprovider 2>&1 | tee _pytest.log || status=$$?; \
	  $(TEST_ENV) $(MAKE) --no-print-directory build-strict > _build-strict.log 2>&1 || brc=$$?; \
	  wait $$cpid || true; \
	  if [ $$brc -eq 0 ]; then \
	    $(TEST_ENV) $(BROWSER_ENV) $(PY) -m pytest tests/browser -p no:cacheprovider > _browser.log 2>&1 || wrc=$$?; \
	  else echo "not run: the strict book build failed" > _browser.log; wrc=1; fi; \
	  echo "---- Chromium for the browser test ----"; tail -n 2 _chromium.log; \
	  echo "---- strict book build (exit $$brc): last lines of _build-strict.log ----"; tail -n 15 _build-strict.log; \
	  echo "---- browser test of the built HTML (exit $$wrc): _browser.log; per-page table in _build/browser/pages.md ----"; \
	  grep -E "^(FAILED|ERROR|SKIPPED)" _browser.log | head -n 20 || true; tail -n 1 _browser.log; \
	  rm -f _chromium.rc; \
	  echo "---- pytest (unit tests + nbval on $(words $(CHAPTERS)) notebooks), exit $$status ----"; tail -n 1 _pytest.log; \
	  count() { grep -Eo "[0-9]+ $$1" "$$2" | tail -n 1 | cut -d' ' -f1; }; \
	  p=$$(( $$(count passed _pytest.log || echo 0) + $$(count passed _browser.log || echo 0) )); \
	  f=$$(( $$(count failed _pytest.log || echo 0) + $$(count failed _browser.log || echo 0) )); \
	  s=$$(( $$(count skipped _pytest.log || echo 0) + $$(count skipped _browser.log || echo 0) )); \
	  if [ $$status -ne 0 ] || [ $$brc -ne 0 ] || [ $$wrc -ne 0 ]; then echo "make test: FAILED"; fi; \
	  echo "total: $$p passed, $$f failed, $$s skipped"; \
	  if [ $$status -ne 0 ] || [ $$brc -ne 0 ] || [ $$wrc -ne 0 ]; then exit 1; fi

# Debian's Chromium for the browser test. CI (CI=true, root, apt) installs it when absent, and the
# browser test is then required to run; elsewhere it is skipped with its reason when Chromium is missing.
chromium:
	@if [ -x /usr/bin/chromium ]; then /usr/bin/chromium --version; \
	elif [ "$${CI:-}" = true ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation \
	    && /usr/bin/chromium --version; \
	else echo "Chromium not installed: the browser test will be skipped (Debian: apt-get install chromium)"; fi

## make screenshot: the README's picture of the book, from the built HTML (make book first)
screenshot: $(STAMP)
	$(PY) tests/browser/book_browser.py --readme-screenshot book/images/book-screenshot.png

# The book build that fails on any warning or any cell error, or on a figure rendered as text
# (which happens when a non-interactive matplotlib backend is forced on the kernel).
build-strict: $(STAMP)
	$(VENV)/bin/jupyter-book build . -W -n --keep-going
	@if grep -rl "&lt;Figure size" _build/html --include=*.html; then echo "figures rendered as text (above)"; exit 1; fi

clean:
	rm -rf _build _build-strict.log _pytest.log _browser.log _chromium.log .pytest_cache
