"""The `env.train.reward_model` block of an RLinf run config: what the VLM reward hook is told.

One schema for every env (LIBERO, ManiSkill) and both judging modes; the hook
(reward_client.rlinf.hook) and the ManiSkill adapter (reward_client.rlinf.env_adapters) read it,
RLinf's Hydra configs (configs/rlinf/) write it. Unknown keys are refused, so a typo in a run
config stops the run at start instead of silently doing nothing.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from reward_client.rlinf.canary import CANARY_KINDS, CanaryKind
from reward_client.rlinf.views import DEFAULT_VIEWS, check_views, several
from reward_protocol.score import ScoreMode


class RewardModelConfig(BaseModel):
    """`env.train.reward_model` in an RLinf run config."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    enable: bool = False
    async_: bool = Field(
        False,
        alias="async",
        description="judge off the rollout's critical path: submit at an episode's end, place the reward in "
        "RLinf's rollout buffer when it comes, wait only at the rollout epoch's end (needs "
        "rlinf_patches/env_worker.patch; without it no judged reward reaches the actor)",
    )
    async_batches: int = Field(4, ge=1, le=64, description="async: batch requests in flight at once")
    url: str | list[str] = Field(
        "http://127.0.0.1:18080", description="one server, or a list of replicas (round-robin, failover, split batches)"
    )
    backend: str | None = Field(None, description="checked by the server when given")
    nframes: int = Field(16, ge=1, le=256)
    max_pixels: int = 256 * 28 * 28
    to_grid: bool = Field(
        False,
        description="resize frames onto the model's 28-pixel grid in the env worker (256x256 -> 252x252, as the "
        "server would), so the server resizes nothing",
    )
    score_mode: ScoreMode | None = None
    transport: Literal["raw", "inline", "video_path"] = Field(
        "raw",
        description="raw: frames as bytes in one raw batch body (fastest); inline: base64 frames in JSON; "
        "video_path: an MP4 in video_dir (a filesystem the server also sees)",
    )
    video_dir: str | None = Field(None, description="for transport video_path; default: <tmp>/rlinf_vlm_episodes")
    keep_videos: bool = Field(False, description="also write each judged episode's frames as an MP4 in video_dir")
    binary_reward: bool = False
    success_threshold: float = Field(0.5, ge=0.0, le=1.0)
    score_on_truncation: bool = True
    fail_on_request_error: bool = True
    fallback: Literal["zero", "env_success"] = Field(
        "zero", description="reward value when no score can be had and fail_on_request_error is False"
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="one attempt's bound; default: the rest of deadline_s (a slow batch is never cut and resent; "
        "the server learns the bound and answers what is done by then)",
    )
    deadline_s: float = Field(900.0, gt=0, description="a batch's answer (retries included) never takes longer")
    wait_ready_s: float = Field(600.0, ge=0)
    api_key: str | None = None
    task_text: str | None = Field(
        None, description="instruction for envs whose task has none of its own (ManiSkill's PickCube, ...)"
    )
    audit: bool = Field(True, description="log env/vlm_audit/*: the judge against the env's own success flag")
    canary_fraction: float = Field(0.0, ge=0.0, le=1.0, description="share of episodes also sent as canary probes")
    canary_kinds: list[CanaryKind] = Field(default_factory=lambda: list(CANARY_KINDS))
    canary_tasks: list[str] = Field(default_factory=list, description="wrong_task instructions besides the envs' tasks")
    progress_points: int = Field(
        1,
        ge=1,
        le=256,
        description="K > 1: ask for a progress curve of K points (at most the frames sent); under use_rel_reward "
        "each point's gain is placed at the step where its prefix ends (needs rlinf_patches/env_worker.patch)",
    )
    views: list[str] = Field(
        default_factory=lambda: list(DEFAULT_VIEWS),
        description="the cameras the judge sees, one clip each in one prompt: main_images, wrist_images, "
        "extra_view_images (each of its cameras) or extra_view_images[i] (reward_client.rlinf.views)",
    )

    @field_validator("views")
    @classmethod
    def _known_views(cls, views: list[str]) -> list[str]:
        return check_views(views)

    @model_validator(mode="after")
    def _views_fit(self) -> RewardModelConfig:
        if not several(self.views):
            return self
        if self.transport == "video_path":
            raise ValueError(
                f"views {self.views}: transport video_path carries one video per episode; use transport raw or inline"
            )
        if self.progress_points > 1:
            raise ValueError(
                f"views {self.views} with progress_points {self.progress_points}: a curve is drawn over one view; "
                "set progress_points: 1, or one view"
            )
        return self

    @classmethod
    def from_rlinf(cls, node: Any) -> RewardModelConfig:
        """From the `reward_model` node of RLinf's env config (OmegaConf, or a plain mapping)."""
        try:
            from omegaconf import OmegaConf

            raw = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
        except ImportError:
            raw = dict(node)
        return cls.model_validate(raw)


__all__ = ["RewardModelConfig"]
