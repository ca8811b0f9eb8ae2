#!/usr/bin/env bash
# Patch an RLinf checkout so its LIBERO and ManiSkill envs can take their reward from the VLM
# reward server, and install the run configs (A/B/C of each) next to RLinf's own.
#
#   bash scripts/apply_rlinf_patches.sh RLINF_DIR            apply (a second apply changes nothing)
#   bash scripts/apply_rlinf_patches.sh RLINF_DIR --check    exit 0 if applied and configs installed
#   bash scripts/apply_rlinf_patches.sh RLINF_DIR --revert   undo both
#   bash scripts/apply_rlinf_patches.sh RLINF_DIR --which    print which RLinf it is (main or v0.3)
#
# Two RLinf versions are supported; which one RLINF_DIR holds is read from its env worker
# (rlinf/workers/env/env_worker.py), never from a flag:
#   main  (RLinf's main branch, a3816b5 and code like it): the worker keeps `trajectory_builders`
#         and steps envs in `_run_interact_once` (shared by EnvWorker and AsyncEnvWorker, so
#         EmbodiedRunner and AsyncEmbodiedRunner both get the hook): rlinf_patches/main/,
#         configs/rlinf/main/
#   v0.3  (RLinf v0.3.x): the worker keeps `rollout_results`: rlinf_patches/v0.3/, configs/rlinf/
# Every patch of the version's set is applied, checked and reverted (all apply, or none is).
# RLINF_DIR is a git checkout, or (v0.3) the unpacked rlinf==0.3.0 wheel. run_embodiment.sh puts
# the checkout on PYTHONPATH, so patch the checkout, not an installed wheel. The patched envs
# import reward_client only when env.train.reward_model.enable is set: `pip install <this repo>`
# in RLinf's environment.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

die() { echo "apply_rlinf_patches: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 RLINF_DIR [--check|--revert]"
dir=$(cd "$1" 2>/dev/null && pwd) || die "no such directory: $1"
mode=${2:-apply}
case "$mode" in apply | --check | --revert | --which) ;; *) die "unknown mode '$mode' (use --check, --revert or --which)" ;; esac

# Which RLinf: the env worker's own code says (the patches add nothing these tests look at).
worker="$dir/rlinf/workers/env/env_worker.py"
looked_for="rlinf/workers/env/env_worker.py with 'self.rollout_results' (v0.3) or with 'self.trajectory_builders' and '_run_interact_once' (main)"
if [ -f "$worker" ] && grep -q 'self\.trajectory_builders' "$worker" && grep -q 'def _run_interact_once' "$worker"; then
  version=main
  CONFIGS=("$ROOT"/configs/rlinf/main/*.yaml)
elif [ -f "$worker" ] && grep -q 'self\.rollout_results' "$worker"; then
  version=v0.3
  CONFIGS=("$ROOT"/configs/rlinf/*.yaml)
else
  die "$dir is not RLinf v0.3 nor RLinf main a3816b5-compatible: looked for $looked_for"
fi
if [ "$mode" = --which ]; then echo "$version"; exit 0; fi
PATCHES=("$ROOT"/rlinf_patches/"$version"/*.patch)
echo "rlinf: $version ($dir)"
target() { sed -n 's|^+++ b/||p' "$1" | head -1; }
for patch in "${PATCHES[@]}"; do
  [ -f "$dir/$(target "$patch")" ] || die "$dir has no $(target "$patch") (RLinf $version has one: a partial checkout?)"
done
config_dir="$dir/examples/embodiment/config"

# Paths in the patches are relative to RLINF_DIR: keep git from using a repository above it.
git_apply() { local patch=$1; shift; (cd "$dir" && GIT_CEILING_DIRECTORIES="$(dirname "$dir")" git apply "$@" "$patch"); }
applied() { git_apply "$1" --reverse --check >/dev/null 2>&1; }
applicable() { git_apply "$1" --check >/dev/null 2>&1; }
# A checkout patched by this project before a patch changed holds the patch's earlier revision
# (rlinf_patches/<version>/earlier/<name>): apply updates it, --revert undoes it, --check says so.
applied_earlier() {
  local old; old="$(dirname "$1")/earlier/$(basename "$1")"
  if [ -f "$old" ] && applied "$old"; then echo "$old"; fi
}
configs_installed() {
  for c in "${CONFIGS[@]}"; do cmp -s "$c" "$config_dir/$(basename "$c")" || return 1; done
}

case "$mode" in
  apply)
    for patch in "${PATCHES[@]}"; do  # every patch can go in before any does
      applied "$patch" || applicable "$patch" || [ -n "$(applied_earlier "$patch")" ] \
        || die "rlinf_patches/$version/$(basename "$patch") does not apply to $dir/$(target "$patch") (edited locally, or an RLinf $version this patch set does not know)"
    done
    for patch in "${PATCHES[@]}"; do
      old=$(applied_earlier "$patch")
      if applied "$patch"; then
        echo "patch: already applied ($(basename "$patch"))"
      elif [ -n "$old" ]; then
        git_apply "$old" --reverse
        git_apply "$patch"
        echo "patch: updated from its earlier revision in $(target "$patch") ($(basename "$patch"))"
      else
        git_apply "$patch"
        echo "patch: applied to $(target "$patch") ($(basename "$patch"))"
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
      elif [ -n "$(applied_earlier "$patch")" ]; then
        echo "patch: an earlier revision is applied, apply again to update ($(basename "$patch"))"; ok=1
      else echo "patch: NOT applied ($(basename "$patch"))"; ok=1; fi
    done
    if configs_installed; then echo "configs: installed"; else echo "configs: NOT installed (or differ)"; ok=1; fi
    exit $ok
    ;;
  --revert)
    for patch in "${PATCHES[@]}"; do
      old=$(applied_earlier "$patch")
      if applied "$patch"; then git_apply "$patch" --reverse; echo "patch: reverted ($(basename "$patch"))"
      elif [ -n "$old" ]; then git_apply "$old" --reverse; echo "patch: reverted its earlier revision ($(basename "$patch"))"
      else echo "patch: not applied, nothing to revert ($(basename "$patch"))"; fi
    done
    for c in "${CONFIGS[@]}"; do
      installed="$config_dir/$(basename "$c")"
      if cmp -s "$c" "$installed"; then rm "$installed"; echo "configs: removed $(basename "$c")"
      elif [ -f "$installed" ]; then echo "configs: kept $(basename "$c") (edited since install)"; fi
    done
    ;;
esac
