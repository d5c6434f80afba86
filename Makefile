# Two commands a fresh machine needs: `make demo` and `make test` (both install first).
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
DEMO_FIXTURE ?= fixtures/hlo/mlp_2d_megatron.pb
OUT ?= out

.PHONY: install demo test test-slow test-matrix proto fixtures bench clean

install:
	$(PIP) install --quiet --disable-pip-version-check -e '.[dev,xla,search]'

demo: install
	mkdir -p $(OUT)
	hlo-spmd show $(DEMO_FIXTURE) --annotated-only --no-metadata
	hlo-spmd partition $(DEMO_FIXTURE) -o $(OUT)/demo.partitioned.pb
	hlo-spmd show $(OUT)/demo.partitioned.pb --no-metadata
	hlo-spmd verify $(DEMO_FIXTURE) $(OUT)/demo.partitioned.pb

test: install
	$(PYTHON) -m pytest -q -p no:cacheprovider

# The suite on Python 3.11, 3.12 and 3.13, and the differential tests on the newest
# jax (noxfile.py; needs nox and those interpreters on PATH). Not part of `make test`.
test-matrix:
	$(PIP) install --quiet --disable-pip-version-check nox
	$(PYTHON) -m nox

test-slow:
	$(PYTHON) -m pytest -q -p no:cacheprovider -m slow

proto:
	bash scripts/gen_proto.sh

fixtures:
	$(PYTHON) fixtures/generate.py --out fixtures/hlo

bench:
	$(PYTHON) -m benchmarks.run

clean:
	rm -rf $(OUT) build *.egg-info src/*.egg-info .pytest_cache
