"""RLinf main beside RLinf v0.3: the patch set each version gets, and the run configs of both.

RLinf main is the snapshot of its main branch beside this repository (shared/rlinf_main/, unpacked
fresh per test session: scripts/setup_rlinf_main.sh finds it the same way; RLINF_MAIN_TARBALL
names another); RLinf v0.3 is the rlinf==0.3.0 wheel with v0.3's config groups
(tests/helpers/rlinf.py). Fast: Hydra composes the configs, no simulator runs.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.helpers.rlinf import (
    APPLY,
    RUNS,
    SHARED_CONFIGS,
    STAND_IN_ENTRY_POINT,
    assert_runs_differ_only_in_reward,
    flatten,
    unpack,
)

REPO = Path(__file__).resolve().parents[2]
MAIN_CONFIGS = REPO / "configs" / "rlinf" / "main"
V03_CONFIGS = REPO / "configs" / "rlinf"


def main_tarball() -> Path:
    """The RLinf main snapshot, found as scripts/setup_rlinf_main.sh finds it."""
    named = os.environ.get("RLINF_MAIN_TARBALL")
    found = [Path(named)] if named else sorted((REPO.parent / "shared" / "rlinf_main").glob("rlinf-main-*.tar.xz"))
    if not found or not found[-1].is_file():
        pytest.fail(
            "no RLinf main snapshot: expected ../shared/rlinf_main/rlinf-main-<commit>.tar.xz beside this "
            "repository (or set RLINF_MAIN_TARBALL)"
        )
    return found[-1]


def unpack_main(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(main_tarball()) as tar:
        tar.extractall(dest, filter="data")
    return dest


def _apply(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(APPLY), *args], capture_output=True, text=True)


def _tree(version: str, dest: Path) -> Path:
    if version == "main":
        return unpack_main(dest)
    tree = unpack(dest)
    shutil.copytree(SHARED_CONFIGS, tree / "examples" / "embodiment" / "config")
    return tree


def _snapshot(tree: Path) -> dict[str, bytes]:
    return {str(p.relative_to(tree)): p.read_bytes() for p in sorted(tree.rglob("*")) if p.is_file()}


# --- the patch sets ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["main", "v0.3"])
def test_patch_set_is_chosen_from_the_code_and_applies_reapplies_checks_reverts(version, tmp_path):
    tree = _tree(version, tmp_path / "rlinf")
    pristine = _snapshot(tree)
    assert _apply(str(tree), "--which").stdout.strip() == version
    assert _apply(str(tree), "--check").returncode == 1

    first = _apply(str(tree))
    assert first.returncode == 0, first.stderr
    assert f"rlinf: {version}" in first.stdout
    patches = sorted((REPO / "rlinf_patches" / version).glob("*.patch"))
    assert first.stdout.count("patch: applied to") == len(patches) == 3
    patched = _snapshot(tree)
    for name in ("libero/libero_env.py", "maniskill/maniskill_env.py", "../workers/env/env_worker.py"):
        name = os.path.normpath(f"rlinf/envs/{name}")
        assert patched[name] != pristine[name], name
        compile((tree / name).read_text(), name, "exec")  # still Python (no __pycache__ written)
    configs = sorted((MAIN_CONFIGS if version == "main" else V03_CONFIGS).glob("*.yaml"))
    for config in configs:
        assert (tree / "examples" / "embodiment" / "config" / config.name).read_bytes() == config.read_bytes()
    # the detection still sees the same version in the patched tree
    assert _apply(str(tree), "--which").stdout.strip() == version

    second = _apply(str(tree))
    assert second.returncode == 0 and second.stdout.count("patch: already applied") == 3
    assert _snapshot(tree) == patched  # a second apply changes nothing
    assert _apply(str(tree), "--check").returncode == 0

    revert = _apply(str(tree), "--revert")
    assert revert.returncode == 0, revert.stderr
    assert _snapshot(tree) == pristine  # patches out, run configs removed
    assert _apply(str(tree), "--check").returncode == 1


def test_a_checkout_that_is_neither_version_is_named_and_left_alone(tmp_path):
    (tmp_path / "rlinf" / "workers" / "env").mkdir(parents=True)
    worker = tmp_path / "rlinf" / "workers" / "env" / "env_worker.py"
    worker.write_text("class EnvWorker:\n    pass\n")
    for args in ([str(tmp_path)], [str(tmp_path), "--check"], [str(tmp_path), "--revert"], [str(tmp_path / "rlinf")]):
        result = _apply(*args)
        assert result.returncode == 1
        assert "is not RLinf v0.3 nor RLinf main a3816b5-compatible" in result.stderr, result.stderr
        assert "trajectory_builders" in result.stderr and "rollout_results" in result.stderr  # what was looked for
    assert worker.read_text() == "class EnvWorker:\n    pass\n"
    assert not (tmp_path / "examples").exists()


def test_a_main_checkout_edited_where_a_patch_goes_is_refused_whole(tmp_path):
    tree = unpack_main(tmp_path / "rlinf")
    maniskill = tree / "rlinf" / "envs" / "maniskill" / "maniskill_env.py"
    maniskill.write_text(maniskill.read_text().replace("actions = actions.to(self.device)", "actions = actions"))
    before = _snapshot(tree)
    result = _apply(str(tree))
    assert result.returncode == 1 and "main/maniskill_env.patch does not apply" in result.stderr
    assert _snapshot(tree) == before  # all patches apply, or none is applied


def _function(tree: ast.Module, cls: str, name: str) -> ast.AST | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                    return item
    return None


def test_main_patch_places_judged_rewards_for_both_runners(tmp_path):
    """The env worker patch hooks `_run_interact_once` right after each chunk step; AsyncEnvWorker
    (AsyncEmbodiedRunner's, train_async.py) runs that same method, so both runners place rewards."""
    tree = unpack_main(tmp_path / "rlinf")
    assert _apply(str(tree)).returncode == 0
    worker = ast.parse((tree / "rlinf" / "workers" / "env" / "env_worker.py").read_text())
    interact = _function(worker, "EnvWorker", "_run_interact_once")
    assert interact is not None
    # the statement lists (blocks) of the method, each in order: find the chunk step's block
    blocks = [node.body for node in ast.walk(interact) if isinstance(getattr(node, "body", None), list)]
    found = [
        (block, i)
        for block in blocks
        for i, stmt in enumerate(block)
        if isinstance(stmt, ast.Assign) and "self.env_interact_step(" in ast.unparse(stmt)
    ]
    assert len(found) == 1
    block, i = found[0]
    assert len(block[i].targets[0].elts) == 3  # main: env_output, env_info, chunk_step_payload
    assert ast.unparse(block[i + 1]) == "self.place_vlm_rewards(stage_id, env_output, chunk_step_idx, env_info)"
    place = ast.unparse(_function(worker, "EnvWorker", "place_vlm_rewards"))
    assert "self.trajectory_builders[stage_id].rewards" in place

    async_worker = ast.parse((tree / "rlinf" / "workers" / "env" / "async_env_worker.py").read_text())
    assert _function(async_worker, "AsyncEnvWorker", "_run_interact_once") is None  # not overridden ...
    assert _function(async_worker, "AsyncEnvWorker", "env_interact_step") is None
    assert "self._run_interact_once(" in ast.unparse(_function(async_worker, "AsyncEnvWorker", "_interact"))  # ... run
    train_async = (tree / "examples" / "embodiment" / "train_async.py").read_text()
    assert "AsyncEnvWorker.create_group" in train_async and "AsyncEmbodiedRunner" in train_async


# --- the run configs ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def main_tree(tmp_path_factory) -> Path:
    tree = unpack_main(tmp_path_factory.mktemp("rlinf_main"))
    assert _apply(str(tree)).returncode == 0
    return tree


@pytest.fixture(scope="module")
def v03_tree(tmp_path_factory) -> Path:
    tree = _tree("v0.3", tmp_path_factory.mktemp("rlinf_v03"))
    assert _apply(str(tree)).returncode == 0
    return tree


def compose(tree: Path, name: str, overrides: tuple[str, ...] = ()) -> dict:
    """Hydra composes `name` from the tree's examples/embodiment/config, as RLinf's launcher does."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    config_dir = tree / "examples" / "embodiment" / "config"
    os.environ["EMBODIED_PATH"] = str(config_dir.parent)
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.1"):
        cfg = hydra_compose(config_name=name, overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=False)


# The run configs of each family: their base in RLinf main, and what every run changes in it.
REWARD_MODEL = "env.train.reward_model."
FAMILIES = {
    "libero_10_grpo_openvlaoft": ("libero_10_grpo_openvlaoft", set()),
    "maniskill_ppo_mlp": ("maniskill_ppo_mlp", None),  # checked against v0.3's copy below
    "libero_spatial_grpo_starvla": ("libero_spatial_grpo_starvla", set()),
    "libero_10_grpo_starvla": (
        "libero_spatial_grpo_starvla",
        {"env.train.task_suite_name", "env.eval.task_suite_name"},
    ),
}


def _gpus(placement: str) -> int:
    if placement == "all":
        return 8  # RLinf's reference node, the one the run configs are written for
    first, _, last = str(placement).partition("-")
    return int(last or first) - int(first) + 1


def _settings(path: Path) -> list[str]:
    """A config's lines without its comments (the headers name the RLinf version)."""
    return [line.split(" #")[0].rstrip() for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]


def test_every_run_config_has_a_main_and_a_v03_twin():
    main = {p.name for p in MAIN_CONFIGS.glob("*_run*.yaml")}
    v03 = {p.name for p in V03_CONFIGS.glob("*.yaml")}
    assert v03 < main
    assert main - v03 == {f"libero_{suite}_grpo_starvla_{run}.yaml" for suite in ("spatial", "10") for run in RUNS}
    for name in sorted(v03):  # the same settings, but RLinf main's name of the FSDP group
        renamed = [s.replace("training_backend/", "hybrid_engines/") for s in _settings(V03_CONFIGS / name)]
        assert _settings(MAIN_CONFIGS / name) == renamed, name
        assert "training_backend/fsdp@actor.fsdp_config" in (V03_CONFIGS / name).read_text()

    # StarVLA's runs judge with the same reward_model settings as OpenVLA-OFT's
    def reward_block(path: Path) -> list[str]:
        lines = _settings(path)
        start = lines.index("    reward_model:")
        return lines[start : lines.index("  eval:", start)]

    openvla = reward_block(MAIN_CONFIGS / "libero_10_grpo_openvlaoft_runB_qwen.yaml")
    for suite in ("spatial", "10"):
        assert reward_block(MAIN_CONFIGS / f"libero_{suite}_grpo_starvla_runB_qwen.yaml") == openvla


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_main_run_configs_compose_on_main_and_differ_only_in_reward(main_tree, family):
    flat = {run: flatten(compose(main_tree, f"{family}_{run}")) for run in RUNS}
    assert_runs_differ_only_in_reward(flat)
    for run in RUNS:
        assert flat[run]["runner.logger.experiment_name"] == f"{family}_{run}"

    base_name, extra = FAMILIES[family]
    if extra is None:
        return
    base = flatten(compose(main_tree, base_name))
    b = flat["runB_qwen"]
    differing = {k for k in base.keys() | b.keys() if base.get(k) != b.get(k) and not k.startswith(REWARD_MODEL)}
    placement = {k for k in differing if k.startswith("cluster.component_placement")}
    expected = {"runner.logger.experiment_name"} | placement | extra
    if family == "libero_10_grpo_openvlaoft":  # v0.3's run changes, kept on main (the configs' headers)
        expected |= {"env.train.group_size", "algorithm.rewards_lower_bound", "algorithm.rewards_upper_bound"}
    if family == "libero_10_grpo_starvla":  # LIBERO-10's episode length and env group values
        expected |= {
            k
            for k in differing
            if k.split(".")[-1]
            in (
                "max_episode_steps",
                "max_steps_per_rollout_epoch",
                "reward_coef",
                "use_step_penalty",
                "specific_reset_id",
            )
        }
    assert differing <= expected, differing - expected
    if family.endswith("starvla"):  # StarVLA's own shape is kept: QwenOFT, groups of 10, 8-action chunks
        assert b["actor.model.model_type"] == "starvla" and b["actor.model.starvla.framework_name"] == "QwenOFT"
        assert b["algorithm.group_size"] == 10 and b["actor.model.num_action_chunks"] == 8
        assert b["algorithm.reward_type"] == "chunk_level"
    if family == "libero_10_grpo_starvla":
        assert b["env.train.task_suite_name"] == "libero_10" and b["env.train.max_episode_steps"] == 512


def test_the_dense_ppo_config_composes_on_main_as_on_v03(main_tree, v03_tree):
    name = "libero_10_ppo_openvlaoft_runD_dense"
    main, v03 = (flatten(compose(tree, name)) for tree in (main_tree, v03_tree))
    assert main["algorithm.adv_type"] == "gae" and main["env.train.reward_model.progress_points"] == 8
    assert {k for k in main.keys() | v03.keys() if main.get(k) != v03.get(k)} <= _group_drift(main_tree, v03_tree)


def _group_drift(main_tree: Path, v03_tree: Path) -> set[str]:
    """Keys where RLinf main's own libero_10_grpo_openvlaoft differs from v0.3's (its config groups
    moved on); the project's runs may differ between versions there and nowhere else."""
    main, v03 = (flatten(compose(tree, "libero_10_grpo_openvlaoft")) for tree in (main_tree, v03_tree))
    return {k for k in main.keys() | v03.keys() if main.get(k) != v03.get(k)}


@pytest.mark.parametrize("version", ["main", "v0.3"])
def test_run_configs_fit_rlinfs_process_arithmetic(version, main_tree, v03_tree):
    """RLinf (validate_cfg, the FSDP actor) stops at startup unless the env and batch sizes divide
    by the processes of the placement, one per GPU: each run config's own sizes are checked here
    the way RLinf checks them, which no CPU run can (the tiny runs place everything on one process)."""
    tree = main_tree if version == "main" else v03_tree
    names = sorted(p.stem for p in (MAIN_CONFIGS if version == "main" else V03_CONFIGS).glob("*.yaml"))
    from omegaconf import OmegaConf

    for name in names:
        cfg = OmegaConf.create(compose(tree, name))
        # the GPUs the env workers (and, placed with them, the actor) run on: one process each
        (placement,) = [v for k, v in cfg.cluster.component_placement.items() if "env" in k.split(",")]
        gpus = _gpus(placement)
        train = cfg.env.train
        per_process = train.total_num_envs // gpus
        assert train.total_num_envs % gpus == 0 and per_process % train.group_size == 0, (name, placement)
        assert train.max_steps_per_rollout_epoch % cfg.actor.model.num_action_chunks == 0, name
        assert cfg.actor.global_batch_size % (cfg.actor.micro_batch_size * gpus) == 0, (name, placement)
        if cfg.runner.val_check_interval > 0:
            assert cfg.env.eval.total_num_envs % gpus == 0, (name, placement)
        if "reward_model" in train and train.reward_model.enable:
            assert train.reward_model.url.startswith("http://")


# --- scripts/run_experiments.sh on either version ------------------------------------------------


@pytest.mark.parametrize(
    ("env_args", "config"),
    [
        (("--env", "starvla"), "libero_spatial_grpo_starvla_runA"),
        (("--env", "starvla", "--suite", "libero_10"), "libero_10_grpo_starvla_runA"),
    ],
)
def test_run_experiments_starts_main_s_run_configs(env_args, config, tmp_path):
    tree = unpack_main(tmp_path / "rlinf")
    assert _apply(str(tree)).returncode == 0
    (tree / "examples" / "embodiment" / "train_embodied_agent.py").write_text(STAND_IN_ENTRY_POINT)
    out = tmp_path / "exp"
    cmd = ["bash", str(REPO / "scripts" / "run_experiments.sh"), str(tree), *env_args, "--runs", "A", "--out", str(out)]
    env = {**os.environ, "RLINF_PYTHON": "python", "RUN_TIMEOUT_S": "60"}
    result = subprocess.run([*cmd, "--", "runner.max_epochs=1"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    log_path = Path((out / "runA" / "log_path").read_text().strip())
    started = json.loads((log_path / "started.json").read_text())
    assert started["args"][2:4] == ["--config-name", config]
    assert started["env"]["EMBODIED_PATH"] == str(tree / "examples" / "embodiment")


def test_run_experiments_refuses_starvla_on_v03(tmp_path):
    tree = _tree("v0.3", tmp_path / "rlinf")
    assert _apply(str(tree)).returncode == 0
    shutil.copy(SHARED_CONFIGS.parent / "run_embodiment.sh", tree / "examples" / "embodiment")
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "run_experiments.sh"), str(tree), "--env", "starvla", "--runs", "A"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "StarVLA runs need RLinf main" in result.stderr, result.stderr
