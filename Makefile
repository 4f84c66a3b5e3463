# The two commands a fresh machine needs: `make demo` (the main job on embedded defaults) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# CPU wheel of torch for machines with none; GPU users install their own torch first (any version in the range).
TORCH_CPU ?= torch==2.13.0
TIMM_VERSION ?= 1.0.31

.PHONY: venv torch ffmpeg install install-dev demo test test-fast clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

venv: $(BIN)/python

# Install torch only when the venv has none, so a CUDA build a user put there is kept.
torch: venv
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_CPU)"

# torchcodec (the `torchcodec` extra: data.decoder=auto's first choice) loads the system's FFmpeg libraries: Debian's
# are installed where apt-get exists and they are missing (as root, or with sudo); elsewhere install FFmpeg 4-8 yourself.
# Without them raystream still works: auto then uses decord or PyAV, and says nothing is wrong with that.
ffmpeg:
	@ldconfig -p 2>/dev/null | grep -q 'libavcodec\.so' || ! command -v apt-get >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ffmpeg >/dev/null; }

install: torch ffmpeg
	$(BIN)/python -m pip install -q -e ".[torchcodec]"

# timm (the reference of the timm-checkpoint tests) is installed without its dependencies: its `torchvision`
# requirement would let pip pull the newest torchvision and, with it, the newest (CUDA) torch over the CPU one. The
# timm tests run where a torchvision matching the installed torch imports (a CUDA torch with PyPI's torchvision, or a
# CPU torch with torchvision from download.pytorch.org/whl/cpu); elsewhere they are skipped, saying why.
install-dev: torch ffmpeg
	$(BIN)/python -m pip install -q -e ".[dev,torchcodec]"
	$(BIN)/python -m pip install -q --no-deps "timm==$(TIMM_VERSION)"

demo: install
	$(BIN)/raystream sweep

test: install-dev
	$(BIN)/python -m pytest tests -n 2 --durations=25

test-fast: install-dev
	$(BIN)/python -m pytest tests -n 2 -m "not slow"

# Everything raystream writes under the working directory (docs/operations.md, "Files and services"), the venv and pip's egg-info.
clean:
	rm -rf $(VENV) raystream.egg-info suite_cpu.tsv mlflow.db .mlflow.db.*.tmp mlruns* raystream_results reports outputs multirun .pytest_cache .hypothesis
