# Each target sets itself up on a new Debian machine (root, Python 3.11, PyPI + Debian mirrors).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)
export DEBIAN_FRONTEND := noninteractive

# The full SGLang 0.5.23 environment (207 wheels, 4.3 GB) for the tests that run on it: one cache
# per machine, outside the checkout, where the lab hosts can see it; each wheel checked against
# the lock's sha256 (a second fetch reads nothing: the verdicts are kept beside the wheels).
FULL_LOCK   := playbooks/files/locks/sglang-0.5.23-full.lock
FULL_WHEELS ?= /var/cache/fleetctl-wheels/sglang-0.5.23
export FLEETCTL_FULL_WHEELS := $(FULL_WHEELS)

# The real SGLang Model Gateway (smg, the renamed sglang-router: a Rust binary wheel, no GPU) that the
# gateway tests and the bench route through: a tool venv per machine, outside the checkout.
SMG_VERSION := 1.13.0
SMG_VENV    ?= /var/cache/fleetctl-tools/smg-$(SMG_VERSION)
export FLEETCTL_SMG := $(SMG_VENV)/bin/smg

.PHONY: help deps smg sshd cc chromium wheels demo test lint typecheck docs pytest bench lab-down clean

help:
	@echo "make demo   - start the lab fleet and run the main job on it"
	@echo "make test   - ruff, mypy, the docs and the whole pytest suite (lab end-to-end tests included)"
	@echo "make docs   - the generated references checked current, the site built --strict (.cache/site)"
	@echo "make bench  - benchmarks, side by side with peers"

$(STAMP):
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	# Bytecode up front: with PYTHONDONTWRITEBYTECODE set, every run would recompile fleetctl.
	$(BIN)/python -m compileall -q fleetctl $(VENV)/lib >/dev/null || true
	rm -f $(VENV)/.installed-* && touch $@

deps: $(STAMP) sshd cc smg

smg:
	@test -x $(SMG_VENV)/bin/smg || { $(PY) -m venv $(SMG_VENV) \
	  && $(SMG_VENV)/bin/python -m pip install -q --disable-pip-version-check smg==$(SMG_VERSION); }

# The lab hosts are real OpenSSH servers (each with the sudo user fleetop); the tests drive them
# with the real ssh client too. tc and ip (iproute2): the lab's links (fleetctl/lab/links.py).
sshd:
	@if ! test -x /usr/sbin/sshd || ! command -v ssh >/dev/null || ! command -v unshare >/dev/null \
	    || ! command -v systemd-analyze >/dev/null || ! dpkg -s python3-venv >/dev/null 2>&1 \
	    || ! test -x /usr/bin/sudo || ! command -v tc >/dev/null; then \
	  echo "installing openssh-server, openssh-client, util-linux, python3-venv, systemd, sudo, iproute2"; \
	  apt-get update -qq && apt-get install -y -qq openssh-server openssh-client util-linux python3-venv \
	    systemd sudo iproute2 >/dev/null; \
	fi
# nft (nftables): the lab links' delay, loss and partitions (fleetctl/lab/netfaults.py)
	@command -v nft >/dev/null || { echo "installing nftables"; apt-get update -qq \
	  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null; }

# gcc and Python.h: the import probe's tests build a real extension that references a missing symbol,
# here and on a lab host (which sees this machine's /usr).
cc:
	@if ! command -v gcc >/dev/null || ! test -f "$$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h"; then \
	  echo "installing gcc, python3-dev"; \
	  apt-get update -qq && apt-get install -y -qq gcc python3-dev >/dev/null; \
	fi

# Headless Chromium: the report's lab test opens the page in it (DOM after the script, screenshots),
# and bench/report_page.py times it. Not part of deps: only those two need it.
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

demo: deps
	bash scripts/demo.sh

# Host-side code (remote/ and the lab's stand-in server) runs on Python 3.8: ruff's py38 syntax checks
# and FA102 on it here; tests/test_remote_py38.py adds the 3.8 grammar, 3.9+ names and real interpreters.
HOST_SIDE := fleetctl/remote fleetctl/lab/fake_sglang.py
lint: $(STAMP)
	$(BIN)/ruff check fleetctl tests bench scripts
	$(BIN)/ruff check --isolated --target-version py38 --select E9,FA,PLE $(HOST_SIDE)

typecheck: $(STAMP)
	$(BIN)/mypy

wheels:
	$(PY) scripts/wheelhouse.py fetch $(FULL_LOCK) $(FULL_WHEELS)

# --whole-suite (tests/skip_guard.py): a skip or xfail not on tests/skip_allowlist.py, a deselected
# test, a test file not collected, or a lab test collected that did not pass (not root, no unshare,
# ...) fails the run; the guard writes its verdict to GUARD_VERDICT, and a run without it (the plugin
# disabled with -p no:..., in PYTEST_ADDOPTS say) fails here. Two pytest-xdist
# workers, each with its own labs (tests/lab_support.py), take whole modules, longest first
# (tests/conftest.py): most of a lab test's time is spent waiting on sshd and servers.
GUARD_VERDICT := $(VENV)/skip-guard.verdict
pytest: deps chromium wheels
	rm -f $(GUARD_VERDICT)
	$(BIN)/pytest -q -p no:cacheprovider --whole-suite --guard-verdict $(GUARD_VERDICT) -n 2 --dist loadfile \
	  --no-loadscope-reorder --durations=25
	@grep -qx 'skip guard: ok' $(GUARD_VERDICT) 2>/dev/null \
	  || { echo "the skip guard did not pass this run ($(GUARD_VERDICT) missing or failed)"; exit 1; }

# The site (mkdocs.yml, docs/): the references generated from the code must be current (else: run
# scripts/gen_docs.py), and --strict fails on a broken link or anchor and on a page left out of the nav.
docs: $(STAMP)
	FLEETCTL_CONFIG=none $(BIN)/python scripts/gen_docs.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

test: lint typecheck docs pytest

# bench/run.py starts its own labs (8 and 32 hosts), installs the peers (ansible-core, pyinfra) into
# .cache/bench-peers/, measures whole commands side by side and writes bench/results.md and .json.
# scale.py: the cost curves of the read-only jobs at 8, 32, 200 and 1,000 hosts (issue 37; one lab
# grown size by size, bench/scale.md and docs/reference/figures/scale-*.png).
# probe_search.py: the host-side search alone against ripgrep, and probe grep against ssh+rg (issue 3).
# full_env.py: issue 16's figures on the full SGLang 0.5.23 environment (wheels from `make wheels`;
# 3 venvs of 9.5 GB at its peak, all removed at the end). The narrower scripts (drift.py,
# release.py, overlay.py) run on their own.
BENCHES := bench/run.py bench/scale.py bench/probe_search.py bench/report_page.py bench/inventory_load.py bench/full_env.py bench/models_sync.py bench/gateway.py bench/models_verify.py
bench: deps chromium wheels
	set -e; for b in $(BENCHES); do echo "== $$b"; $(BIN)/python $$b; done

lab-down: $(STAMP)
	$(BIN)/fleetctl lab down

clean:
	-$(BIN)/fleetctl lab down
	rm -rf $(VENV) .fleetctl .cache .mypy_cache .ruff_cache
