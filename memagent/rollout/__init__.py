"""Rollout: sampling, the KV-cache generation engine, agents and the MemAgent workflow."""

from memagent.rollout.generate import GenerateOutput, generate
from memagent.rollout.records import ChatRequest, Completion, Conversation, Trajectory
from memagent.rollout.sampling import SamplingParams

__all__ = ["ChatRequest", "Completion", "Conversation", "GenerateOutput", "SamplingParams", "Trajectory", "generate"]
