#!/usr/bin/env bash
# What the GPU machine needs for benchmarks/gpu_campaign.sh, gathered here (where pip and PyAV work) into one
# git-ignored folder that the device call carries (docs/benchmarks.md "The GPU campaign"):
#
#   bash benchmarks/gpu_campaign_pack.sh [CARRY]      # CARRY: default .campaign (under the repository root)
#
#   CARRY/wheels  the wheels of what raystream needs there and the machine lacks, at the versions installed here:
#                 av, decord, hydra-core, omegaconf (manylinux x86_64, Python 3.12) and antlr4-python3-runtime (an
#                 sdist on PyPI: built into a wheel here); `pip download --no-deps`
#   CARRY/demo    the demo videos every preset of the campaign reads (raystream.bench.campaign --prepare)
#   CARRY/commit  the checkout's commit, for the campaign's table
#
# TORCHCODEC=VERSION (e.g. 0.11.0, the build PyPI has for the GPU machine's torch 2.11 + CUDA 13) adds torchcodec's
# CUDA wheel and, in CARRY/lib, the two NVIDIA NPP libraries it links (libnppc, libnppicc from nvidia-npp==$NPP,
# default 13.0.2.21), and leaves decord out (the 64 MiB; decord was measured on the H200 on 2026-11-27). There
# gpu_campaign.sh lets torchcodec load PyAV's bundled FFmpeg 8 (built with NVDEC), so the campaign measures
# torchcodec on the CPU and on NVDEC.
# PYTHON: raystream's interpreter (default .venv/bin/python where there is one). Then it checks that the checkout's tracked files and CARRY fit the 64 MiB a call carries, and prints the command.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
CARRY=${1:-.campaign}
LIMIT_MIB=64
version() {  # the version installed here, or stop naming the package
    "$PYTHON" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null ||
        { echo "gpu_campaign_pack: $1 is not installed for $PYTHON (set PYTHON to raystream's interpreter)" >&2; kill $$; }
}
TORCHCODEC=${TORCHCODEC:-}
NPP=${NPP:-13.0.2.21}
mkdir -p "$CARRY/wheels"
rm -rf "$CARRY"/wheels/*.whl "$CARRY/lib"
if [ -n "$TORCHCODEC" ]; then
    wanted=("torchcodec==$TORCHCODEC")
else
    wanted=("decord==$(version decord)")
fi
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux2010_x86_64 --platform manylinux1_x86_64 -d "$CARRY/wheels" \
    "av==$(version av)" "hydra-core==$(version hydra-core)" "omegaconf==$(version omegaconf)" "${wanted[@]}"
if [ -n "$TORCHCODEC" ]; then
    npp_dir=$(mktemp -d)
    "$PYTHON" -m pip download -q --no-deps -d "$npp_dir" "nvidia-npp==$NPP"
    mkdir -p "$CARRY/lib"
    "$PYTHON" - "$npp_dir" "$CARRY/lib" <<'PY'
import glob, sys, zipfile
from pathlib import Path
wheel = zipfile.ZipFile(glob.glob(sys.argv[1] + "/nvidia_npp-*.whl")[0])
for name in wheel.namelist():
    if Path(name).name.split(".so")[0] in ("libnppc", "libnppicc"):
        Path(sys.argv[2], Path(name).name).write_bytes(wheel.read(name))
PY
    rm -rf "$npp_dir"
fi
"$PYTHON" -m pip wheel -q --no-deps -w "$CARRY/wheels" "antlr4-python3-runtime==$(version antlr4-python3-runtime)"
"$PYTHON" -m raystream.bench.campaign --prepare --demo-dir "$CARRY/demo" >/dev/null
git rev-parse --short HEAD > "$CARRY/commit"  # the campaign's table names it (the copy there may have no .git)
tracked=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
carried=$(du -sb "$CARRY" | cut -f1)
total_mib=$(( (tracked + carried) / 1048576 ))
echo "carry $CARRY: $(( carried / 1048576 )) MiB; with the tracked files $total_mib MiB of $LIMIT_MIB"
ls -l "$CARRY/wheels"
if [ "$total_mib" -ge "$LIMIT_MIB" ]; then
    echo "gpu_campaign_pack: $total_mib MiB is over the $LIMIT_MIB MiB a device call carries" >&2
    exit 1
fi
echo "on the GPU machine (one call, about 8 minutes):"
echo "  run(command=\"bash benchmarks/gpu_campaign.sh --out \$OUT\", carry=[\"$CARRY\"], timeout_s=560)"
