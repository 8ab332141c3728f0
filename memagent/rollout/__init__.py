"""Rollout: sampling, the KV-cache generation engine, agents and the MemAgent workflow."""

from memagent.rollout.records import ChatRequest, Completion, Conversation, Trajectory

__all__ = ["ChatRequest", "Completion", "Conversation", "Trajectory"]
