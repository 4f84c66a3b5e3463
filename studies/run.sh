#!/usr/bin/env bash
# Reruns a study of docs/results.md from the repository: its sweeps one after the other, niced, in the background,
# resumable, then its reports. A study is a file studies/<name>.queue: one step a line, "<label> <overrides...>": a
# sweep (its overrides), or `make-footage`, `pretrain-start*` (that command) or `report` (`raystream report` flags).
#
#   bash studies/run.sh map            # the map's five matched-drift sweeps, then `raystream report --map`
#   bash studies/run.sh projection     # global vs the published dim0 projection on the regime and the footage
#   bash studies/run.sh --status map   # which sweeps are done
#
# Everything goes under $RAYSTREAM_STUDY_DIR (default ~/raystream-study/<study>): the MLflow store (mlflow.db), the
# Ray results, a log per sweep, and a snapshot of the source taken when the study first starts (`git archive` of
# raystream/ and sweeps/, on PYTHONPATH), so edits to the tree never reach a running study. Started again after an
# interruption (a killed process, a reboot), it skips the sweeps marked done and resumes the one that was running:
# the same overrides name the same sweep run, whose lock it takes over and whose unfinished trials Tune runs.
# Concurrency: $RAYSTREAM_STUDY_TRIALS trials at a time (default 2: a trial's worker trains on one core).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
status_only=0
if [ "${1:-}" = "--status" ]; then status_only=1; shift; fi
study="${1:?usage: bash studies/run.sh [--status] <study> (one of: $(cd "$here" && ls *.queue | sed 's/\.queue$//' | tr '\n' ' '))}"
queue="$here/$study.queue"
[ -f "$queue" ] || { echo "studies/run.sh: no study '$study': expected $queue" >&2; exit 2; }
dir="${RAYSTREAM_STUDY_DIR:-$HOME/raystream-study}/$study"
mkdir -p "$dir/logs" "$dir/done"
py="${RAYSTREAM_PYTHON:-$repo/.venv/bin/python}"
[ -x "$py" ] || py="$(command -v python3)"

if [ "$status_only" = 1 ]; then
  while read -r label _; do
    case "$label" in ''|'#'*|report) continue;; esac
    if [ -f "$dir/done/$label" ]; then echo "$label: done ($(cat "$dir/done/$label"))"; else echo "$label: not done"; fi
  done < "$queue"
  exit 0
fi

if [ ! -d "$dir/src" ]; then  # the source the whole study runs, fixed at its first start
  mkdir -p "$dir/src.tmp" && (cd "$repo" && git archive HEAD raystream sweeps | tar -x -C "$dir/src.tmp")
  if [ -n "$(cd "$repo" && git status --porcelain -- raystream sweeps)" ]; then  # uncommitted edits count too
    (cd "$repo" && tar -c $(git ls-files -m -o --exclude-standard -- raystream sweeps)) | tar -x -C "$dir/src.tmp"
  fi
  (cd "$repo" && git rev-parse HEAD) > "$dir/src.tmp/COMMIT" && mv "$dir/src.tmp" "$dir/src"
fi
export PYTHONPATH="$dir/src${PYTHONPATH:+:$PYTHONPATH}"
export MLFLOW_TRACKING_URI="sqlite:///$dir/mlflow.db"
trials="${RAYSTREAM_STUDY_TRIALS:-2}"
echo "study $study: source $(cat "$dir/src/COMMIT"), store $dir"

while read -r label rest; do
  case "$label" in ''|'#'*) continue;; esac
  if [ "$label" = report ]; then
    (cd "$dir" && nice -n 19 "$py" -m raystream.cli report $rest --out "$dir/report") > "$dir/logs/report.log" 2>&1 \
      && echo "report: $dir/report" || echo "report failed: $dir/logs/report.log"
    continue
  fi
  [ -f "$dir/done/$label" ] && { echo "$label: done"; continue; }
  case "$label" in  # the steps that are not sweeps: real footage fetched, a start pretrained (cached by its config)
    make-footage|pretrain-start*)
      if [ "$label" = make-footage ]; then cmd=(data make-footage); else cmd=(pretrain-start); fi
      (cd "$dir" && nice -n 19 "$py" -m raystream.cli "${cmd[@]}" $rest) >> "$dir/logs/$label.log" 2>&1 \
        || { echo "$label: failed, see $dir/logs/$label.log; run the study again to resume it" >&2; exit 1; }
      date -u +%FT%TZ > "$dir/done/$label"; echo "$label: done"; continue;;
  esac
  echo "$label: running ($(date -u +%T)), log $dir/logs/$label.log"
  start=$(date +%s)
  (cd "$dir" && nice -n 19 "$py" -m raystream.cli sweep $rest trainer.storage_path="$dir/results" \
      sweep.max_concurrent_trials="$trials") >> "$dir/logs/$label.log" 2>&1 \
    || { echo "$label: failed (exit $?), see $dir/logs/$label.log; run the study again to resume it" >&2; exit 1; }
  echo "$(date -u +%FT%TZ) wall $(( $(date +%s) - start )) s this start" > "$dir/done/$label"
  echo "$label: done in $(( $(date +%s) - start )) s"
done < "$queue"
