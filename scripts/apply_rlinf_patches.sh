#!/usr/bin/env bash
# Patch an RLinf v0.3 checkout so its LIBERO env can take its reward from the VLM reward server,
# and install the run A/B/C configs next to RLinf's own.
#
#   bash scripts/apply_rlinf_patches.sh RLINF_DIR            apply (a second apply changes nothing)
#   bash scripts/apply_rlinf_patches.sh RLINF_DIR --check    exit 0 if applied and configs installed
#   bash scripts/apply_rlinf_patches.sh RLINF_DIR --revert   undo both
#
# RLINF_DIR holds rlinf/envs/libero/libero_env.py (a git checkout at v0.3, or the unpacked
# rlinf==0.3.0 wheel). run_embodiment.sh puts the checkout on PYTHONPATH, so patch the checkout,
# not an installed wheel. The patched env imports reward_client only when
# env.train.reward_model.enable is set: `pip install <this repo>` in RLinf's environment.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PATCH="$ROOT/rlinf_patches/libero_env.patch"
CONFIGS=("$ROOT"/configs/rlinf/*.yaml)
TARGET=rlinf/envs/libero/libero_env.py

die() { echo "apply_rlinf_patches: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 RLINF_DIR [--check|--revert]"
dir=$(cd "$1" 2>/dev/null && pwd) || die "no such directory: $1"
mode=${2:-apply}
[ -f "$dir/$TARGET" ] || die "$dir has no $TARGET (is it an RLinf v0.3 checkout?)"
config_dir="$dir/examples/embodiment/config"

# Paths in the patch are relative to RLINF_DIR: keep git from using a repository above it.
git_apply() { (cd "$dir" && GIT_CEILING_DIRECTORIES="$(dirname "$dir")" git apply "$@" "$PATCH"); }
applied() { git_apply --reverse --check >/dev/null 2>&1; }
applicable() { git_apply --check >/dev/null 2>&1; }
configs_installed() {
  for c in "${CONFIGS[@]}"; do cmp -s "$c" "$config_dir/$(basename "$c")" || return 1; done
}

case "$mode" in
  apply)
    if applied; then
      echo "patch: already applied"
    elif applicable; then
      git_apply
      echo "patch: applied to $TARGET"
    else
      die "the patch does not apply to $dir/$TARGET (not RLinf v0.3, or edited locally); see $PATCH"
    fi
    [ -f "$config_dir/libero_10_grpo_openvlaoft.yaml" ] || \
      echo "note: $config_dir has no RLinf base config (an unpacked wheel has no examples/): installing the run configs anyway" >&2
    mkdir -p "$config_dir"
    for c in "${CONFIGS[@]}"; do cp "$c" "$config_dir/"; done
    echo "configs: installed $(printf '%s ' "${CONFIGS[@]##*/}")into examples/embodiment/config/"
    ;;
  --check)
    ok=0
    if applied; then echo "patch: applied"; else echo "patch: NOT applied"; ok=1; fi
    if configs_installed; then echo "configs: installed"; else echo "configs: NOT installed (or differ)"; ok=1; fi
    exit $ok
    ;;
  --revert)
    if applied; then git_apply --reverse; echo "patch: reverted"; else echo "patch: not applied, nothing to revert"; fi
    for c in "${CONFIGS[@]}"; do
      installed="$config_dir/$(basename "$c")"
      if cmp -s "$c" "$installed"; then rm "$installed"; echo "configs: removed $(basename "$c")"
      elif [ -f "$installed" ]; then echo "configs: kept $(basename "$c") (edited since install)"; fi
    done
    ;;
  *) die "unknown mode '$mode' (use --check or --revert)" ;;
esac
