#!/usr/bin/env bash
# Run on a machine with an NVIDIA GPU: saves raw `nvidia-smi -L` and `nvidia-smi -q -x`
# (to add as test fixtures), then runs llmgw's discovery through NVML and through
# nvidia-smi and says whether both see the same devices, and saves `llmgw doctor -o json`
# (doctor.json; its exit code in doctor.exit: 2 is expected, no control service answers).
# Output goes to ${OUT:-./gpu-check}. Needs python3 with nvidia-ml-py and PyYAML; wheels in
# ./.device-wheels are used if present. The doctor runs from ./.venv when there is one, else
# llmgw is installed into the check's own virtualenv.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-./gpu-check}"
mkdir -p "$out"
nvidia-smi -L > "$out/nvidia-smi-L.txt" 2> "$out/nvidia-smi-L.err"; echo "nvidia-smi -L: exit $?"
nvidia-smi -q -x > "$out/nvidia-smi-q-x.xml" 2> "$out/nvidia-smi-q-x.err"; echo "nvidia-smi -q -x: exit $?"
nvidia-smi --version > "$out/nvidia-smi-version.txt" 2>&1
py=python3
if ! $py -c 'import pynvml, yaml' 2>/dev/null; then
  $py -m venv /tmp/llmgw-gpu-check && py=/tmp/llmgw-gpu-check/bin/python
  if [ -d .device-wheels ]; then
    $py -m pip install -q --no-index --find-links .device-wheels nvidia-ml-py pyyaml
  else
    $py -m pip install -q nvidia-ml-py pyyaml
  fi
fi
PYTHONPATH=. $py scripts/gpu_check.py "$out"
rc=$?
llmgw=.venv/bin/llmgw
if [ ! -x "$llmgw" ]; then
  [ "$py" = python3 ] && { python3 -m venv /tmp/llmgw-gpu-check && py=/tmp/llmgw-gpu-check/bin/python; }
  if [ -d .device-wheels ]; then
    $py -m pip install -q --no-index --find-links .device-wheels . >/dev/null 2>"$out/doctor.err"
  else
    $py -m pip install -q . >/dev/null 2>"$out/doctor.err"
  fi
  llmgw="$(dirname "$py")/llmgw"
fi
if [ -x "$llmgw" ]; then
  "$llmgw" doctor --devices auto --control-url http://127.0.0.1:1 -o json \
    > "$out/doctor.json" 2>>"$out/doctor.err"
  echo $? > "$out/doctor.exit"
  echo "llmgw doctor -o json: exit $(cat "$out/doctor.exit") (saved in $out/doctor.json)"
else
  echo "llmgw could not be installed for the doctor: see $out/doctor.err"
fi
exit $rc
