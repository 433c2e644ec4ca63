#!/usr/bin/env bash
# Why the first flag after a pause is late (docs/tracing.md, "Links that sleep"):
# scripts/flag_latency_probe.py at 2 ranks (one per GPU), untraced, after a pause of idle
# GPUs or of busy ones (every SM spinning on its clock, no traffic between GPUs), with
# reads of the peer's memory timed just before the launch (--warm-lines: how many lines;
# --warm-flags: the flags' own line); first the driver's NVLink power settings, read only.
# SETTINGS lists "idle|busy MS [probe options]" runs separated by commas; TRACED=1 traces the
# probe (each direction's flag lateness on the aligned clocks) instead of timing round trips.
set -u
# shellcheck source=scripts/gpu_env.sh
. "$(dirname "$0")/gpu_env.sh"
nvidia-smi nvlink -gLowPwrInfo -i 0 2>&1 | head -20
default="idle 100,busy 100,idle 100 --warm-lines 1,idle 100 --warm-flags,idle 100 --warm-lines 64,idle 100 --warm-lines 1024,idle 20 --warm-lines 1"
IFS=, read -r -a settings <<< "${SETTINGS:-$default}"
for setting in "${settings[@]}"; do
  read -r -a words <<< "$setting"
  mode=${words[0]} ms=${words[1]} options=("${words[@]:2}")
  name=$(echo "${mode}_${ms}ms ${options[*]}" | tr -s ' -' '_' | sed 's/_$//')
  echo "== $setting"
  timeout 120 python -m iris.run -n 2 scripts/flag_latency_probe.py $([ -z "${TRACED:-}" ] && echo --untraced) --repeats "${REPEATS:-3}" \
    --idle-ms "$ms" $([ "$mode" = busy ] && echo --busy) "${options[@]}" --out "$out/link_wake_$name.json" 2>&1 \
    | grep -v -e Warning -e "^\[rank"
done
