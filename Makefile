# Two commands do all the set-up: `make course` and `make test`.
# Both create .venv when it is missing.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU wheel; override on a CUDA host (e.g. TORCH_SPEC='torch==2.13.0').
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.installed
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

# Batch runs print a few stable progress lines; `make lab` keeps the widget.
course test: export COURSE_PROGRESS = text

.PHONY: course test lint lab clean venv gpu-check site

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned: a bare range could pull a multi-GB CUDA build.
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# EDITION=fr runs the French edition (notebooks/fr/). Not LANG: make imports
# the environment, and a French-speaking learner's shell sets LANG already.
EDITION ?= en

course: $(STAMP)
	$(BIN)/python -m course_lib.course.run_chapters --edition $(EDITION)

# Two pytest processes side by side, one per core: the chapters (nbval, in
# order: they share runs/course), the fault tests, which mostly wait, and the
# files that even the lanes out by their measured times (`make test-times`
# prints both lanes' times and the slowest tests), beside every other test.
# pytest-xdist spreads a notebook's cells over its workers (its loadgroup mode
# does not group them under pytest 9); with a scheduler of our own it ran no
# faster than these two lanes. COURSE_REPLAY: a launch both lanes run happens once
# (tests/machinery/replay.py). The first lane's report prints last.
LANE := notebooks tests/test_faults.py tests/test_widgets.py tests/test_frameworks.py \
        tests/test_capstone.py
# A job started with & by a non-interactive shell ignores SIGINT, and so would
# everything it starts (Ctrl-C, and the interrupt tests); restore the default
# in both lanes, so that `make test &` from a script tests the same thing.
SIGINT_DFL := $(BIN)/python -c 'import os, signal, sys; \
	signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])'

# Each lane starts with one single-threaded step, so that neither leaves a
# core idle: the first lints (ruff, the layers of ARCHITECTURE.md, the types),
# the second builds the site that tests/test_site.py checks (COURSE_SITE; a
# narrow run builds it itself). A lint error still fails `make test`.
test: $(STAMP)
	@mkdir -p runs
	@export COURSE_SITE=$(abspath $(SITE_OUT)); \
	export COURSE_REPLAY=$$(mktemp -d); \
	{ $(BIN)/ruff check . && $(BIN)/lint-imports --no-cache && $(BIN)/mypy && \
	  $(SIGINT_DFL) $(BIN)/python -m pytest $(LANE) --junitxml=runs/test-lane1.xml; \
	} > runs/lane.log 2>&1 & lane=$$!; \
	$(MAKE) --no-print-directory site && \
	$(SIGINT_DFL) $(BIN)/python -m pytest tests $(LANE:%=--ignore=%) \
	  --junitxml=runs/test-lane2.xml; rest=$$?; \
	wait $$lane; first=$$?; \
	echo "--- lint, then $(LANE) ---"; cat runs/lane.log; \
	rm -rf "$$COURSE_REPLAY"; exit $$(( rest || first ))

# Each lane's time and the twenty slowest tests of the last `make test`
# (runs/test-lane1.xml and runs/test-lane2.xml).
.PHONY: test-times

test-times: $(STAMP)
	$(BIN)/python scripts/test_times.py --top 20

# ruff, then the layers of ARCHITECTURE.md (import-linter), then the types.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

# The course as a static website, both editions (build/site/en, build/site/fr),
# from the committed chapters: nothing executed, no host reached. Its own venv
# (no torch: site/requirements.txt), the widgets' scripts from npm
# (site/package-lock.json), the generated pages from .venv (site/generate.py).
SITE_VENV ?= .venv-site
SITE_STAMP := $(SITE_VENV)/.installed
SITE_NODE := site/node_modules/.package-lock.json
SITE_OUT ?= build/site

$(SITE_STAMP): site/requirements.txt
	test -x $(SITE_VENV)/bin/python || $(PYTHON) -m venv $(SITE_VENV)
	$(SITE_VENV)/bin/python -m pip install --quiet -r site/requirements.txt
	touch $(SITE_STAMP)

$(SITE_NODE): site/package.json site/package-lock.json
	cd site && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error

site: $(STAMP) $(SITE_STAMP) $(SITE_NODE)
	$(BIN)/python site/generate.py $(SITE_OUT)/gen
	$(SITE_VENV)/bin/python site/build.py --out $(SITE_OUT)

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks --ip=127.0.0.1 --port=8888 \
		--no-browser $(ROOT_FLAG)

# On a GPU host only (a CUDA torch build: see TORCH_SPEC): one pass over the
# CUDA paths in under 10 minutes -> runs/gpu/report.json and summary.txt.
# Exit 2 where no CUDA device is visible.
gpu-check: $(STAMP)
	$(BIN)/python scripts/gpu_check.py

clean: $(STAMP)
	$(BIN)/course-lib clean --scope generated

# docs/: the instructors' worked solutions (from course/quiz.py) and the
# cheat-sheet (from the bug catalog's report of runs/course, or a run of its own).
.PHONY: solutions cheatsheet recipes-page versions-page

# docs/recipes.md (formulas), docs/recipe-verdicts.md and docs/rl-recipe-verdicts.md (verdicts)
# pages, from runs/course (or a run of their own).
recipes-page: $(STAMP)
	$(BIN)/python -m course_lib.course.recipes_page

# docs/framework-versions.md, the real loops version by version (chapter 08 links it),
# from the committed data/frameworks-matrix.json.
versions-page: $(STAMP)
	$(BIN)/python -m course_lib.course.versions_page

solutions: $(STAMP)
	$(BIN)/python -m course_lib.course.solutions

# docs/cheatsheet.md and .png, and the French edition's docs/fr/cheatsheet.md and .png
# (one generator, its strings through course_lib/course/locale/fr.json).
cheatsheet: $(STAMP)
	$(BIN)/python -m course_lib.course.cheatsheet

# The French edition: build notebooks/fr/ from the English chapters and
# notebooks/i18n/fr/ (refused while a cell needs translating), then run the
# chapters whose code changed, so that their committed outputs are French.
.PHONY: translations

translations: $(STAMP)
	$(BIN)/python -m course_lib.course.translation
	cd notebooks/fr && for nb in [0-9][0-9]_*.ipynb; do \
	  COURSE_PROGRESS=text $(abspath $(BIN))/jupyter nbconvert --to notebook --execute \
	    --inplace "$$nb" || exit 1; done
