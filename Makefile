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

.PHONY: course test lint lab clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned: a bare range could pull a multi-GB CUDA build.
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

course: $(STAMP)
	$(BIN)/python -m course_lib.batch

# The chapters (nbval) and the tests run side by side, one pytest each: the
# chapters must run in order in one process (they share runs/course), and
# pytest-xdist splits a notebook's cells across workers. The chapters' report
# prints after the tests'.
test: $(STAMP)
	$(BIN)/ruff check .
	@mkdir -p runs
	@$(BIN)/python -m pytest notebooks > runs/nbval.log 2>&1 & chapters=$$!; \
	$(BIN)/python -m pytest tests; tests=$$?; \
	wait $$chapters; nbval=$$?; \
	echo "--- chapters (nbval) ---"; cat runs/nbval.log; \
	exit $$(( tests || nbval ))

lint: $(STAMP)
	$(BIN)/ruff check .

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks --ip=127.0.0.1 --port=8888 \
		--no-browser $(ROOT_FLAG)

clean: $(STAMP)
	$(BIN)/course-lib clean --scope generated
