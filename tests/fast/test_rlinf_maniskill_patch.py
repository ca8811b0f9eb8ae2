"""RLinf v0.3's ManiSkill env with the VLM reward: the patch applies next to LIBERO's, checks and
reverts, stays minimal, and the ManiSkill run configs compose and differ only in the reward."""

from __future__ import annotations

import os
import py_compile
import re
from pathlib import Path

from tests.helpers.rlinf import REPO, RUNS, apply_patches, assert_runs_differ_only_in_reward, flatten, unpack

TARGET = Path("rlinf/envs/maniskill/maniskill_env.py")


def _config(run: str) -> str:
    return f"maniskill_ppo_mlp_{run}"


# --- the patch and the configs ----------------------------------------------------------------


def test_every_patch_applies_checks_and_reverts_the_maniskill_env_too(tmp_path):
    tree = unpack(tmp_path / "rlinf")
    target = tree / TARGET
    pristine = target.read_text()
    first = apply_patches(str(tree))
    assert first.returncode == 0, first.stderr
    assert f"applied to {TARGET}" in first.stdout and "applied to rlinf/envs/libero/libero_env.py" in first.stdout
    py_compile.compile(str(target), doraise=True)
    assert "reward_client.env_adapters" in target.read_text()  # the patch keeps the old path (an alias)
    for run in RUNS:
        assert (tree / "examples" / "embodiment" / "config" / f"{_config(run)}.yaml").is_file()
    check = apply_patches(str(tree), "--check")
    assert check.returncode == 0 and "patch: applied (maniskill_env.patch)" in check.stdout
    second = apply_patches(str(tree))
    assert "patch: already applied (maniskill_env.patch)" in second.stdout
    assert apply_patches(str(tree), "--revert").returncode == 0
    assert target.read_text() == pristine
    assert apply_patches(str(tree), "--check").returncode == 1


def test_a_patch_that_cannot_apply_leaves_every_file_alone(tmp_path):
    tree = unpack(tmp_path / "rlinf")
    libero = tree / "rlinf" / "envs" / "libero" / "libero_env.py"
    pristine = libero.read_text()
    target = tree / TARGET
    target.write_text(target.read_text().replace("step_reward = self._calc_step_reward(_reward, infos)", "pass"))
    result = apply_patches(str(tree))
    assert result.returncode == 1 and "maniskill_env.patch does not apply" in result.stderr
    assert libero.read_text() == pristine


def test_maniskill_patch_is_minimal():
    diff = (REPO / "rlinf_patches" / "v0.3" / "maniskill_env.patch").read_text()
    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    removed = [line for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    assert not removed and len(added) <= 16
    assert re.findall(r"^\+\+\+ b/(.*)$", diff, re.M) == [str(TARGET)]


def test_maniskill_run_configs_compose_and_differ_only_in_reward(rlinf_trees):
    configs = rlinf_trees["config"]
    flat = {run: flatten(_compose_maniskill(configs, run)) for run in RUNS}
    assert_runs_differ_only_in_reward(flat)
    for run in RUNS:
        f = flat[run]
        assert f["env.train.reward_mode"] == "raw"  # the adapter needs it: the judge's value passes through
        for split in ("train", "eval"):  # frames for the judge, the same state input for the policy
            assert f[f"env.{split}.init_params.obs_mode"] == "rgb" and f[f"env.{split}.use_full_state"] is True
        assert f["env.train.init_params.id"] == "PickCube-v1"
    # the rest is RLinf's own PPO config
    base = flatten(_compose_maniskill(configs, None))
    for key in ("algorithm.adv_type", "algorithm.loss_type", "actor.model.model_type", "env.train.total_num_envs"):
        assert flat["runA"][key] == base[key]


def _compose_maniskill(config_dir: Path, run: str | None) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    os.environ["EMBODIED_PATH"] = str(config_dir.parent)
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.1"):
        cfg = compose(config_name=_config(run) if run else "maniskill_ppo_mlp")
    return OmegaConf.to_container(cfg, resolve=False)
