#!/usr/bin/env bash
# The GPU campaign in one command (raystream/bench/campaign.py; docs/benchmarks.md "The GPU campaign"):
#
#   bash benchmarks/gpu_campaign.sh --out DIR [--device cuda|cpu] [--tiny] [--budget S] [--presets A,B,...]
#                                   [--peak-tflops T] [--optimizer-compile on|off]   # raystream.bench.campaign's
#
# On the GPU machine (CUDA torch, numpy, scikit-learn, scikit-image, pyarrow; no Ray, MLflow, Hydra, OmegaConf,
# decord, PyAV, no network): installs the wheels benchmarks/gpu_campaign_pack.sh put into $CAMPAIGN_CARRY/wheels
# (default .campaign/wheels) into a folder of its own, unless they import already, then runs the campaign on the
# demo videos in $CAMPAIGN_CARRY/demo. $PYTHON (default python3) runs it; exit as the campaign's (0, or 1 when a
# phase failed: campaign.json says which).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
CARRY=${CAMPAIGN_CARRY:-.campaign}
if ! "$PYTHON" -c "import hydra, omegaconf, av" 2>/dev/null; then
    if ! ls "$CARRY"/wheels/*.whl >/dev/null 2>&1; then
        echo "gpu_campaign: hydra-core, omegaconf or av do not import and $CARRY/wheels holds no wheels:" \
             "run benchmarks/gpu_campaign_pack.sh where pip works, and carry $CARRY" >&2
        exit 2
    fi
    SITE=${TMPDIR:-/tmp}/raystream-campaign-site
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$CARRY"/wheels/*.whl || exit 2
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
    if [ -d "$SITE/torchcodec" ] && [ -d "$SITE/av.libs" ]; then
        # torchcodec links libavcodec.so.62 and the rest by their plain names; PyAV's wheel bundles FFmpeg 8 (with
        # NVDEC) under hashed names, which find each other through their own folder: link the plain names there.
        # NPP (CARRY/lib) and torch's CUDA libraries (site-packages/nvidia/*/lib) complete torchcodec's CUDA build.
        for f in "$SITE"/av.libs/lib{avutil,avcodec,avformat,avdevice,avfilter,swscale,swresample}-*.so.*; do
            base=$(basename "$f")
            ln -sf "$base" "$SITE/av.libs/${base%%-*}.so.$(echo "${base#*.so.}" | cut -d. -f1)"
        done
        nvidia=$("$PYTHON" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__path__[0]), 'nvidia'))")
        libs=$SITE/av.libs:$(realpath -m "$CARRY/lib")
        libs+=$(find "$nvidia" -maxdepth 3 -type d -name lib -printf ':%p' 2>/dev/null)
        export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
exec "$PYTHON" -m raystream.bench.campaign --demo-dir "$CARRY/demo" "$@"
