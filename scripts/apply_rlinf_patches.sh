#!/usr/bin/env bash
# Patch an RLinf v0.3 checkout so its LIBERO and ManiSkill envs can take their reward from the VLM
# reward server, and install the run configs (A/B/C of each) next to RLinf's own.
#
#   bash scripts/apply_rlinf_patches.sh RLINF_DIR            apply (a second apply changes nothing)
#   bash scripts/apply_rlinf_patches.sh RLINF_DIR --check    exit 0 if applied and configs installed
#   bash scripts/apply_rlinf_patches.sh RLINF_DIR --revert   undo both
#
# Every patch in rlinf_patches/ is applied, checked and reverted (all apply, or none is applied).
# RLINF_DIR holds the files they patch (rlinf/envs/libero/libero_env.py, ...: a git checkout at
# v0.3, or the unpacked rlinf==0.3.0 wheel). run_embodiment.sh puts the checkout on PYTHONPATH, so
# patch the checkout, not an installed wheel. The patched envs import reward_client only when
# env.train.reward_model.enable is set: `pip install <this repo>` in RLinf's environment.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PATCHES=("$ROOT"/rlinf_patches/*.patch)
CONFIGS=("$ROOT"/configs/rlinf/*.yaml)

die() { echo "apply_rlinf_patches: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 RLINF_DIR [--check|--revert]"
dir=$(cd "$1" 2>/dev/null && pwd) || die "no such directory: $1"
mode=${2:-apply}
target() { sed -n 's|^+++ b/||p' "$1" | head -1; }
for patch in "${PATCHES[@]}"; do
  [ -f "$dir/$(target "$patch")" ] || die "$dir has no $(target "$patch") (is it an RLinf v0.3 checkout?)"
done
config_dir="$dir/examples/embodiment/config"

# Paths in the patches are relative to RLINF_DIR: keep git from using a repository above it.
git_apply() { local patch=$1; shift; (cd "$dir" && GIT_CEILING_DIRECTORIES="$(dirname "$dir")" git apply "$@" "$patch"); }
applied() { git_apply "$1" --reverse --check >/dev/null 2>&1; }
applicable() { git_apply "$1" --check >/dev/null 2>&1; }
configs_installed() {
  for c in "${CONFIGS[@]}"; do cmp -s "$c" "$config_dir/$(basename "$c")" || return 1; done
}

case "$mode" in
  apply)
    for patch in "${PATCHES[@]}"; do  # every patch can go in before any does
      applied "$patch" || applicable "$patch" \
        || die "$(basename "$patch") does not apply to $dir/$(target "$patch") (not RLinf v0.3, or edited locally)"
    done
    for patch in "${PATCHES[@]}"; do
      if applied "$patch"; then
        echo "patch: already applied ($(basename "$patch"))"
      else
        git_apply "$patch"
        echo "patch: applied to $(target "$patch")"
      fi
    done
    [ -d "$config_dir" ] || \
      echo "note: $dir has no examples/embodiment/config (an unpacked wheel has no examples/): installing the run configs anyway" >&2
    mkdir -p "$config_dir"
    for c in "${CONFIGS[@]}"; do cp "$c" "$config_dir/"; done
    echo "configs: installed $(printf '%s ' "${CONFIGS[@]##*/}")into examples/embodiment/config/"
    ;;
  --check)
    ok=0
    for patch in "${PATCHES[@]}"; do
      if applied "$patch"; then echo "patch: applied ($(basename "$patch"))"
      else echo "patch: NOT applied ($(basename "$patch"))"; ok=1; fi
    done
    if configs_installed; then echo "configs: installed"; else echo "configs: NOT installed (or differ)"; ok=1; fi
    exit $ok
    ;;
  --revert)
    for patch in "${PATCHES[@]}"; do
      if applied "$patch"; then git_apply "$patch" --reverse; echo "patch: reverted ($(basename "$patch"))"
      else echo "patch: not applied, nothing to revert ($(basename "$patch"))"; fi
    done
    for c in "${CONFIGS[@]}"; do
      installed="$config_dir/$(basename "$c")"
      if cmp -s "$c" "$installed"; then rm "$installed"; echo "configs: removed $(basename "$c")"
      elif [ -f "$installed" ]; then echo "configs: kept $(basename "$c") (edited since install)"; fi
    done
    ;;
  *) die "unknown mode '$mode' (use --check or --revert)" ;;
esac
