"""RLinf v0.3's patch and run configs: the patch applies, checks, reverts and stays minimal; the
run configs compose next to RLinf's own config groups and differ only where they should."""

from __future__ import annotations

import os
import py_compile
import re
import subprocess
from pathlib import Path

from tests.helpers.rlinf import REPO, RUN_D, RUNS, apply_patches, assert_runs_differ_only_in_reward, flatten, unpack

# --- the patch and the configs ----------------------------------------------------------------


def test_patch_applies_checks_is_idempotent_and_reverts(tmp_path):
    tree = unpack(tmp_path / "rlinf")
    target = tree / "rlinf" / "envs" / "libero" / "libero_env.py"
    pristine = target.read_text()
    assert apply_patches(str(tree), "--check").returncode == 1

    first = apply_patches(str(tree))
    assert first.returncode == 0, first.stderr
    assert "applied to" in first.stdout
    patched = target.read_text()
    py_compile.compile(str(target), doraise=True)
    assert "reward_client.rlinf_hook" in patched and patched != pristine
    for run in RUNS:
        assert (tree / "examples" / "embodiment" / "config" / f"libero_10_grpo_openvlaoft_{run}.yaml").is_file()

    second = apply_patches(str(tree))
    assert second.returncode == 0 and "already applied" in second.stdout
    assert target.read_text() == patched  # a second apply changes nothing
    check = apply_patches(str(tree), "--check")
    assert check.returncode == 0 and "patch: applied" in check.stdout

    revert = apply_patches(str(tree), "--revert")
    assert revert.returncode == 0, revert.stderr
    assert target.read_text() == pristine
    assert not list((tree / "examples" / "embodiment" / "config").glob("*_run*.yaml"))
    assert apply_patches(str(tree), "--check").returncode == 1


def test_a_checkout_patched_before_views_is_updated_by_applying_again(tmp_path):
    # the LIBERO patch's earlier revision handed the hook obs["main_images"]; the current one the
    # whole observation (reward_model.views): applying again updates it in place, revert undoes it
    tree = unpack(tmp_path / "rlinf")
    target = tree / "rlinf" / "envs" / "libero" / "libero_env.py"
    pristine = target.read_text()
    earlier = REPO / "rlinf_patches" / "v0.3" / "earlier" / "libero_env.patch"
    subprocess.run(
        ["git", "apply", str(earlier)],
        cwd=tree,
        check=True,
        env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path)},
    )
    assert 'on_reset(env_idx, obs["main_images"])' in target.read_text()
    check = apply_patches(str(tree), "--check")
    assert check.returncode == 1 and "an earlier revision is applied" in check.stdout
    update = apply_patches(str(tree))
    assert update.returncode == 0, update.stderr
    assert "updated from its earlier revision" in update.stdout
    assert "on_reset(env_idx, obs)" in target.read_text() and 'obs["main_images"]' not in target.read_text()
    assert "already applied" in apply_patches(str(tree)).stdout
    assert apply_patches(str(tree), "--revert").returncode == 0 and target.read_text() == pristine


def test_patch_is_minimal():
    diff = (REPO / "rlinf_patches" / "v0.3" / "libero_env.patch").read_text()
    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    removed = [line for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    assert len(removed) == 1 and "self._calc_step_reward(terminations)" in removed[0]
    assert len(added) <= 25
    assert re.findall(r"^\+\+\+ b/(.*)$", diff, re.M) == ["rlinf/envs/libero/libero_env.py"]


def test_apply_refuses_a_directory_that_is_not_rlinf(tmp_path):
    result = apply_patches(str(tmp_path))
    assert result.returncode == 1 and "is not RLinf v0.3 nor RLinf main" in result.stderr


def _compose(config_dir: Path, run: str) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    os.environ["EMBODIED_PATH"] = str(config_dir.parent)
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.1"):
        cfg = compose(config_name=run if run.startswith("libero_") else f"libero_10_grpo_openvlaoft_{run}")
    return OmegaConf.to_container(cfg, resolve=False)


def test_run_configs_compose_and_differ_only_in_reward(rlinf_trees):
    from omegaconf import OmegaConf

    flat = {run: flatten(_compose(rlinf_trees["config"], run)) for run in RUNS}
    assert_runs_differ_only_in_reward(flat)
    for run in RUNS:
        assert flat[run]["cluster.component_placement.actor,env,rollout"] == "0-3"
    os.environ["EMBODIED_PATH"] = str(rlinf_trees["config"].parent)
    resolved = OmegaConf.create(_compose(rlinf_trees["config"], "runB_qwen"))
    assert resolved.env.train.group_size == resolved.algorithm.group_size == 8


def test_dense_ppo_config_is_run_b_with_ppo_and_a_curve(rlinf_trees):
    b, d = (flatten(_compose(rlinf_trees["config"], run)) for run in ("runB_qwen", RUN_D))
    differing = {k for k in b.keys() | d.keys() if b.get(k) != d.get(k)}
    assert differing == {
        "runner.logger.experiment_name",
        "algorithm.group_size",
        "algorithm.update_epoch",
        "algorithm.adv_type",
        "algorithm.loss_type",
        "algorithm.filter_rewards",
        "actor.model.add_value_head",
        "actor.optim.critic_warmup_steps",
        "env.train.reward_model.score_mode",
        "env.train.reward_model.progress_points",
        "env.train.reward_model.canary_fraction",
    }, differing
    assert (d["algorithm.adv_type"], d["algorithm.loss_type"], d["algorithm.group_size"]) == ("gae", "actor_critic", 1)
    assert d["env.train.reward_model.progress_points"] == 8 and d["env.train.reward_model.score_mode"] == "logprob"
    from omegaconf import OmegaConf

    os.environ["EMBODIED_PATH"] = str(rlinf_trees["config"].parent)
    env = OmegaConf.create(_compose(rlinf_trees["config"], RUN_D)).env.train
    assert env.use_rel_reward and not env.auto_reset and env.reward_coef == 5.0  # where a curve places rewards
    assert env.max_episode_steps == env.max_steps_per_rollout_epoch  # an episode per rollout epoch
